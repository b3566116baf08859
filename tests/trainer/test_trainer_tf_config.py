"""A ``TF_CONFIG`` that does not place this process in its cluster: one line, exit 1.

TensorFlow itself raises a bare ``ValueError`` (a traceback) for a missing
task, an index past its type's list or a type not in the cluster, and runs
a JSON list as one worker; the trainer refuses each before building the
strategy, naming TF_CONFIG.
"""

from __future__ import annotations

import pytest

from trainer import strategy as strategy_lib
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
    assert code == 1, err
    assert err[-1].startswith(f"error: {message}"), err[-1]
    assert not (tmp_path / "model").exists()


def test_a_well_formed_tf_config_passes_the_check():
    strategy_lib.check_tf_config(
        '{"cluster": {"chief": ["a:1"], "worker": ["b:1", "c:1"]},'
        ' "task": {"type": "worker", "index": 1}}')
