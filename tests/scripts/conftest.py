"""Fixtures of the scripts' tests: a copy of the scripts run_local.sh needs,
and run_local.sh runs ended when the test ends."""

from __future__ import annotations

import subprocess

import pytest

from tests.scripts.run_local_helpers import make_checkout


@pytest.fixture
def checkout(tmp_path):
    return make_checkout(tmp_path)


@pytest.fixture
def blocked_runs(tmp_path):
    """run_local.sh runs (`start_blocked_run`), let go and ended when the test
    ends, whatever happened."""
    runs: list[subprocess.Popen] = []
    yield runs
    (tmp_path / "go").touch()
    for run in runs:
        try:
            run.wait(timeout=30)
        except subprocess.TimeoutExpired:
            run.kill()
            run.wait()
