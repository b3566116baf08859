"""A ``TF_CONFIG`` that is malformed or does not place this process in its
cluster: one line naming it, exit 2 (bad input); one whose peers do not
start: one line, exit 1.

TensorFlow itself raises a bare ``ValueError`` (a traceback) for a missing
task, an index past its type's list or a type not in the cluster, and runs
a JSON list as one worker; the trainer refuses each before building the
strategy, naming TF_CONFIG. For a peer that never starts TensorFlow waits
forever, deaf to SIGTERM; the trainer waits ``--cluster_timeout`` seconds
and hears signals meanwhile (`trainer.cluster`).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from tests.helpers import REPO
from tests.trainer.trainer_runs import free_ports
from trainer import cluster
from trainer.__main__ import main

CLUSTER = '"cluster": {"worker": ["localhost:12345"]}'


@pytest.mark.parametrize("tf_config, message", [
    ("{%s}" % CLUSTER, 'TF_CONFIG: no "task" with a "type" and an "index"'),
    ('{%s, "task": {"type": "worker", "index": 3}}' % CLUSTER,
     "TF_CONFIG: task index 3 is not one of the 1 'worker' address(es) (0...0)"),
    ('{%s, "task": {"type": "chief", "index": 0}}' % CLUSTER,
     "TF_CONFIG: task type 'chief' is not in the cluster (worker)"),
    ('{%s, "task": {"type": "worker", "index": -1}}' % CLUSTER,
     "TF_CONFIG: task index -1 is not one of the 1 'worker' address(es)"),
    ("[1,2]", 'TF_CONFIG: needs {"cluster": {TYPE: ["host:port", ...]}'),
    ('{"cluster": {"worker": []}, "task": {"type": "worker", "index": 0}}',
     'TF_CONFIG: needs {"cluster"'),
    ("{%s" % CLUSTER, "TF_CONFIG is not valid JSON (Expecting"),
    ("null", 'TF_CONFIG: needs {"cluster"'),
    ('{"cluster": {"worker": ["localhost:99999"]}, "task": {"type": "worker", "index": 0}}',
     "TF_CONFIG: address 'localhost:99999': the port must be an integer >= 1 and <= 65535"),
])
@pytest.mark.parametrize("strategy", ["auto", "multi_worker"])
def test_a_task_outside_the_cluster_is_one_line(trainer_dataset, tmp_path, monkeypatch,
                                                capsys, tf_config, message, strategy):
    monkeypatch.setenv("TF_CONFIG", tf_config)
    monkeypatch.delenv("TPU_NAME", raising=False)
    data = trainer_dataset(num_train=64, num_test=16)
    code = main([f"--data={data}", f"--model_dir={tmp_path / 'model'}", "--preset=smoke",
                 f"--strategy={strategy}", "--epochs=1"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2, err
    assert [line for line in err if line.startswith("error: ")] == [err[-1]], err
    assert err[-1].startswith(f"error: {message}"), err[-1]
    assert not (tmp_path / "model").exists()


def test_multi_worker_without_tf_config_is_bad_input(trainer_dataset, tmp_path, monkeypatch,
                                                     capsys):
    monkeypatch.delenv("TF_CONFIG", raising=False)
    data = trainer_dataset(num_train=64, num_test=16)
    code = main([f"--data={data}", f"--model_dir={tmp_path / 'model'}", "--preset=smoke",
                 "--strategy=multi_worker", "--epochs=1"])
    err = capsys.readouterr().err.strip().splitlines()
    assert (code, err[-1]) == (2, "error: --strategy=multi_worker needs TF_CONFIG (cluster "
                                  "spec and this task) in the environment"), err


def test_a_well_formed_tf_config_passes_the_check():
    cluster.check_tf_config(
        '{"cluster": {"chief": ["a:1"], "worker": ["b:1", "c:1"]},'
        ' "task": {"type": "worker", "index": 1}}')


def _cluster(own_port: int, silent_port: int) -> str:
    return ('{"cluster": {"worker": ["localhost:%d", "localhost:%d"]}, '
            '"task": {"type": "worker", "index": 0}}' % (own_port, silent_port))


def test_a_peer_that_never_starts_ends_the_run_at_the_deadline(trainer_dataset, tmp_path,
                                                                monkeypatch, capsys):
    """TensorFlow would wait for it forever; --cluster_timeout ends the run
    with one line naming it (exit 1)."""
    own, silent = free_ports(2)
    monkeypatch.setenv("TF_CONFIG", _cluster(own, silent))
    monkeypatch.delenv("TPU_NAME", raising=False)
    data = trainer_dataset(num_train=64, num_test=16)
    began = time.monotonic()
    code = main([f"--data={data}", f"--model_dir={tmp_path / 'model'}", "--preset=smoke",
                 "--epochs=1", "--cluster_timeout=2"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 1, err
    assert err[-1] == (f"error: TF_CONFIG: no answer within 2s (--cluster_timeout) from "
                       f"worker 1 (localhost:{silent}); start every task it lists")
    # A hang bound, not a speed bar: 2 s on a quiet machine, and under the
    # default --cluster_timeout (180 s) a flag left unread would reach.
    assert time.monotonic() - began < 60
    assert not (tmp_path / "model").exists()


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_while_waiting_for_the_cluster_ends_the_run(trainer_dataset, tmp_path,
                                                              signum):
    own, silent = free_ports(2)
    data = trainer_dataset(num_train=64, num_test=16)
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", TF_CONFIG=_cluster(own, silent))
    proc = subprocess.Popen(
        [sys.executable, "-m", "trainer", f"--data={data}", f"--model_dir={tmp_path}/m",
         "--preset=smoke", "--epochs=1"], cwd=REPO, env=env, stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL, text=True)
    try:
        for line in proc.stderr:
            if "TF_CONFIG: waiting up to 180s (--cluster_timeout) for worker 1" in line:
                break
        proc.send_signal(signum)
        err = proc.communicate(timeout=60)[1]
    finally:
        proc.kill()
    assert proc.returncode == 128 + signum, err
    assert err.strip().splitlines() == [
        f"{signal.Signals(signum).name} received outside the training steps: stopped; a "
        "rerun resumes from the last checkpoint, if any"]
