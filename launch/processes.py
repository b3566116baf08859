"""The commands a launcher runs, and the stop signals meanwhile.

Every launcher turns its settings into a list of argv lists first, so tests
can check the exact commands without running anything, and ``--dry_run``
prints them with ``shlex.join`` (`format_commands`). `run_command` shows
and runs one; a SIGINT, SIGTERM or SIGHUP while it runs goes to the child
first, and `mnist_common.stop.Stopped` is raised once it ended.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import subprocess
import sys
from pathlib import Path
from typing import Iterable, Iterator, Sequence

from mnist_common.stop import Stopped, on_stop_signals


Command = list[str]


@contextlib.contextmanager
def raising_on_signals() -> Iterator[None]:
    """Inside the block SIGINT, SIGTERM and SIGHUP raise `Stopped`, so the
    launcher's ``finally`` blocks run (``all --delete_after`` deletes the
    VM) before it exits 128 + N; a child that `run_command` runs then gets
    the signal instead (`forwarding_signals`). Outside the main thread, or
    for a signal the process was started ignoring, nothing changes."""
    def handle(signum, frame):
        raise Stopped(signum)
    with on_stop_signals(handle):
        yield


class _Child:
    """The child `run_command` runs, and the first stop signal that came."""

    def __init__(self):
        self.proc: subprocess.Popen | None = None
        self.signum = 0

    def forward(self, signum, frame) -> None:
        """Passes SIGTERM and SIGHUP on to the child, which stops as it stops
        on one (the pipeline keeps nothing half written and exits 128 + N).
        SIGINT is only noted: a Ctrl-C at the terminal reaches the child as
        well, and a second one may cut its own stopping short."""
        self.signum = self.signum or signum
        if signum == signal.SIGINT:
            return
        if self.proc is not None and self.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.proc.pid, signum)

    def status(self, rc: int) -> int:
        """``rc``, or, when a signal came while the child ran, raises
        `Stopped`: with the child's own non-zero status (it said why it
        stopped or failed), else 128 + N."""
        if not self.signum:
            return rc
        if rc > 0:
            raise Stopped(self.signum, exit_status=rc, reported=True)
        raise Stopped(-rc if rc < 0 else self.signum)


def _run_child(cmd: Sequence[str], cwd: Path | None, **popen) -> tuple[int, str]:
    """Runs ``cmd`` with SIGTERM and SIGHUP passed on to it and SIGINT noted
    (`_Child.forward`); its exit status and captured stdout (if piped)."""
    child = _Child()
    with on_stop_signals(child.forward):
        child.proc = subprocess.Popen(list(cmd), cwd=cwd, **popen)
        if child.signum:  # came before the child was there to take it
            child.forward(child.signum, None)
        out, _ = child.proc.communicate()
    return child.status(child.proc.returncode), out or ""


def format_commands(commands: Iterable[Sequence[str]]) -> str:
    return "\n".join(shlex.join(list(cmd)) for cmd in commands)


def run_command(cmd: Sequence[str], cwd: Path | None = None) -> int:
    """Shows and runs ``cmd``; its exit status. A stop signal meanwhile goes
    to it, and then `Stopped` is raised once it ended."""
    print("+ " + shlex.join(list(cmd)), file=sys.stderr, flush=True)
    try:
        return _run_child(cmd, cwd)[0]
    except FileNotFoundError:
        print(f"error: {cmd[0]}: command not found", file=sys.stderr)
        return 127


def run_command_output(cmd: Sequence[str],
                       cwd: Path | None = None) -> tuple[int, str]:
    """Like ``run_command``, but return stdout (as text) instead of showing it."""
    print("+ " + shlex.join(list(cmd)), file=sys.stderr, flush=True)
    try:
        return _run_child(cmd, cwd, stdout=subprocess.PIPE, text=True, errors="replace")
    except FileNotFoundError:
        print(f"error: {cmd[0]}: command not found", file=sys.stderr)
        return 127, ""
