"""A rerun after an interrupted publish: done (exit 0) when the publish it completed is
the dataset its own options describe, refused (exit 2) when it is another."""

import os
import subprocess
import sys

import pytest

from pipeline import faults
from pipeline.errors import PipelineInputError, StorageError
from pipeline.publish import journal
from pipeline.verify import verify
from tests.helpers import REPO, job_result, run_job, with_defaults

POINT = "moved:mnist-train.tfrecord-00001-of-00003"
FLAGS = ["--runner=DirectRunner", "--min_shards=3", "--allow_extreme_sharding"]
DONE = ("completed the interrupted publish of run {run}, which is the dataset these "
        "options describe; nothing left to do")


def interrupt(monkeypatch, args):
    """Runs the job with a storage failure in the middle of its publish; returns the run id."""
    monkeypatch.setenv(faults.ENV, f"enospc@{POINT}")
    with pytest.raises(StorageError, match="interrupted publish of run"):
        run_job(args)
    monkeypatch.delenv(faults.ENV)
    return journal.read_journal(args[1].split("=", 1)[1]).run_id


@pytest.mark.parametrize("rerun", [
    [],
    ["--overwrite"],  # what the interrupted command asked to replace is replaced
    ["--splits=test,train", "--runner=BundleBasedDirectRunner", "--shuffle=beam"],
    ["--target_shard_bytes=100000000"],  # the default --target_shard_mb=100, in bytes
])
def test_same_dataset_rerun_is_done(tmp_path, idx_dir, monkeypatch, rerun):
    args = [f"--source={idx_dir}", f"--output={tmp_path / 'out'}", *FLAGS]
    run = interrupt(monkeypatch, args)
    done = job_result(with_defaults(args, rerun))
    assert done.manifest is None
    assert done.nothing_left == f"{tmp_path / 'out'}: " + DONE.format(run=run)
    manifest = verify(str(tmp_path / "out"))
    assert manifest == run_job(args[:1] + [f"--output={tmp_path / 'clean'}", *FLAGS])


@pytest.mark.parametrize("rerun", [
    ["--shuffle_salt=other"], ["--min_shards=2"], ["--image_format=png"],
    ["--compression=gzip"], ["--splits=train"], ["--target_shard_mb=50"],
])
def test_other_dataset_rerun_is_refused(tmp_path, idx_dir, monkeypatch, rerun):
    args = [f"--source={idx_dir}", f"--output={tmp_path / 'out'}", *FLAGS]
    run = interrupt(monkeypatch, args)
    with pytest.raises(PipelineInputError, match=f"completed the interrupted publish of "
                       f"run {run}, so it now holds that dataset; pass --overwrite"):
        run_job(with_defaults(args, rerun))
    verify(str(tmp_path / "out"))


def test_journal_without_options_is_not_taken_for_the_same_dataset(tmp_path, idx_dir,
                                                                   monkeypatch):
    out = tmp_path / "out"
    args = [f"--source={idx_dir}", f"--output={out}", *FLAGS]
    interrupt(monkeypatch, args)
    path = out / ".publish-journal.json"
    plan = journal.Plan.from_json(path.read_bytes(), str(path))
    path.write_bytes(journal.Plan(**{**plan.__dict__, "options": {}}).to_json())
    with pytest.raises(PipelineInputError, match="so it now holds that dataset"):
        run_job(args)


def run_command(args, fault=None):
    env = {**os.environ, "NO_GCE_CHECK": "True"}
    if fault:
        env[faults.ENV] = fault
    return subprocess.run([sys.executable, "-m", "pipeline", *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=300)


@pytest.mark.slow
def test_killed_publish_rerun_with_the_same_command_exits_0(tmp_path, idx_dir):
    out = tmp_path / "out"
    args = [f"--source={idx_dir}", f"--output={out}", *FLAGS]
    killed = run_command(args, f"kill@{POINT}")
    assert killed.returncode == -9, killed.stderr[-2000:]
    run = journal.read_journal(str(out)).run_id
    again = run_command(args)
    assert again.returncode == 0, again.stderr[-2000:]
    assert again.stdout.strip().splitlines() == [f"{out}: " + DONE.format(run=run)]
    verify(str(out))
    assert sorted(n for n in os.listdir(out) if n.startswith(".")) == []
    # Interrupted again, then rerun with another option: refused as before.
    assert run_command(args + ["--overwrite"], f"kill@{POINT}").returncode == -9
    run = journal.read_journal(str(out)).run_id
    other = run_command(args + ["--shuffle_salt=other"])
    assert other.returncode == 2, other.stderr[-2000:]
    assert other.stderr.strip().splitlines()[-1] == (
        f"error: {out}: completed the interrupted publish of run {run}, so it now "
        "holds that dataset; pass --overwrite to replace it")
    verify(str(out))


@pytest.mark.slow
def test_a_temp_folder_left_after_the_publish_is_one_warning_and_exit_0(tmp_path, idx_dir):
    """The dataset is published when the temp folder's removal fails: the run
    says so in one line and succeeds; the next run removes the folder."""
    out = tmp_path / "out"
    args = [f"--source={idx_dir}", f"--output={out}", *FLAGS]
    result = run_command(args, "erofs@removing-temp")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    [warning] = [line for line in result.stderr.splitlines() if "could not remove" in line]
    assert warning.endswith("(OSError: [Errno 30] Read-only file system); the next run "
                            "removes it"), warning
    verify(str(out))
    assert [n for n in os.listdir(out) if n.startswith(".incomplete-")]
    assert run_command(args + ["--overwrite"]).returncode == 0
    assert not [n for n in os.listdir(out) if n.startswith(".incomplete-")]
