"""Ctrl-C during the conversion: one line, exit 130, lock and temp folder gone.

A real ``python -m pipeline`` gets SIGINT while Beam runs. Beam logs the
interrupt in its workers with a traceback and re-raises it as
``RuntimeError: KeyboardInterrupt [while running ...]``; the job recognizes
it, removes its temp folder, releases the output's lock and prints what the
output holds.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import pytest

from tests.helpers import REPO, run_job

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("earlier", [False, True])
def test_ctrl_c_while_beam_runs(tmp_path, earlier):
    out = tmp_path / "out"
    if earlier:
        run_job(["--source=synthetic:200", f"--output={out}", "--runner=DirectRunner"])
    before = {p.name: p.read_bytes() for p in out.iterdir()} if earlier else {}
    proc = subprocess.Popen(
        [sys.executable, "-m", "pipeline", "--source=synthetic:200000", f"--output={out}",
         "--runner=DirectRunner", "--overwrite"], cwd=REPO, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True)
    try:
        for line in proc.stderr:
            if "into temporary folder" in line:
                break
        time.sleep(1.5)  # inside the Beam run
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 130, err[-3000:]
    assert "Traceback" not in err and err.strip().splitlines() == [err.strip()], err[-3000:]
    state = "the earlier dataset there is intact" if earlier else "no dataset was there"
    assert err.strip() == f"error: {out}: interrupted (SIGINT); {state}" + (
        "" if earlier else " before")
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before  # temp and lock gone
