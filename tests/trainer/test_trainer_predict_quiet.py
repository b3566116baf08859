"""``python -m trainer.predict`` prints only its own lines, as the trainer does:
no TensorFlow log line on stdout or stderr (TF_CPP_MIN_LOG_LEVEL unset),
while its errors still show."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from tests.helpers import REPO
from trainer import __main__ as cli

pytestmark = pytest.mark.slow

NUM_TEST = 21


def run_predict(*args: str) -> subprocess.CompletedProcess:
    """The command as a user runs it: TF_CPP_MIN_LOG_LEVEL unset."""
    env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
    return subprocess.run([sys.executable, "-m", "trainer.predict", *args], cwd=REPO,
                          env=env, capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def trained(trainer_dataset, tmp_path_factory):
    dataset = trainer_dataset(num_train=128, num_test=NUM_TEST, train_shards=3)
    model_dir = str(tmp_path_factory.mktemp("quiet") / "m")
    assert cli.main([f"--data={dataset}", f"--model_dir={model_dir}", "--preset=smoke",
                     "--epochs=1", "--global_batch_size=16", "--verbose=0"]) == 0
    return dataset, model_dir


def test_predict_on_a_split_prints_only_its_own_lines(trained):
    dataset, model_dir = trained
    proc = run_predict(f"--model_dir={model_dir}", f"--data={dataset}", "--split=test")
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""
    lines = proc.stdout.splitlines()
    assert len(lines) == NUM_TEST + 1
    assert all(re.fullmatch(r"index=\d+ label=\d class=\d probability=[01]\.\d{4}", line)
               for line in lines[:-1]), lines
    assert re.fullmatch(rf"accuracy=[01]\.\d{{4}} \(\d+/{NUM_TEST}\) on split test", lines[-1])


def test_predict_errors_still_show(trained):
    dataset, model_dir = trained
    proc = run_predict(f"--model_dir={model_dir}", f"--data={dataset}", "--split=valid")
    assert proc.returncode == 2 and proc.stdout == ""  # an unknown split: bad input
    assert proc.stderr.splitlines() == [
        f"error: {dataset}/manifest.json: split 'valid' not in manifest "
        "(has ['test', 'train'])"]

