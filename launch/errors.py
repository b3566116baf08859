"""How a launcher fails or stops: its exceptions, each with its exit status
(`mnist_common.console`), and the one line it prints.

A `ConfigError` (bad settings) is 2, a `RunFailure` (something the launch
ran failed, the wheel did not build) 1. A launcher stopped by SIGINT,
SIGTERM or SIGHUP exits 128 + N; while `launch.processes.run_command` runs
a child, the signal goes to the child first (`Stopped` carries its status).
"""

from __future__ import annotations

import signal
import sys

from mnist_common import console


class LaunchError(Exception):
    """The launch cannot go on; the message is one line, ``code`` the exit
    status (`mnist_common.console`)."""
    code = console.FAILURE


class ConfigError(LaunchError, ValueError):
    """A required setting is missing or invalid (bad input: exit 2)."""
    code = console.BAD_INPUT


class RunFailure(LaunchError):
    """Something the launch runs failed (a run-time failure: exit 1)."""
    code = console.FAILURE


class Stopped(Exception):
    """SIGINT, SIGTERM or SIGHUP stopped the launch; ``status`` is the exit
    status (128 + N, or a stopped child's own), ``reported``: the child
    already printed why it stopped."""

    def __init__(self, signum: int, status: int | None = None, reported: bool = False):
        super().__init__(signal.Signals(signum).name)
        self.signum = int(signum)
        self.status = console.stopped_by(signum) if status is None else status
        self.reported = reported

    def line(self, program: str) -> str:
        return f"error: {program}: stopped by {self}"


def fail(message: str, code: int) -> int:
    print(f"error: {message}", file=sys.stderr)
    return code


def stopped(exc: Stopped, program: str) -> int:
    """The one line of a launcher stopped by a signal (unless its child
    printed its own), and the exit status."""
    if not exc.reported:
        print(exc.line(program), file=sys.stderr, flush=True)
    return exc.status
