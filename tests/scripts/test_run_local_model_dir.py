"""``scripts/run_local.sh`` deletes only a MODEL_DIR it made itself.

The script runs from a copy of the scripts (its "checkout") with PYTHON set
to a stand-in that records its arguments, so no pipeline or trainer runs:
only the script's own decision about MODEL_DIR is under test. A folder with
a file in it, the checkout itself and a home folder are refused with one
line and left as they were; a folder the script made (its marker file) is
replaced. (DATA the script only hands to ``python -m pipeline --overwrite``,
which replaces dataset files and nothing else there.)
"""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from tests.helpers import REPO

MARKER = ".made-by-run_local"


@pytest.fixture
def checkout(tmp_path):
    repo = tmp_path / "repo"
    (repo / "scripts").mkdir(parents=True)
    for name in ("run_local.sh", "bootstrap.sh"):
        shutil.copy(REPO / "scripts" / name, repo / "scripts" / name)
    (repo / "untracked.txt").write_text("work in progress")
    stand_in = tmp_path / "python"
    stand_in.write_text('#!/bin/sh\necho "$@" >> "$(dirname "$0")/calls"\n')
    stand_in.chmod(0o755)
    return repo


def run_local(checkout, model_dir, **env) -> subprocess.CompletedProcess:
    environ = dict(os.environ, PYTHON=str(checkout.parent / "python"),
                   DATA=str(checkout.parent / "data"), **env)
    if model_dir is not None:
        environ["MODEL_DIR"] = str(model_dir)
    return subprocess.run(["bash", str(checkout / "scripts" / "run_local.sh")],
                          env=environ, capture_output=True, text=True, timeout=60)


def tree(folder) -> dict:
    return {str(p.relative_to(folder)): p.read_bytes() if p.is_file() else None
            for p in sorted(folder.rglob("*"))}


def refused(result, model_dir) -> None:
    assert result.returncode == 2, result.stderr
    assert result.stderr.splitlines() == [
        f"error: MODEL_DIR={model_dir}: not a folder this script made (no {MARKER} in it), "
        "so it is not deleted; remove it yourself, resume it with RESUME=1 or pick "
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
    assert tree(tmp_path) == before
    assert not (tmp_path / "calls").exists()  # neither pipeline nor trainer ran


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
    calls = (tmp_path / "calls").read_text().splitlines()
    assert len(calls) == 4 and f"--model_dir={model_dir}" in calls[1]


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
