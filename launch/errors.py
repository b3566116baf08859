"""How a launcher fails or stops: its exceptions, each with its exit status
(`mnist_common.console`), and the one line it prints.

A `ConfigError` (bad settings) is 2, a `RunFailure` (something the launch
ran failed, the wheel did not build) 1. A launcher stopped by SIGINT,
SIGTERM or SIGHUP (`mnist_common.stop.Stopped`) exits 128 + N with the line
of `stopped`; while `launch.processes.run_command` runs a child, the signal
goes to the child first, and the stop carries its status (docs/launch.md,
"TPU VM").
"""

from __future__ import annotations

import sys

from mnist_common import console
from mnist_common.stop import Stopped


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


def fail(message: str, code: int) -> int:
    print(f"error: {message}", file=sys.stderr)
    return code


def stopped(exc: Stopped, program: str) -> int:
    """The one line of a launcher stopped by a signal (unless its child
    printed its own), and the exit status."""
    if not exc.reported:
        print(f"error: {program}: stopped by {exc.name}", file=sys.stderr, flush=True)
    return exc.exit_status
