"""Buffers of a multi-device run reuse heap memory (`trainer._compat.restore_malloc_thresholds`).

Measured in a fresh interpreter (malloc's thresholds belong to the process):
a 16 MiB buffer allocated, written and freed again and again, counted in
minor page faults. Mapped afresh each time it costs its 4,096 pages every
time; taken from the heap it costs them once. (A smaller buffer could be
served from chunks a training left free, whatever the thresholds.)
"""

from __future__ import annotations

import sys
import textwrap

import pytest

from tests.helpers import run_results_script

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc")

ROUNDS = 50
BUFFER_BYTES = 16 << 20
PAGES_PER_BUFFER = BUFFER_BYTES // 4096

# The minor page faults one buffer costs, on average over ROUNDS: malloc,
# every page written (memset), free. Huge pages are refused for it
# (MADV_NOHUGEPAGE), so that a fault is one 4 KiB page whatever the
# machine's transparent huge page setting.
FAULTS_PER_BUFFER = textwrap.dedent(f"""
    import ctypes, resource
    libc = ctypes.CDLL(None)
    libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, (ctypes.c_size_t,)
    libc.free.argtypes = (ctypes.c_void_p,)
    libc.madvise.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
    MADV_NOHUGEPAGE = 15

    def faults_per_buffer():
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        for _ in range({ROUNDS}):
            address = libc.malloc({BUFFER_BYTES})
            page = -(-address // 4096) * 4096
            libc.madvise(page, {BUFFER_BYTES} - 4096, MADV_NOHUGEPAGE)
            ctypes.memset(address, 1, {BUFFER_BYTES})
            libc.free(address)
        return (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / {ROUNDS}
""")

FAULTS = textwrap.dedent("""
    import json
    import trainer
    import tensorflow as tf
    from trainer import _compat, strategy as strategy_lib
""") + FAULTS_PER_BUFFER + textwrap.dedent("""
    strategy = strategy_lib.mirrored(strategy_lib.split_cpu(2))
    data = strategy.distribute_datasets_from_function(
        lambda ctx: tf.data.Dataset.range(8).batch(2))
    next(iter(data))  # its per-device iterator's GeneratorDataset kernel
    distributed = faults_per_buffer()
    restored = _compat.restore_malloc_thresholds()
    after = faults_per_buffer()
    print("RESULTS", json.dumps(dict(tf_version=tf.__version__, distributed=distributed,
                                     restored=restored, after=after)))
""")


@pytest.fixture(scope="module")
def faults(tmp_path_factory) -> dict:
    return run_results_script(FAULTS, tmp_path_factory.mktemp("malloc"), timeout=300)[0]


def test_buffers_reuse_heap_memory_after_the_restore(faults):
    assert faults["restored"] is True
    assert faults["after"] < PAGES_PER_BUFFER / 8, faults


def test_the_restore_leaves_buffers_cheaper_than_the_distributed_iterator_did(faults):
    """Under TensorFlow 2.21 the iterator's kernel maps every such buffer
    afresh (each round faults all its pages in); the restore ends that.
    Where TensorFlow leaves malloc alone (tensorflow-tpu 2.20) the buffer
    is already reused and the restore keeps it so."""
    if faults["tf_version"].startswith("2.21"):
        assert faults["distributed"] >= PAGES_PER_BUFFER * 0.9, faults
    else:
        assert faults["distributed"] < PAGES_PER_BUFFER / 8, faults
    assert faults["after"] <= faults["distributed"], faults


AFTER_TRAINING = textwrap.dedent("""
    import json, sys
    from tests import trainer_data
    from tests.trainer import trainer_runs
""") + FAULTS_PER_BUFFER + textwrap.dedent("""
    data, model_dir = sys.argv[1] + "/data", sys.argv[1] + "/run"
    trainer_data.write_dataset(data, num_train=64, num_test=16)
    status = trainer_runs.run(data, model_dir, "--cpu_replicas=2", "--epochs=1")
    print("RESULTS", json.dumps(dict(status=status, faults=faults_per_buffer())))
""")


def test_a_two_replica_training_restores_the_thresholds(tmp_path):
    """The trainer command itself restores them: after its run on two
    replicas (a MultiDeviceIterator's kernel built) a buffer is reused."""
    result, stdout = run_results_script(AFTER_TRAINING, tmp_path, timeout=300)
    assert result["status"] == 0, stdout[-3000:]
    assert result["faults"] < PAGES_PER_BUFFER / 8, result
