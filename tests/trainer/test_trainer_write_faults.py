"""A full disk at a checkpoint or at the export, a read-only model_dir: one line, exit 1.

Real faults: a 2200 KB tmpfs holds one checkpoint of the small model
(1.8 MB) but not a second one, nor a checkpoint and the export (0.8 MB);
a read-only bind mount refuses writes (chmod does not stop root). Where
mounting is not permitted the tests skip. What the failed save left
(``ckpt-N_temp/``, the export's ``variables_temp``) is removed, so no half
file remains that a reader could take for a whole one.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from tests.helpers import REPO, mount

pytestmark = pytest.mark.slow

DATASET = dict(num_train=400, num_test=40)  # 25 steps per epoch at batch 16


@pytest.fixture
def small_disk(tmp_path):
    disk = tmp_path / "disk"
    disk.mkdir()
    mount("-t", "tmpfs", "-o", "size=2200k", "tmpfs", str(disk))
    yield disk
    subprocess.run(["umount", "-l", str(disk)], check=False)


def train(data: str, model_dir, *flags: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    return subprocess.run(
        [sys.executable, "-m", "trainer", f"--data={data}", f"--model_dir={model_dir}",
         "--preset=smoke", "--epochs=1", "--global_batch_size=16", "--verbose=0", *flags],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=300)


def one_error_line(process: subprocess.CompletedProcess) -> str:
    assert process.returncode == 1, process.stderr[-3000:]
    errors = [line for line in process.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "Traceback" not in process.stderr, process.stderr[-3000:]
    return errors[0]


def test_disk_full_at_a_checkpoint(trainer_dataset, small_disk):
    model_dir = small_disk / "model"
    line = one_error_line(train(trainer_dataset(**DATASET), model_dir, "--loop=custom",
                                "--checkpoint_every=10"))
    checkpoints = model_dir / "checkpoints"
    assert line == (f"error: {checkpoints}/ckpt-20: cannot save the checkpoint (No space "
                    f"left on device); a rerun resumes from {checkpoints}/ckpt-10")
    assert sorted(os.listdir(checkpoints)) == [
        "checkpoint", "ckpt-10.data-00000-of-00001", "ckpt-10.index"]


def test_disk_full_at_the_export(trainer_dataset, small_disk):
    model_dir = small_disk / "model"
    line = one_error_line(train(trainer_dataset(**DATASET), model_dir))
    # The export is written into a staging folder first (`trainer.run.outputs`).
    assert re.fullmatch(
        rf"error: {re.escape(str(model_dir))}/\.export\.new-\w+: cannot write the export "
        r"\(No space left on device\); training is complete and checkpointed, a rerun "
        r"exports again", line), line
    # No half export:
    assert sorted(os.listdir(model_dir)) == ["checkpoints", "dataset.json", "logs"]


def test_read_only_model_dir(trainer_dataset, tmp_path):
    model_dir = tmp_path / "model"
    (model_dir / "logs").mkdir(parents=True)
    mount("--bind", "-o", "ro", str(model_dir), str(model_dir))
    try:
        line = one_error_line(train(trainer_dataset(**DATASET), model_dir))
    finally:
        subprocess.run(["umount", "-l", str(model_dir)], check=False)
    # The model_dir lock is the first thing the run writes.
    assert line == (f"error: {model_dir}/.lock: cannot take the lock of --model_dir "
                    "(Read-only file system)"), line
