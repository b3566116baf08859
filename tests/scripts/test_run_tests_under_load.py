"""``scripts/run_tests.sh --under-load``: a busy loop per core beside pytest,
all of them gone when the script ends, pytest's exit status passed on.

Only the mechanics are checked (how many loops, which arguments reach
pytest, what is left afterwards, the status), never a time. Each run is a
session of its own, so what it leaves behind is found by its session id.
"""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.helpers import REPO
from tests.launch.helpers import SCRIPTS, clean_env, fake_program

pytestmark = pytest.mark.skipif(not os.path.isdir("/proc"), reason="reads /proc")

RUN_TESTS = str(SCRIPTS / "run_tests.sh")
# A hang bound, not a speed bar: the stand-in pytest starts in well under a
# second on a quiet machine.
START_BOUND_S = 60


def stat_fields(pid: str) -> list[str]:
    """/proc/PID/stat after the command name: state, ppid, pgrp, session, ..."""
    with open(f"/proc/{pid}/stat", "rb") as f:
        return f.read().rsplit(b")", 1)[1].decode().split()


def processes(field: int, value: int) -> list[int]:
    """The live processes whose /proc stat ``field`` (after the command name) is ``value``."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            fields = stat_fields(pid)
        except (FileNotFoundError, ProcessLookupError):
            continue  # ended meanwhile
        if fields[field] == str(value) and fields[0] != "Z":
            found.append(int(pid))
    return found


def children(pid: int) -> list[int]:
    return processes(1, pid)


def left_in_session(sid: int) -> list[int]:
    """The script's processes (itself, its busy loops) still alive in session
    ``sid``. A stand-in pytest's own ``sleep``, signalled with the group, may
    not have been scheduled to die yet on a loaded machine: not the script's."""
    def command(pid: int) -> bytes:
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                return f.read()
        except (FileNotFoundError, ProcessLookupError):
            return b""
    return [pid for pid in processes(3, sid) if RUN_TESTS.encode() in command(pid)]


def nproc() -> int:
    return int(subprocess.run(["nproc"], capture_output=True, text=True, check=True).stdout)


def start_held(tmp_path: Path, *args: str) -> tuple[subprocess.Popen, Path, dict]:
    """run_tests.sh --under-load with a stand-in pytest that records its pid,
    its parent's and its arguments, then waits for ``release`` and exits
    with the status written there (2 on SIGINT or SIGTERM); the script, the
    release file and the record."""
    record, release = tmp_path / "record", tmp_path / "release"
    # Like pytest, the stand-in catches SIGINT and SIGTERM and exits with its
    # own status (2). Left to bash's default, a signal that lands just as its
    # ``sleep`` exits is taken as handled by the child and the loop goes on.
    fake = fake_program(tmp_path / "python", f"""
[ "$1" = -c ] && exit 1  # no pytest-xdist
trap 'exit 2' INT TERM
printf '%s\\n' "$$" "$PPID" "$*" > {shlex.quote(str(record))}.tmp
mv {shlex.quote(str(record))}.tmp {shlex.quote(str(record))}
until [ -f {shlex.quote(str(release))} ]; do sleep 0.05; done
exit "$(cat {shlex.quote(str(release))})"
""")
    proc = subprocess.Popen(["bash", RUN_TESTS, *args], env=clean_env(PYTHON=str(fake)),
                            start_new_session=True)
    deadline = time.monotonic() + START_BOUND_S
    while not record.exists():
        assert proc.poll() is None, proc.returncode
        assert time.monotonic() < deadline, "the stand-in pytest never started"
        time.sleep(0.02)
    own, parent, argv = record.read_text().splitlines()
    return proc, release, {"pid": int(own), "parent": int(parent), "argv": argv}


def test_a_busy_loop_per_core_runs_beside_pytest_and_none_outlives_it(tmp_path):
    proc, release, seen = start_held(tmp_path, "--under-load", "-x", "tests/x.py")
    try:
        assert seen["parent"] == proc.pid  # pytest runs in the script's own process
        assert seen["argv"] == "-m pytest -q -x tests/x.py"  # --under-load not passed on
        busy = [pid for pid in children(proc.pid) if pid != seen["pid"]]
        assert len(busy) == nproc(), busy
        release.write_text("7")
        assert proc.wait(timeout=START_BOUND_S) == 7  # pytest's status
    finally:
        release.write_text("7")
        proc.kill()
    assert left_in_session(proc.pid) == []


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=lambda s: s.name)
def test_a_signal_to_the_run_stops_every_busy_loop(tmp_path, signum):
    """Ctrl-C reaches the whole process group, whose background loops ignore
    SIGINT: the script's trap stops them; its status is 128+N."""
    proc, release, _ = start_held(tmp_path, "--under-load")
    try:
        os.killpg(proc.pid, signum)
        assert proc.wait(timeout=START_BOUND_S) == 128 + signum
    finally:
        release.write_text("0")
        proc.kill()
    assert left_in_session(proc.pid) == []


@pytest.mark.parametrize("target, status", [("tests/test_packaging.py", 0),
                                            ("tests/no_such_file.py", 4)])
def test_real_pytest_under_load(target, status):
    """pytest itself (collection only): its output and its exit status, 4 for
    a path that is not there."""
    proc = subprocess.Popen(
        ["bash", RUN_TESTS, "--under-load", "--collect-only", "-q", target], cwd=REPO,
        env=clean_env(PYTHON=sys.executable, TEST_WORKERS="0"), stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True, start_new_session=True)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == status, out + err
    if status == 0:
        assert re.search(r"^tests/test_packaging\.py: \d+$", out, re.M), out
    else:
        assert f"file or directory not found: {target}" in err + out
    assert left_in_session(proc.pid) == []
