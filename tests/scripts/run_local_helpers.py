"""Running a copy of ``scripts/run_local.sh`` (its "checkout") with PYTHON set to
a stand-in that records its arguments in ``calls`` beside it, so that only the
script's own decisions run; or with the real interpreter (``real=True``)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time

from tests.helpers import REPO

MARKER = ".made-by-run_local"
SCRIPTS = ("run_local.sh", "bootstrap.sh")


def make_checkout(tmp_path):
    repo = tmp_path / "repo"
    (repo / "scripts").mkdir(parents=True)
    for name in SCRIPTS:
        shutil.copy(REPO / "scripts" / name, repo / "scripts" / name)
    (repo / "untracked.txt").write_text("work in progress")
    stand_in = tmp_path / "python"
    stand_in.write_text('#!/bin/sh\necho "$@" >> "$(dirname "$0")/calls"\n')
    stand_in.chmod(0o755)
    return repo


def run_local(checkout, model_dir, *args, real=False, **env) -> subprocess.CompletedProcess:
    """Runs the checkout's run_local.sh with ``args``; DATA defaults to ``data``
    beside the checkout, MODEL_DIR (None: the script's default) as given."""
    environ = dict(os.environ, PYTHON=sys.executable if real else str(checkout.parent / "python"),
                   PYTHONPATH=str(REPO))
    environ.setdefault("DATA", str(checkout.parent / "data"))
    environ.update(env)
    if model_dir is not None:
        environ["MODEL_DIR"] = str(model_dir)
    return subprocess.run(["bash", str(checkout / "scripts" / "run_local.sh"), *args],
                          env=environ, capture_output=True, text=True, timeout=300)


def calls(tmp_path) -> list[str]:
    """The stand-in's calls, one line each (empty if it never ran)."""
    path = tmp_path / "calls"
    return path.read_text().splitlines() if path.exists() else []


def tree(folder) -> dict:
    return {str(p.relative_to(folder)): p.read_bytes() if p.is_file() else None
            for p in sorted(folder.rglob("*"))}


# A stand-in interpreter whose pipeline call blocks until the file ``go``
# appears beside it, and which records in ``signal`` a SIGINT, SIGTERM or
# SIGHUP it receives meanwhile, exiting as Python would (128 + N).
BLOCKING = """#!/bin/sh
here="$(dirname "$0")"
echo "$@" >> "$here/calls"
case "$*" in *"-m pipeline"*)
  trap 'echo INT > "$here/signal"; exit 130' INT
  trap 'echo TERM > "$here/signal"; exit 143' TERM
  trap 'echo HUP > "$here/signal"; exit 129' HUP
  touch "$here/started"
  while [ ! -e "$here/go" ]; do sleep 0.05; done ;;
esac
"""


def start_blocked_run(checkout, tmp_path, model_dir, runs) -> subprocess.Popen:
    """Starts run_local.sh with the `BLOCKING` stand-in (appended to ``runs``)
    and returns once its pipeline call is blocked."""
    stand_in = tmp_path / "python"
    stand_in.write_text(BLOCKING)
    env = dict(os.environ, PYTHON=str(stand_in), DATA=str(tmp_path / "data"),
               MODEL_DIR=str(model_dir))
    first = subprocess.Popen(["bash", str(checkout / "scripts" / "run_local.sh")],
                             env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True)
    runs.append(first)
    deadline = time.monotonic() + 60
    while not (tmp_path / "started").exists():
        assert first.poll() is None, first.communicate()
        assert time.monotonic() < deadline
        time.sleep(0.05)
    return first
