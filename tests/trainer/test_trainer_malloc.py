"""Buffers of a multi-device run reuse heap memory (`trainer.malloc.restore_malloc_thresholds`).

Checked in a fresh interpreter (malloc's thresholds belong to the process)
by where glibc puts a 16 MiB buffer: mapped afresh (its own mmap, unmapped
again when freed: every page faulted in at every use) or taken from the
heap. That is read from the buffer's chunk header, not from page-fault
counts or times, so the answer does not depend on the machine's load; what
the reuse saves is measured by `benchmarks/replica_malloc_benchmark.py`.
"""

from __future__ import annotations

import platform
import sys
import textwrap

import pytest

from tests.helpers import run_results_script

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux") or platform.libc_ver()[0] != "glibc",
    reason="glibc's malloc")

BUFFER_BYTES = 16 << 20

# Whether each of two 16 MiB buffers, allocated and freed in turn, was mapped
# afresh: glibc keeps a chunk's size in the word before the address malloc
# returns, with bit 0x2 (IS_MMAPPED) set for a chunk of its own mapping
# (malloc/malloc.c). Two in turn, because glibc's adaptive threshold rises
# past a mapped chunk once it is freed: where nothing fixed the threshold
# (a `mallopt` call), the second buffer comes from the heap whatever the
# first did.
MAPPED = textwrap.dedent(f"""
    import ctypes
    libc = ctypes.CDLL(None)
    libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, (ctypes.c_size_t,)
    libc.free.argtypes = (ctypes.c_void_p,)
    IS_MMAPPED = 0x2

    def mapped():
        found = []
        for _ in range(2):
            address = libc.malloc({BUFFER_BYTES})
            size = ctypes.c_size_t.from_address(address - ctypes.sizeof(ctypes.c_size_t))
            found.append(bool(size.value & IS_MMAPPED))
            libc.free(address)
        return found
""")

RESTORE = textwrap.dedent("""
    import json
    import trainer
    import tensorflow as tf
    from trainer import malloc, strategy as strategy_lib
""") + MAPPED + textwrap.dedent("""
    untouched = mapped()
    strategy = strategy_lib.mirrored(strategy_lib.split_cpu(2))
    data = strategy.distribute_datasets_from_function(
        lambda ctx: tf.data.Dataset.range(8).batch(2))
    next(iter(data))  # its per-device iterator's GeneratorDataset kernel
    distributed = mapped()
    restored = malloc.restore_malloc_thresholds()
    after = mapped()
    print("RESULTS", json.dumps(dict(tf_version=tf.__version__, untouched=untouched,
                                     distributed=distributed, restored=restored,
                                     after=after)))
""")


@pytest.fixture(scope="module")
def mapped(tmp_path_factory) -> dict:
    return run_results_script(RESTORE, tmp_path_factory.mktemp("malloc"), timeout=300)[0]


def test_buffers_come_from_the_heap_after_the_restore(mapped):
    assert mapped["restored"] is True
    assert mapped["after"] == [False, False], mapped


def test_the_distributed_iterator_maps_every_buffer_under_tf_2_21(mapped):
    """Under TensorFlow 2.21 the iterator's kernel fixes the threshold at
    128 KiB, so every such buffer is mapped afresh, the second too (the
    restore ends that). Where TensorFlow leaves malloc alone (tensorflow-tpu
    2.20) the threshold adapts as in a process without TensorFlow."""
    assert mapped["untouched"][1] is False, mapped  # glibc's own adaptation
    if mapped["tf_version"].startswith("2.21"):
        assert mapped["distributed"] == [True, True], mapped
    else:
        assert mapped["distributed"][1] is False, mapped


AFTER_TRAINING = textwrap.dedent("""
    import json, sys
    from tests import trainer_data
    from tests.trainer import trainer_runs
""") + MAPPED + textwrap.dedent("""
    data, model_dir = sys.argv[1] + "/data", sys.argv[1] + "/run"
    trainer_data.write_dataset(data, num_train=64, num_test=16)
    status = trainer_runs.run(data, model_dir, "--cpu_replicas=2", "--epochs=1")
    print("RESULTS", json.dumps(dict(status=status, mapped=mapped())))
""")


def test_a_two_replica_training_restores_the_thresholds(tmp_path):
    """The trainer command itself restores them: after its run on two
    replicas (a MultiDeviceIterator's kernel built) a buffer comes from the
    heap."""
    result, stdout = run_results_script(AFTER_TRAINING, tmp_path, timeout=300)
    assert result["status"] == 0, stdout[-3000:]
    assert result["mapped"] == [False, False], result
