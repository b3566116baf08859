"""``scripts/run_local.sh`` tells the trainer the command that resumes its run.

A rerun of the script without ``RESUME=1`` starts over, so the trainer's
"rerun the same command to resume" would delete the checkpoint it has just
saved. The script hands the trainer (``TRAINER_RESUME_COMMAND``) its own
command with ``RESUME=1``, the settings given and the arguments, which the
trainer's stop line prints; run as printed, it keeps MODEL_DIR and trains
with the same settings.
"""

from __future__ import annotations

import os
import subprocess

from tests.scripts.run_local_helpers import calls, run_local, tree

# A stand-in interpreter that records its arguments and, for the trainer,
# the command it was given to print.
RECORDING = """#!/bin/sh
here="$(dirname "$0")"
echo "$@" >> "$here/calls"
case "$*" in *"-m trainer "*) printf '%s\\n' "$TRAINER_RESUME_COMMAND" >> "$here/resume" ;; esac
"""


def test_the_trainer_is_told_the_command_that_resumes(checkout, tmp_path):
    stand_in = tmp_path / "python"
    stand_in.write_text(RECORDING)
    model_dir = tmp_path / "my model"
    first = run_local(checkout, model_dir, "--seed=1", EPOCHS="2", LOOP="custom")
    assert first.returncode == 0, first.stderr
    [command] = (tmp_path / "resume").read_text().splitlines()
    script = checkout / "scripts" / "run_local.sh"
    assert command == (f"RESUME=1 PYTHON={stand_in} DATA={tmp_path / 'data'} LOOP=custom "
                       f"MODEL_DIR={tmp_path}/my\\ model EPOCHS=2 bash {script} --seed=1")
    # What the stopped trainer left; the command, run as printed, resumes it.
    (model_dir / "checkpoints").mkdir()
    (model_dir / "checkpoints" / "ckpt-31.index").write_text("stopped at step 31")
    before = tree(model_dir)
    settings = ("PYTHON", "DATA", "LOOP", "MODEL_DIR", "EPOCHS", "RESUME")
    resumed = subprocess.run(["bash", "-c", command], capture_output=True, text=True,
                             timeout=300, env={k: v for k, v in os.environ.items()
                                               if k not in settings})
    assert resumed.returncode == 0, resumed.stderr
    assert tree(model_dir) == before
    trainer = [c for c in calls(tmp_path) if c.startswith("-m trainer ")]
    assert len(trainer) == 2 and trainer[0] == trainer[1]
    assert "--epochs=2" in trainer[0] and "--loop=custom" in trainer[0]
