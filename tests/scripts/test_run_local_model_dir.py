"""``scripts/run_local.sh`` deletes only a MODEL_DIR it made itself.

The script runs from a copy of the scripts (its "checkout") with PYTHON set
to a stand-in that records its arguments, so no pipeline or trainer runs:
only the script's own decision about MODEL_DIR is under test. A folder with
a file in it, the checkout itself and a home folder are refused with one
line and left as they were; a folder the script made (its marker file) is
replaced once the new run's pipeline has succeeded. (DATA:
test_run_local_data.py.)
"""

from __future__ import annotations

import signal

import pytest

from tests.scripts.run_local_helpers import MARKER, calls, run_local, start_blocked_run, tree


def refused(result, model_dir) -> None:
    assert result.returncode == 2, result.stderr
    assert result.stderr.splitlines() == [
        f"error: MODEL_DIR={model_dir}: not a folder this script made (no {MARKER} in it), "
        "so it is not replaced; remove it yourself, resume it with RESUME=1 or pick "
        "another MODEL_DIR"]


@pytest.mark.parametrize("which", ["folder with a file", "the checkout", "a home folder"])
def test_a_folder_it_did_not_make_is_refused_and_kept(checkout, tmp_path, which):
    if which == "folder with a file":
        model_dir = tmp_path / "results"
        model_dir.mkdir()
        (model_dir / "notes.txt").write_text("keep me")
    elif which == "the checkout":
        model_dir = checkout
    else:
        model_dir = tmp_path / "home"
        (model_dir / ".ssh").mkdir(parents=True)
        (model_dir / ".ssh" / "id_ed25519").write_text("key")
    before = tree(tmp_path)
    result = run_local(checkout, model_dir, HOME=str(tmp_path / "home"))
    refused(result, model_dir)
    assert {k: v for k, v in tree(tmp_path).items() if k != "calls"} == before
    assert [c.split()[:2] for c in calls(tmp_path)] == [
        ["-m", "trainer.check_flags"]]  # neither pipeline nor trainer ran


def test_a_folder_it_made_is_replaced(checkout, tmp_path):
    model_dir = tmp_path / "runs" / "local"
    first = run_local(checkout, model_dir)
    assert first.returncode == 0, first.stderr
    assert sorted(p.name for p in model_dir.iterdir()) == [MARKER]
    (model_dir / "checkpoints").mkdir()
    (model_dir / "checkpoints" / "ckpt-1.index").write_text("old run")
    second = run_local(checkout, model_dir)
    assert second.returncode == 0, second.stderr
    assert sorted(p.name for p in model_dir.iterdir()) == [MARKER]
    # Each run: the trainer's flags checked, the pipeline, the trainer.
    made = calls(tmp_path)
    assert len(made) == 6 and f"--model_dir={model_dir}" in made[2]


def test_the_default_model_dir_and_resume(checkout, tmp_path):
    first = run_local(checkout, None)
    assert first.returncode == 0, first.stderr
    default = checkout / "runs" / "local-keras"
    assert (default / MARKER).is_file()
    kept = tmp_path / "results"
    kept.mkdir()
    (kept / "ckpt").write_text("resume me")
    resumed = run_local(checkout, kept, RESUME="1")
    assert resumed.returncode == 0, resumed.stderr
    assert sorted(p.name for p in kept.iterdir()) == ["ckpt"]  # kept, not marked


def test_a_stop_during_the_pipeline_leaves_the_previous_run(checkout, tmp_path,
                                                            blocked_runs):
    """A rerun replaces the previous run only once its pipeline has succeeded:
    Ctrl-C while the shards are made leaves the previous model as it was."""
    model_dir = tmp_path / "model"
    assert run_local(checkout, model_dir).returncode == 0
    (model_dir / "checkpoints").mkdir()
    (model_dir / "checkpoints" / "ckpt-31.index").write_text("the previous run")
    (model_dir / "metrics.json").write_text("{}")
    before = tree(model_dir)
    rerun = start_blocked_run(checkout, tmp_path, model_dir, blocked_runs)
    rerun.send_signal(signal.SIGINT)
    assert rerun.wait(timeout=60) == 128 + signal.SIGINT, rerun.communicate()
    assert tree(model_dir) == before
    assert not [c for c in calls(tmp_path) if c.startswith("-m trainer ")][1:]  # no new one
