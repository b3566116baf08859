"""TensorFlow's C++ log lines, hidden by default in the trainer's commands.

``python -m trainer`` and ``python -m trainer.predict`` print only their own
lines unless ``TF_CPP_MIN_LOG_LEVEL`` is set (asking for the logs): the
level defaults to 2 (errors only), which must happen before TensorFlow is
imported. Some lines ignore the level (TF 2.21 logs its oneDNN and
CUDA-stub notes before absl's logging is set up, and a CUDA build reports a
failed ``cuInit`` as an error on a machine without a GPU), so `muted_stderr`
points file descriptor 2 at /dev/null while TensorFlow loads and looks for
devices. Python exceptions are unaffected (they print after fd 2 is
restored), and TensorFlow's errors after start-up still show.

This module imports no TensorFlow.
"""

from __future__ import annotations

import contextlib
import os
import sys
from typing import Iterator

LOG_LEVEL = "TF_CPP_MIN_LOG_LEVEL"


def hide_tensorflow_logs() -> bool:
    """Sets the level to 2 unless the user set it; whether the logs are hidden."""
    asked = LOG_LEVEL in os.environ
    os.environ.setdefault(LOG_LEVEL, "2")
    return not asked


@contextlib.contextmanager
def muted_stderr() -> Iterator[None]:
    """File descriptor 2 at /dev/null for the ``with`` block."""
    sys.stderr.flush()
    saved, devnull = os.dup(2), os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 2)
    try:
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)


def start_local_tensorflow() -> None:
    """For a command that runs on this machine only (``trainer.predict``):
    imports TensorFlow and finds its devices with fd 2 muted, unless the
    user asked for the logs or TensorFlow is already loaded."""
    if not hide_tensorflow_logs() or "tensorflow" in sys.modules:
        return
    with muted_stderr():
        import tensorflow as tf
        tf.config.list_physical_devices()
