"""``python -m pipeline --output=... [--source=...] [Beam options]``.

The job's own flags are parsed and checked before Beam or TensorFlow is
imported, so ``--help`` and bad values answer at once.
"""

import logging
import re
import sys

from pipeline import console, credentials, flags
from pipeline.errors import PipelineError, PipelineInputError


class _DropInputErrorTracebacks(logging.Filter):
    """Beam logs a worker's exception with its traceback before re-raising it.

    For a PipelineInputError the user gets the one-line message instead.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if record.levelno >= logging.ERROR:  # a storage failure: one error line too
            from pipeline.storage import failure_summary
            if failure_summary(exc or RuntimeError(record.getMessage())):
                return False
        return not (isinstance(exc, PipelineInputError)
                    or "PipelineInputError" in record.getMessage())


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        job_args, beam_args = flags.parse(argv)
        flags.check_values(job_args)
        what = credentials.needs_google(
            [job_args.output, job_args.source, *flags.beam_locations(beam_args)],
            flags.beam_runner(beam_args))
        if what:
            credentials.check(what)
    except (flags.FlagError, PipelineInputError) as e:
        flags.print_error(str(e))
        return 2
    logging.basicConfig(level=logging.INFO,
                        format="%(asctime)s %(levelname)s %(message)s")
    for handler in logging.getLogger().handlers:
        handler.addFilter(_DropInputErrorTracebacks())
    logging.getLogger("apache_beam").setLevel(logging.WARNING)
    logging.getLogger("tensorflow").setLevel(logging.WARNING)
    if job_args.source == "tfds":
        console.import_tensorflow_quietly()  # TFDS reads through TensorFlow
    else:
        console.set_tensorflow_log_level()  # records are encoded without TensorFlow
    from pipeline import job
    try:
        manifest = job.run(argv)
    except PipelineError as e:
        message = re.sub(r" \[while running '[^']*'\]$", "", str(e))
        print(f"error: {message}", file=sys.stderr)
        return 2
    for name, split in sorted(manifest.splits.items()):
        print(f"{name}: {split.num_examples} examples in {len(split.shards)} "
              f"shard(s) of ~{split.num_bytes // len(split.shards):,} bytes -> "
              f"{flags.parse(argv)[0].output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
