"""What the command-line entry points print: no TensorFlow start-up noise.

TensorFlow's C++ side logs a dozen lines on import and on first device use
(oneDNN and CPU-feature notices, "Could not find cuda drivers", "failed call
to cuInit: UNKNOWN ERROR (303)" on a machine without a GPU). Many are written
before its logging is initialised, so ``TF_CPP_MIN_LOG_LEVEL`` does not hold
them back. `import_tensorflow_quietly` imports TensorFlow and lists its
devices with stderr captured, then passes on every captured line that is not
one of those notices, so a real error is still seen.
"""

from __future__ import annotations

import os
import re
import sys
import tempfile

_NOISE = re.compile(
    rb"WARNING: All log messages before absl::InitializeLog\(\) is called are "
    rb"written to STDERR"
    rb"|[IW]\d{4} [\d:. ]+\d+ \S+\.cc:\d+\] "  # C++ info and warning lines
    rb"|E\d{4} [\d:. ]+\d+ cuda_\w+\.cc:\d+\] failed call to cuInit"
    rb"|To enable the following instructions: .* rebuild TensorFlow")


def set_tensorflow_log_level() -> None:
    """TF's C++ logs at warning level and above only, unless the user chose."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def is_startup_noise(line: bytes) -> bool:
    return bool(_NOISE.match(line))


def import_tensorflow_quietly() -> None:
    """Imports TensorFlow and initialises its devices, dropping start-up notices."""
    set_tensorflow_log_level()
    if "tensorflow" in sys.modules:
        return
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as captured:
        os.dup2(captured.fileno(), 2)
        try:
            import tensorflow as tf
            tf.config.list_physical_devices()
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            captured.seek(0)
            kept = b"".join(line for line in captured if not is_startup_noise(line))
            if kept:
                os.write(2, kept)
