"""The trainer's commands hide TensorFlow's C++ start-up lines, whatever
``TF_CPP_MIN_LOG_LEVEL`` the user set (it decides only what TF logs later).

Each command fails early here, after TensorFlow has loaded and found its
devices, so its stderr must be the one ``error:`` line and nothing else.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.helpers import REPO


def run(args, level) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
    if level is not None:
        env["TF_CPP_MIN_LOG_LEVEL"] = level
    return subprocess.run([sys.executable, "-m", *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("level", [None, "0", "1"])
def test_trainer_start_is_quiet(tmp_path, level):
    (tmp_path / "model").write_text("a file")
    result = run(["trainer", "--preset=smoke", f"--data={tmp_path / 'data'}",
                  f"--model_dir={tmp_path / 'model'}"], level)
    assert result.returncode == 2
    assert result.stderr.splitlines() == [
        f"error: {tmp_path / 'model'}: --model_dir is a file, not a folder"], result.stderr


@pytest.mark.parametrize("level", [None, "1"])
def test_predict_start_is_quiet(tmp_path, level):
    result = run(["trainer.predict", f"--model_dir={tmp_path}", "digit.png"], level)
    assert result.returncode == 2  # a --model_dir without an export: bad input
    [line] = result.stderr.splitlines()
    assert line.startswith(f"error: {tmp_path}/export: no SavedModel"), result.stderr


def test_trainer_start_under_tf_config_is_quiet(trainer_dataset, tmp_path):
    """A one-worker cluster: the multi-worker strategy comes up (where TF logs
    ``cuInit`` without a GPU), then the batch check fails; only its line shows."""
    from tests.helpers import free_port
    data = trainer_dataset(num_train=64, num_test=16)
    env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
    env["TF_CONFIG"] = ('{"cluster": {"worker": ["localhost:%d"]}, '
                        '"task": {"type": "worker", "index": 0}}' % free_port())
    result = subprocess.run(
        [sys.executable, "-m", "trainer", "--preset=smoke", f"--data={data}",
         f"--model_dir={tmp_path / 'model'}", "--global_batch_size=128"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 2, result.stderr
    assert result.stderr.splitlines() == [
        f"error: {data}: the train split has 64 examples, fewer than one global batch "
        "of 128"], result.stderr
