"""glibc's malloc thresholds, which TensorFlow's first ``GeneratorDataset``
kernel fixes for the whole process: `restore_malloc_thresholds` sets them
back (through glibc's ``mallopt``).

There is no public TensorFlow setting for it; the call is checked against
TensorFlow 2.21.0 (the project's pin) and, on a Cloud TPU VM,
tensorflow-tpu 2.20.0. A TensorFlow upgrade should re-check it.
"""

from __future__ import annotations

import ctypes

import tensorflow as tf

# glibc's mallopt parameters (<malloc.h>), and the values glibc's own
# adaptive thresholds stop at on 64-bit: DEFAULT_MMAP_THRESHOLD_MAX, and
# twice that for the trim threshold, which it raises with the mmap one.
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
MMAP_THRESHOLD_BYTES = 32 << 20
TRIM_THRESHOLD_BYTES = 2 * MMAP_THRESHOLD_BYTES


def restore_malloc_thresholds() -> bool:
    """Lets buffers under 32 MiB reuse heap memory again; False where
    there is no glibc ``mallopt`` to call (nothing done).

    Why: in TensorFlow 2.21.0 the first ``GeneratorDataset`` kernel of a
    process (``GeneratorDatasetOp``'s constructor, once per process:
    ``tensorflow::data::ApplyPython311MemoryPatch``) calls ``mallopt(
    M_MMAP_THRESHOLD, 128 KiB)``, which also turns off glibc's adaptive
    thresholds. A distributed dataset over two or more devices builds one
    (its ``MultiDeviceIterator``), so under MirroredStrategy every buffer of
    128 KiB or more (activations, gradients, batches) is mapped, faulted in
    and unmapped again at every step. tensorflow-tpu 2.20.0 has no such
    call, and there this sets what glibc's thresholds adapt to anyway.

    How: a one-element ``from_generator`` dataset spends TensorFlow's call
    first, so no later kernel repeats it; then the mmap and trim thresholds
    are set to the ceilings glibc's adaptive ones reach. Call it once the
    strategy has set up its devices (it runs a TensorFlow op on this
    process's default device).
    """
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError, TypeError):  # TypeError: Windows' CDLL(None)
        return False
    spend = tf.data.Dataset.from_generator(
        lambda: iter((0,)), output_signature=tf.TensorSpec((), tf.int32))
    for _ in spend:
        pass
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    return (mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES) == 1
            and mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES) == 1)
