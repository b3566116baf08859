"""TensorFlow's C++ start-up lines, hidden for the trainer's commands.

TF 2.21 logs its oneDNN and CUDA-stub notes on import, before absl's logging
is set up, so ``TF_CPP_MIN_LOG_LEVEL`` does not hold them back, and a CUDA
build reports a failed ``cuInit`` as an error on a machine without a GPU.
So file descriptor 2 points at /dev/null while TensorFlow loads and finds
its devices, whatever ``TF_CPP_MIN_LOG_LEVEL`` says: the user's level
decides what TensorFlow logs after that (default here: 2, errors only).
Python exceptions are unaffected (they print after fd 2 is restored).
"""

from __future__ import annotations

import contextlib
import os
import sys
from typing import Iterator


def default_log_level() -> None:
    """TF's C++ logs errors only, unless the user chose a level; before TF loads."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


@contextlib.contextmanager
def muted_stderr() -> Iterator[None]:
    """Inside the block, file descriptor 2 (C++ and Python writes) goes to /dev/null."""
    sys.stderr.flush()
    saved, devnull = os.dup(2), os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 2)
    try:
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)


def import_tensorflow() -> None:
    """Imports TensorFlow and finds its devices with fd 2 muted (once per process)."""
    default_log_level()
    if "tensorflow" in sys.modules:
        return
    with muted_stderr():
        import tensorflow as tf
        tf.config.list_physical_devices()
