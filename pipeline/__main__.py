"""``python -m pipeline --output=... [--source=...] [Beam options]``.

The command line is parsed once (`pipeline.options.parse`): the job's own
flags are checked before Beam or TensorFlow is imported, so ``--help`` and
bad values answer at once; the job then runs with the parsed options. A
failure is one line ``error: ...`` and the exit status of the table in
docs/README.md, "Exit status" (`mnist_common.console`, each `PipelineError`'s
``exit_status``); a Python without Beam or TensorFlow gets one line naming
the package, exit 1.
"""

import logging
import re
import sys

from mnist_common import console
from mnist_common.stop import Stopped
from pipeline import options, stop
from pipeline.errors import (Interrupted, PipelineError, PipelineInputError,
                             failure_summary)


class _DropInputErrorTracebacks(logging.Filter):
    """Beam logs a worker's exception with its traceback before re-raising it.

    For a PipelineInputError, or a signal, the user gets the one-line message
    instead: once the job is stopping, what Beam and its workers log about
    the workers it stopped is dropped (the job's own warnings still pass).
    """

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if stop.requested.is_set() and (exc or record.name != "root"):
            return False
        if record.levelno >= logging.ERROR:  # a storage failure: one error line too
            if failure_summary(exc or RuntimeError(record.getMessage())):
                return False
        return not (isinstance(exc, PipelineInputError)
                    or "PipelineInputError" in record.getMessage())


def _configure_logging() -> None:
    console.configure_logging(logging.INFO)
    for handler in logging.getLogger().handlers:
        handler.addFilter(_DropInputErrorTracebacks())
    logging.getLogger("apache_beam").setLevel(logging.WARNING)
    logging.getLogger("tensorflow").setLevel(logging.WARNING)


def _print_error(error: Exception) -> int:
    """One line ``error: ...`` (without Beam's step name); the exit status,
    a bad flag's or the `PipelineError`'s own."""
    options.print_error(re.sub(r" \[while running '[^']*'\]$", "", str(error)))
    return error.exit_status if isinstance(error, PipelineError) else console.BAD_INPUT


def main(argv=None) -> int:
    """Runs the command line; SIGINT, SIGTERM and SIGHUP stop it with one line
    and exit status 128+N (`pipeline.stop`)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    _configure_logging()
    with stop.handling_signals():
        try:
            status = _main(argv)
        except ModuleNotFoundError as e:  # a Python without the job's packages
            print(console.missing_package(e, "pipeline"), file=sys.stderr)
            status = console.FAILURE
        if stop.requested.is_set():
            stop.exit_at_once(status)
    return status


def _main(argv: list[str]) -> int:
    try:
        run_options = options.parse(argv)
    except (options.FlagError, PipelineError) as e:
        return _print_error(e)
    except Stopped as e:  # while Beam loads: the job had not started
        return _print_error(Interrupted.by(e, "python -m pipeline", "nothing was written"))
    try:
        if run_options.source == "tfds":
            console.import_tensorflow_quietly()  # TFDS reads through TensorFlow
        else:
            console.set_tensorflow_log_level()  # records are encoded without TensorFlow
        from pipeline import job
        result = job.run(run_options)
    except Stopped as e:  # while loading the job: it had not started
        return _print_error(Interrupted.by(e, run_options.output, "nothing was written"))
    except PipelineError as e:
        return _print_error(e)
    if result.nothing_left:
        print(result.nothing_left)
        return 0
    for name, split in sorted(result.manifest.splits.items()):
        print(f"{name}: {split.num_examples} examples in {len(split.shards)} "
              f"shard(s) of ~{split.num_bytes // len(split.shards):,} bytes -> "
              f"{run_options.output}")
    return console.OK


if __name__ == "__main__":
    sys.exit(main())
