"""What the command-line programs print at start-up, and how they exit.

TensorFlow's C++ side logs a dozen lines on import and on first device use
(oneDNN and CPU-feature notices, "Could not find cuda drivers", "failed call
to cuInit: UNKNOWN ERROR (303)" on a machine without a GPU). Many are written
before its logging is initialised, so ``TF_CPP_MIN_LOG_LEVEL`` does not hold
them back. `tensorflow_start` captures file descriptor 2 while TensorFlow
loads and finds its devices, then passes on every captured line that is not
one of those notices, so a real error is still seen. After that the level
(default here: 2, errors only) decides what TensorFlow logs.

The exit statuses are the same for every command (docs/README.md, "Exit
status"): `OK`, `FAILURE` at run time, `BAD_INPUT` for bad flags or bad
input (argparse's usage errors are 2 as well), `stopped_by` a signal (how a
program stops on one: `mnist_common.stop`). Every
program's log lines have one format, `LOG_FORMAT` (`configure_logging`).

Imports neither TensorFlow nor either program: the programs call it first.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import signal
import sys
import tempfile
from typing import BinaryIO, Iterator, Optional

OK = 0
FAILURE = 1
BAD_INPUT = 2
GAVE_UP = 75      # the TPU launcher's `run`: --max_recoveries reached (EX_TEMPFAIL: rerun)
TIMED_OUT = 124   # the TPU launcher's wait: --wait_timeout passed (as timeout(1))
LOST = 255        # the TPU launcher: the cloud or the VM did not answer (as ssh)


def stopped_by(signum: int) -> int:
    """128 + the signal number, as a shell reports a process the signal ended."""
    return 128 + int(signum)


INTERRUPTED = stopped_by(signal.SIGINT)  # 130
TERMINATED = stopped_by(signal.SIGTERM)  # 143

# A log line: time, level, logger, message ("2026-12-06 18:20:11,042 INFO
# trainer.train: ..."); the job's own lines come from the root logger.
LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def configure_logging(level: int) -> None:
    """Log lines of ``level`` and above to stderr in `LOG_FORMAT`, so that
    the job's, the trainer's and the tools' lines read alike. A program then
    sets its own loggers' levels."""
    logging.basicConfig(level=level, format=LOG_FORMAT)


_NOISE = re.compile(
    rb"WARNING: All log messages before absl::InitializeLog\(\) is called are "
    rb"written to STDERR"
    rb"|[IW]\d{4} [\d:. ]+\d+ \S+\.cc:\d+\] "  # C++ info and warning lines
    rb"|E\d{4} [\d:. ]+\d+ cuda_\w+\.cc:\d+\] failed call to cuInit"
    rb"|To enable the following instructions: .* rebuild TensorFlow")


def set_tensorflow_log_level() -> None:
    """TF's C++ logs errors only, unless the user chose a level; before TF loads."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def use_tf_keras() -> None:
    """``tf.keras`` as tf-keras (Keras 2), the trainer's Keras (why: the
    `trainer` package's docstring), unless the user chose: TensorFlow reads
    ``TF_USE_LEGACY_KERAS`` once, when it loads, so a program calls this
    before its first ``import tensorflow``."""
    os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")


def is_startup_noise(line: bytes) -> bool:
    return bool(_NOISE.match(line))


# While `tensorflow_start` captures fd 2: (a duplicate of the real stderr,
# the capture file). Set before fd 2 is redirected and cleared only once it
# is put back, so `end_capture` always finds the real stderr.
_capture: Optional[tuple[int, BinaryIO]] = None


@contextlib.contextmanager
def tensorflow_start() -> Iterator[None]:
    """Inside the block, fd 2 is captured; on leaving it, lines that are not
    start-up noise pass on to the real stderr, whether or not the block raised.

    The caller imports TensorFlow inside, and does there whatever first
    touches its devices (listing them, splitting the CPU). A process that
    ends inside the block without leaving it (``os._exit`` from a signal
    handler) calls `end_capture` first.
    """
    global _capture
    set_tensorflow_log_level()
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as captured:
        _capture = (saved, captured)
        os.dup2(captured.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            end_capture()


def end_capture() -> None:
    """Puts the real stderr back on fd 2 and passes on the lines captured so
    far that are not start-up noise; does nothing outside `tensorflow_start`.

    Safe in a signal handler that interrupted the block's own ending: until
    fd 2 is back, `_capture` still holds the real stderr's duplicate, open,
    and nothing was passed on yet.
    """
    global _capture
    if _capture is None:
        return
    saved, captured = _capture
    os.dup2(saved, 2)
    _capture = None
    os.close(saved)
    captured.seek(0)
    kept = b"".join(line for line in captured if not is_startup_noise(line))
    if kept:
        os.write(2, kept)


def import_tensorflow_quietly() -> None:
    """Imports TensorFlow and finds its devices, dropping start-up notices
    (once per process)."""
    set_tensorflow_log_level()
    if "tensorflow" in sys.modules:
        return
    with tensorflow_start():
        import tensorflow as tf
        tf.config.list_physical_devices()


# The names of the modules a command may miss, as their projects spell them.
_PACKAGE_NAMES = {"tensorflow": "TensorFlow", "tf_keras": "tf-keras", "numpy": "NumPy",
                  "apache_beam": "Apache Beam", "tensorflow_datasets": "TensorFlow Datasets",
                  "google": "google-cloud-storage", "mlxtend": "mlxtend"}


def missing_package(error: ModuleNotFoundError, extra: str) -> str:
    """The one line for a command started by a Python without its packages
    (``python3`` instead of the project's ``.venv``): which package is
    missing, for which interpreter, and the two ways to get it."""
    match = re.search(r"No module named '([^']+)'", str(error))
    module = (error.name or (match.group(1) if match else "?")).split(".")[0]
    name = _PACKAGE_NAMES.get(module, f"the module {module!r}")
    return (f"error: {name} is not installed for {sys.executable}; use .venv/bin/python "
            f"(bash scripts/bootstrap.sh makes it) or pip install '.[{extra}]'")
