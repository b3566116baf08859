"""``python -m trainer.predict`` stopped by Ctrl-C, SIGTERM or SIGHUP: one line
``error: predict: stopped by NAME`` and status 128+N (docs/README.md, "Exit
status"), whether the signal comes while TensorFlow loads or while it reads.

The command is made to wait for ever, deterministically: its export's id file
is a FIFO no one writes, so reading it blocks. The signal is sent once
TensorFlow's library is mapped into the process (its import has begun, after
the handlers are in place).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from tests.helpers import REPO
from trainer.run import outputs

pytestmark = pytest.mark.slow

START_BOUND_S = 300  # hang bound: TensorFlow starts loading within ~2 s on a quiet machine


def blocking_model_dir(root) -> str:
    """A model_dir whose export exists and whose id file blocks the reader."""
    export = root / "m" / outputs.EXPORT
    export.mkdir(parents=True)
    (export / "saved_model.pb").write_bytes(b"")
    os.mkfifo(export / outputs.EXPORT_ID_FILE)
    return str(root / "m")


def wait_for_tensorflow(proc: subprocess.Popen) -> None:
    """Returns once TensorFlow's shared library is mapped into ``proc``."""
    deadline = time.monotonic() + START_BOUND_S
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()
        with open(f"/proc/{proc.pid}/maps") as maps:
            if "libtensorflow" in maps.read():
                return
        time.sleep(0.05)
    pytest.fail(f"TensorFlow did not start loading within {START_BOUND_S} s")


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP])
def test_a_signal_is_one_line_and_128_plus_n(signum, tmp_path):
    (tmp_path / "digit.png").write_bytes(b"")  # a file: the paths pass the checks before TF
    proc = subprocess.Popen(
        [sys.executable, "-m", "trainer.predict", f"--model_dir={blocking_model_dir(tmp_path)}",
         str(tmp_path / "digit.png")], cwd=REPO, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True)
    try:
        wait_for_tensorflow(proc)
        proc.send_signal(signum)
        out, err = proc.communicate(timeout=120)  # hang bound: ends within a second
    finally:
        proc.kill()
    assert proc.returncode == 128 + signum, err[-3000:]
    assert err == f"error: predict: stopped by {signal.Signals(signum).name}\n"
    assert out == ""
