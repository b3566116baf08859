"""The training stream of a split held in memory: decoded arrays, batches by permutation.

With ``--cache``, an input pipeline whose share of the train split fits the
memory bound (`fits_in_memory`: a share of the host's memory, or of a lower
cgroup limit, `available_memory`) decodes that share once into uint8 arrays
(`trainer.data.input_pipeline.decode_share`) and draws every batch from them
with ``tf.gather``: no records are read, shuffled or parsed after the start.

The stream is the share's epochs one after the other; epoch ``e`` is a full
permutation of the share's ``n`` rows (`epoch_order`: TensorFlow's stateless
shuffle, keyed by the seed, the pipeline and ``e``), which mixes the whole
share where a shuffle buffer only mixes neighbours. Batches of the
per-replica size are cut from the stream regardless of where an epoch ends
(as the streaming path's shuffle, repeat, batch does), so each epoch holds
every example exactly once and none is dropped. Batch ``b`` starts at
stream position ``b * size``: example ``b * size mod n`` of epoch
``b * size // n``. A run resumed at batch ``b`` computes that epoch's
permutation and starts inside it: no record is read, and nothing is skipped.

The module knows nothing of files or records: it gives the rows of each
batch (`row_batches`) and gathers them from the decoded arrays (`gather`).
"""

from __future__ import annotations

import os
from typing import Mapping, Optional

import numpy as np

import tensorflow as tf

import mnist_contract as contract

# The share of a host's physical memory that one input pipeline's decoded
# train examples may take; a larger share is streamed from the files.
MEMORY_FRACTION = 0.25
# A decoded example: its uint8 pixels, its int64 label and int64 index.
BYTES_PER_EXAMPLE = int(np.prod(contract.IMAGE_SHAPE)) + 8 + 8
_ENDLESS = np.iinfo(np.int64).max


# Where this process's cgroups are listed, and where the cgroup file systems are.
PROC_CGROUP = "/proc/self/cgroup"
CGROUP_ROOT = "/sys/fs/cgroup"
# cgroup v1 writes "no limit" as a number near 2**63.
_NO_LIMIT = 1 << 60


def host_memory_bytes() -> int:
    """This host's physical memory."""
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def available_memory() -> tuple[int, str]:
    """The memory the bound is a share of, and what it is: this host's
    physical memory, or the lower memory limit of this process's cgroup (a
    container's, a Kubernetes pod's), past which the process is killed."""
    host, limit = host_memory_bytes(), cgroup_memory_limit()
    if limit is not None and limit < host:
        return limit, "this process's cgroup memory limit"
    return host, "this host's memory"


def cgroup_memory_limit() -> Optional[int]:
    """The lowest memory limit on this process's cgroup or an ancestor
    (cgroup v2 ``memory.max``, v1 ``memory.limit_in_bytes``); None where none
    is set or none can be read (no cgroup file system, not Linux)."""
    try:
        with open(PROC_CGROUP) as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    limits = []
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if not controllers:  # v2; on a hybrid host mounted at unified/
            places = [(CGROUP_ROOT, "memory.max"),
                      (os.path.join(CGROUP_ROOT, "unified"), "memory.max")]
        elif "memory" in controllers.split(","):
            places = [(os.path.join(CGROUP_ROOT, "memory"), "memory.limit_in_bytes")]
        else:
            continue
        parts = [part for part in path.split("/") if part]
        for base, name in places:  # the cgroup, its ancestors, the mount's own root
            for depth in range(len(parts), -1, -1):
                limits.append(_read_limit(os.path.join(base, *parts[:depth], name)))
    return min((limit for limit in limits if limit is not None), default=None)


def _read_limit(path: str) -> Optional[int]:
    """A cgroup memory limit file's bytes; None if absent, unreadable or no limit."""
    try:
        with open(path) as f:
            text = f.read().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() and int(text) < _NO_LIMIT else None


def memory_bound(host_bytes: int) -> int:
    """The most bytes one pipeline's decoded examples may take on a host of ``host_bytes``."""
    return int(host_bytes * MEMORY_FRACTION)


def decoded_bytes(num_examples: int) -> int:
    """What ``num_examples`` take decoded (`BYTES_PER_EXAMPLE` each)."""
    return num_examples * BYTES_PER_EXAMPLE


def fits_in_memory(num_examples: int, bound: int) -> bool:
    """Whether a share of ``num_examples`` is held decoded under ``bound`` bytes."""
    return decoded_bytes(num_examples) <= bound


def epoch_order(n: int, key: tf.Tensor, epoch: tf.Tensor) -> tf.Tensor:
    """Epoch ``epoch``'s permutation of the rows ``0..n-1`` (int64), keyed by
    ``key`` = (seed, pipeline): the same for the same three, in any run."""
    seed = tf.random.experimental.stateless_fold_in(
        tf.cast(key, tf.int64), tf.cast(epoch, tf.int64))
    return tf.random.experimental.stateless_shuffle(tf.range(n, dtype=tf.int64), seed=seed)


def row_batches(n: int, size: int, first_batch: int, key) -> tf.data.Dataset:
    """The stream's rows in batches of ``size`` (static shape), from batch
    ``first_batch`` on: epoch by epoch, the first one entered at its offset."""
    key = tf.constant(key, tf.int64)
    first_epoch, offset = divmod(first_batch * size, n)

    def order(epoch):
        start = tf.where(epoch == first_epoch, tf.constant(offset, tf.int64), 0)
        return epoch_order(n, key, epoch)[start:]
    return (tf.data.Dataset.range(first_epoch, _ENDLESS).map(order)
            .rebatch(size, drop_remainder=True))


def gather(arrays: Mapping[str, tf.Tensor], rows: tf.Tensor) -> dict[str, tf.Tensor]:
    """The ``rows`` of every array: one batch."""
    return {name: tf.gather(values, rows) for name, values in arrays.items()}
