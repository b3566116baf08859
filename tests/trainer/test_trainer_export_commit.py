"""Export and metrics.json are committed together: a kill while exporting never
leaves an export beside metrics.json that describes another one."""

from __future__ import annotations

import glob
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from tests import trainer_data
from tests.helpers import REPO
from tests.trainer.trainer_runs import run, start
from tests.trainer_data import read_metrics

pytestmark = pytest.mark.slow


def predict_accuracy(model_dir: str, data: str) -> tuple[int, str]:
    """``(exit status, last line)`` of ``python -m trainer.predict`` on the test split."""
    proc = subprocess.run(
        [sys.executable, "-m", "trainer.predict", f"--model_dir={model_dir}",
         f"--data={data}", "--split=test"], cwd=REPO, capture_output=True, text=True,
        env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"))
    lines = (proc.stdout if proc.returncode == 0 else proc.stderr).strip().splitlines()
    return proc.returncode, lines[-1]


def new_variables_index(model_dir: str, since: float) -> bool:
    found = [p for folder in ("export", ".export.*") for p in glob.glob(
        os.path.join(model_dir, folder, "variables", "variables.index"))]
    return any(os.stat(p).st_mtime > since for p in found)


def test_kill_while_exporting_leaves_a_consistent_pair(tmp_path):
    data, model_dir = str(tmp_path / "data"), str(tmp_path / "m")
    trainer_data.write_dataset(data, num_train=256, num_test=37, train_shards=2,
                               test_shards=1)
    flags = ("--loop=custom", "--global_batch_size=32", "--learning_rate=3e-4")
    assert run(data, model_dir, "--epochs=1", *flags) == 0
    first = read_metrics(model_dir)
    since = time.time()
    proc = start(data, model_dir, "--epochs=3", *flags)
    try:
        while not new_variables_index(model_dir, since):
            assert proc.poll() is None, proc.communicate()
            time.sleep(0.002)
        proc.send_signal(signal.SIGKILL)
        proc.communicate(timeout=60)
    finally:
        proc.kill()
    code, line = predict_accuracy(model_dir, data)
    if os.path.exists(os.path.join(model_dir, "metrics.json")):
        described = read_metrics(model_dir)
        assert described == first  # the kill came before the commit point
        assert code == 0 and line.startswith(f"accuracy={described['test_accuracy']:.4f} ")
    else:  # killed between the two: the export is refused, not trusted
        assert code == 2 and "not committed" in line, line
    # The next run finishes the job: one consistent pair.
    assert run(data, model_dir, "--epochs=3", *flags) == 0
    final = read_metrics(model_dir)
    # test_loss, not test_accuracy: 37 test digits leave few accuracies, and a
    # 24-step model can get as many right as the 8-step one.
    assert final["train_steps"] == 24 and final["test_loss"] != first["test_loss"]
    code, line = predict_accuracy(model_dir, data)
    assert code == 0 and line.startswith(f"accuracy={final['test_accuracy']:.4f} ")
    with open(os.path.join(model_dir, "export", "trainer_export.json")) as f:
        assert json.load(f)["export_id"] == final["export_id"]
    assert not glob.glob(os.path.join(model_dir, ".export.*"))


def test_a_failed_commit_is_one_line_and_the_rerun_commits(tmp_path, monkeypatch, capsys):
    """Storage failing at the commit point (metrics.json) ends the run with one
    line; nothing is committed, and the same command again exports and commits."""
    import tensorflow as tf
    from trainer import __main__ as cli
    from trainer.run import outputs
    data, model_dir = str(tmp_path / "data"), str(tmp_path / "m")
    trainer_data.write_dataset(data, num_train=64, num_test=20, train_shards=1,
                               test_shards=1)
    argv = [f"--data={data}", f"--model_dir={model_dir}", "--preset=smoke", "--epochs=1",
            "--global_batch_size=16", "--steps_per_execution=2", "--verbose=0"]
    write_text = outputs.write_text

    def full_disk_at_metrics(path, text):
        if path.endswith(outputs.METRICS):
            raise tf.errors.ResourceExhaustedError(
                None, None, f"{path}.tmp; No space left on device")
        write_text(path, text)

    monkeypatch.setattr(outputs, "write_text", full_disk_at_metrics)
    assert cli.main(argv) == 1
    errors = [l for l in capsys.readouterr().err.splitlines() if l.startswith("error:")]
    assert errors == [f"error: {model_dir}/metrics.json: cannot commit the export and metrics "
                      "(No space left on device); training is complete and checkpointed, "
                      "a rerun exports again"]
    assert not os.path.exists(os.path.join(model_dir, "metrics.json"))
    code, line = predict_accuracy(model_dir, data)
    assert code == 2 and "not committed" in line, line
    monkeypatch.setattr(outputs, "write_text", write_text)
    assert cli.main(argv) == 0
    code, line = predict_accuracy(model_dir, data)
    assert code == 0 and line.startswith(
        f"accuracy={read_metrics(model_dir)['test_accuracy']:.4f} ")
