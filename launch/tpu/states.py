"""The trainer's state on a TPU VM's hosts, read from what the status script
(`launch.tpu.commands.status_script`) prints: each host's state and exit
status, the slice's one state, each host's progress, and what an exit status
means for the next step."""

from __future__ import annotations

import dataclasses
import re
import signal
from typing import Sequence

from launch.tpu.commands import STATUS_PREFIX
from mnist_common import console
from mnist_common.stop import STOP_SIGNALS

_STATUS_RE = re.compile(re.escape(STATUS_PREFIX) + r" (?P<state>running|"
                        r"exited status=(?P<code>\d+)|stopped|not started)")
# The rest of a status line: the trainer's progress, then the host.
_PROGRESS_RE = re.compile(re.escape(STATUS_PREFIX) + r" .*?(?: step=(?P<step>\d+)/"
                          r"(?P<total>\d+))?(?: resumed=(?P<resumed>\d+))? on "
                          r"(?P<host>\S+)$", re.MULTILINE)


# The trainer's exit status after a clean stop on a signal (trainer/run/preemption.py:
# 128 + the signal number): a checkpoint of that step is saved.
STOPPED_BY_SIGNAL = {console.stopped_by(s): signal.Signals(s).name for s in STOP_SIGNALS}


def exit_note(code: int) -> str:
    """What a trainer exit status means for the next step, "" if nothing to add."""
    signal_name = STOPPED_BY_SIGNAL.get(code)
    if signal_name is None:
        return ""
    return (f" (stopped by {signal_name}: preempted or interrupted, after saving a "
            "checkpoint; rerun the train step to resume)")


def parse_status(output: str) -> list[tuple[str, int | None]]:
    """``(state, exit status)`` per host from the status script's output.

    state: ``running``, ``exited``, ``stopped`` or ``not started``.
    """
    found = []
    for match in _STATUS_RE.finditer(output):
        state = match["state"]
        if state.startswith("exited"):
            found.append(("exited", int(match["code"])))
        else:
            found.append((state, None))
    return found


def summarize_status(states: Sequence[tuple[str, int | None]]
                     ) -> tuple[str, int]:
    """One state for the slice, and the exit code it maps to.

    Running anywhere means running (0). Otherwise the trainer's status: the
    first non-zero one among hosts that ran it, 1 if one stopped without a
    status, 1 when no host started a trainer at all.
    """
    if any(state == "running" for state, _ in states):
        return "running", 0
    ran = [(s, c) for s, c in states if s != "not started"]
    if not ran:
        return "not started", 1
    if any(state == "stopped" for state, _ in ran):
        return "stopped", 1
    codes = [c for _, c in ran if c]
    return "exited", codes[0] if codes else 0


@dataclasses.dataclass(frozen=True)
class Progress:
    """The trainer's progress on one host, as its status line reports it."""
    host: str
    step: int | None = None
    total: int | None = None
    resumed: int | None = None


def parse_progress(output: str) -> list[Progress]:
    """`Progress` per host from the status script's output."""
    found = []
    for match in _PROGRESS_RE.finditer(output):
        step, total, resumed = (int(match[k]) if match[k] else None
                                for k in ("step", "total", "resumed"))
        found.append(Progress(match["host"], step, total, resumed))
    return found
