"""SIGINT, SIGTERM and SIGHUP stop the job: one line, exit 128+N, lock and temp folder gone.

A real ``python -m pipeline`` gets the signal while Beam runs, under each
local running mode, sent to its pid or (as a terminal's Ctrl-C does) to its
whole process group, where Beam's worker processes get it too. Or it is held
at a step (`pipeline.faults` ``wait``) and gets the signal there: before the
publish, the output is as it was; once the publish has begun, it is
completed first. Either way the lines before the signal are the run's log,
the last one says what the output holds, and no worker process is left.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from pipeline.stop import descendants
from pipeline.verify import verify
from tests.helpers import REPO, alive, run_job

pytestmark = pytest.mark.slow

TIMEOUT_S = 90  # a stopped job ends in seconds; a hung one fails the test here


class Job:
    """A ``python -m pipeline`` in its own process group, its stderr read as it comes."""

    def __init__(self, argv, env=None):
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "pipeline", *argv], cwd=REPO, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, text=True, start_new_session=True,
            env={**os.environ, **(env or {})})
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.proc.stderr:
            self.lines.append(line.rstrip("\n"))

    def wait_for_line(self, text: str) -> None:
        deadline = time.monotonic() + TIMEOUT_S
        while not any(text in line for line in self.lines):
            assert self.proc.poll() is None, "\n".join(self.lines[-30:])
            assert time.monotonic() < deadline, "\n".join(self.lines[-30:])
            time.sleep(0.05)

    def signal(self, signum: int, group: bool) -> list[int]:
        """Sends ``signum``; returns the job's worker processes at that moment."""
        workers = descendants(self.proc.pid)
        if group:
            os.killpg(self.proc.pid, signum)
        else:
            self.proc.send_signal(signum)
        return workers

    def finish(self) -> tuple[int, list[str]]:
        try:
            self.proc.wait(timeout=TIMEOUT_S)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
            pytest.fail("the job did not end after the signal:\n" + "\n".join(self.lines[-30:]))
        self._reader.join(10)
        return self.proc.returncode, self.lines


def contents(folder: Path) -> dict:
    return {p.name: p.read_bytes() for p in folder.iterdir()} if folder.exists() else {}


def check_one_line(lines: list[str], expected: str) -> None:
    """The last line is ``expected``; every other line is a log line of the run."""
    assert lines and lines[-1] == expected, "\n".join(lines[-40:])
    for line in lines[:-1]:
        assert line[:2] == "20" and " ERROR " not in line, "\n".join(lines[-40:])


@pytest.mark.parametrize("signum,group,mode,delay,earlier", [
    (signal.SIGINT, False, "in_memory", 1.5, True),
    (signal.SIGTERM, False, "in_memory", 1.5, True),
    # Beam starting its worker processes, then the workers encoding.
    (signal.SIGINT, False, "multi_processing", 0.5, False),
    (signal.SIGINT, False, "multi_processing", 4, False),
    (signal.SIGINT, True, "multi_processing", 0.5, False),
    (signal.SIGINT, True, "multi_processing", 4, True),
    (signal.SIGTERM, False, "multi_processing", 4, True),
    (signal.SIGHUP, True, "multi_processing", 0.5, False),
    (signal.SIGTERM, True, "multi_threading", 2, False),
], ids=lambda v: getattr(v, "name", None) or str(v))
def test_signal_while_beam_runs(tmp_path, signum, group, mode, delay, earlier):
    out = tmp_path / "out"
    if earlier:
        run_job(["--source=synthetic:200", f"--output={out}", "--runner=DirectRunner"])
    before = contents(out)
    job = Job(["--source=synthetic:400000", f"--output={out}", "--runner=DirectRunner",
               "--overwrite", f"--direct_running_mode={mode}", "--direct_num_workers=2"])
    job.wait_for_line("into temporary folder")
    time.sleep(delay)
    workers = job.signal(signum, group)
    status, lines = job.finish()
    assert status == 128 + signum, "\n".join(lines[-40:])
    state = "the earlier dataset there is intact" if earlier else "no dataset was there before"
    check_one_line(lines, f"error: {out}: interrupted ({signum.name}); {state}")
    assert contents(out) == before  # temp folder and lock gone, the earlier dataset as it was
    assert not [pid for pid in workers if alive(pid)]


def hold_at(tmp_path, point: str, signum: int) -> tuple[int, list[str], Path, dict]:
    """Runs the job over an earlier dataset, holds it at ``point``, sends ``signum``
    there, then lets it go on; (status, stderr lines, output, earlier contents)."""
    out = tmp_path / "out"
    run_job(["--source=synthetic:300", f"--output={out}", "--runner=DirectRunner"])
    before = contents(out)
    gate = tmp_path / "gate"
    job = Job(["--source=synthetic:2000", f"--output={out}", "--runner=DirectRunner",
               "--overwrite", "--min_shards=2", "--allow_extreme_sharding"],
              env={"PIPELINE_FAULT": f"wait@{point}", "PIPELINE_FAULT_GATE": str(gate)})
    deadline = time.monotonic() + TIMEOUT_S
    while not Path(f"{gate}.reached").exists():
        assert job.proc.poll() is None and time.monotonic() < deadline, \
            "\n".join(job.lines[-30:])
        time.sleep(0.02)
    job.signal(signum, group=False)
    time.sleep(0.3)
    gate.touch()
    status, lines = job.finish()
    return status, lines, out, before


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP],
                         ids=lambda s: s.name)
def test_signal_before_the_publish_leaves_the_output_as_it_was(tmp_path, signum):
    status, lines, out, before = hold_at(tmp_path, "locked", signum)
    assert status == 128 + signum
    check_one_line(lines, f"error: {out}: interrupted ({signum.name}); nothing was written")
    assert contents(out) == before


@pytest.mark.parametrize("point", ["journal-written", "moved:mnist-train.tfrecord-00000-*",
                                   "journal-deleted"])
def test_signal_during_the_publish_completes_it_first(tmp_path, point):
    status, lines, out, _ = hold_at(tmp_path, point, signal.SIGTERM)
    assert status == 143, "\n".join(lines[-30:])
    check_one_line(lines, f"error: {out}: interrupted (SIGTERM); the publish had begun and "
                          "was completed first: the output holds the new dataset")
    assert verify(str(out)).split("train").num_examples == 2000
    assert not [n for n in os.listdir(out) if n.startswith(".")]  # no lock, temp or journal
