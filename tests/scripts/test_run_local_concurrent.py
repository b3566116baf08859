"""Two runs of ``scripts/run_local.sh`` at once: the second is refused before it
touches anything, because it would delete the first one's MODEL_DIR under its
trainer and overwrite the DATA that trainer reads.

The first run's stand-in interpreter blocks inside its pipeline call until the
test lets it go (`start_blocked_run`), so the second run starts while the
first is mid-way.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.scripts.run_local_helpers import (MARKER, calls, run_local, start_blocked_run,
                                             tree)

@pytest.mark.parametrize("shared", ["both", "DATA"])
def test_a_second_run_is_refused_while_the_first_runs(checkout, tmp_path, shared,
                                                      blocked_runs):
    model_dir = tmp_path / "model"
    first = start_blocked_run(checkout, tmp_path, model_dir, blocked_runs)
    (model_dir / "checkpoints").mkdir()  # what the first run's trainer would write
    before, made = tree(tmp_path), len(calls(tmp_path))
    other = model_dir if shared == "both" else tmp_path / "other-model"
    second = run_local(checkout, other)
    assert second.returncode == 2, second.stderr
    holder = f"pid {first.pid}, {tmp_path / 'data'}.run_local.lock"
    assert second.stderr.splitlines() == [
        f"error: DATA={tmp_path / 'data'}: in use by another run of this script "
        f"({holder}); wait for it to end or pick another DATA"]
    # Nothing deleted, no claim left behind; only the trainer's flags were checked.
    assert {k: v for k, v in tree(tmp_path).items() if k != "calls"} == {
        k: v for k, v in before.items() if k != "calls"}
    assert [c.split()[:2] for c in calls(tmp_path)[made:]] == [["-m", "trainer.check_flags"]]
    (tmp_path / "go").touch()
    assert first.wait(timeout=60) == 0, first.communicate()
    assert (model_dir / "checkpoints").is_dir() and (model_dir / MARKER).exists()
    assert not list(tmp_path.glob("*.run_local.lock"))  # released at the end
    assert run_local(checkout, model_dir).returncode == 0  # free again


def test_a_claim_left_by_a_killed_run_is_taken_over(checkout, tmp_path):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()  # a pid no process has now
    os.symlink(str(dead.pid), tmp_path / "data.run_local.lock")
    result = run_local(checkout, tmp_path / "model")
    assert result.returncode == 0, result.stderr
    assert [c.split()[:2] for c in calls(tmp_path)][1:] == [["-m", "pipeline"],
                                                             ["-m", "trainer"]]
    assert not list(tmp_path.glob("*.run_local.lock"))
