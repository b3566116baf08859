"""Two real worker processes under MultiWorkerMirroredStrategy on localhost.

Checks what only several workers exercise: one input pipeline per worker
(train files sharded between them, the one-file test split sharded by
record with a warning), the exact evaluation across workers, and that only
the chief's files stay in model_dir (the other worker writes to a scratch
directory that it deletes).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import pytest

from tests import trainer_data
from tests.conftest import REPO
from trainer import outputs

pytestmark = pytest.mark.slow


def free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("localhost", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


@pytest.fixture(scope="module")
def dataset(tmp_path_factory) -> str:
    out = str(tmp_path_factory.mktemp("multiworker") / "data")
    trainer_data.write_dataset(out, num_train=256, num_test=37, train_shards=4,
                               test_shards=1)
    return out


@pytest.mark.parametrize("loop", ["keras", "custom"])
def test_two_workers(dataset, tmp_path, loop):
    model_dir = str(tmp_path / "model")
    cluster = {"worker": [f"localhost:{p}" for p in free_ports(2)]}
    procs = []
    for index in range(2):
        env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", TF_CONFIG=json.dumps(
            {"cluster": cluster, "task": {"type": "worker", "index": index}}))
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "trainer", f"--data={dataset}", f"--model_dir={model_dir}",
             "--strategy=multi_worker", f"--loop={loop}", "--epochs=2",
             "--global_batch_size=16", "--steps_per_execution=4", "--verbose=2",
             "--log_every=8"],
            cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    results = []
    for proc in procs:
        try:
            out, err = proc.communicate(timeout=240)
        except subprocess.TimeoutExpired:
            for p in procs:
                p.kill()
            raise
        results.append((proc.returncode, out, err))
    for rc, out, err in results:
        assert rc == 0, out[-2000:] + err[-4000:]
        assert "test_examples=37" in out
        assert "CollectiveAllReduceStrategy, 2 replica(s)" in out
        assert "split 'test': 1 file(s) for 2 input pipelines" in err
        assert "split 'train'" not in err  # 4 files: sharded by file
    finals = [out.strip().splitlines()[-1] for _, out, _ in results]
    assert finals[0] == finals[1]  # same model, same metrics on both workers
    metrics = outputs.read_metrics(model_dir)
    assert metrics["replicas"] == 2 and metrics["train_steps"] == 2 * 16
    assert metrics["test_examples"] == 37
    names = os.listdir(model_dir)
    assert not [n for n in names if n.startswith("workertemp")], names
    assert {"export", "checkpoints", "logs", "metrics.json"} <= set(names)
