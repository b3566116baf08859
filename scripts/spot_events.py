"""What a spot run reports, and what a restarted launcher reads back.

Each event is one line on stdout (a UTC timestamp, the event, a message)
and, with ``--events=FILE``, one JSON object appended to that file. The file
is also the run's journal: a launcher started again with the same command
and file reads the events since the last ending (`replay`), so it goes on
counting recoveries where the killed one stopped and knows the hosts of the
VMs it deleted (their hold on the model_dir lock is taken over at once).
"""

from __future__ import annotations

import dataclasses
import json
import sys
import time
from pathlib import Path
from typing import Callable, TextIO

# Events that end a run: a journal starts after the last of them.
ENDING_EVENTS = frozenset({"finished", "failed", "gave up", "lost", "timeout",
                           "interrupted"})


class Events:
    """Prints each event and appends it to ``path`` (if any) as JSON."""

    def __init__(self, path: Path | None, clock: Callable[[], float] = time.time,
                 out: TextIO | None = None):
        self.path = path
        self.clock = clock
        self.out = out

    def emit(self, event: str, message: str, **fields) -> None:
        now = self.clock()
        stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now))
        print(f"{stamp} {event}: {message}", file=self.out or sys.stdout, flush=True)
        if self.path is None:
            return
        record = {"time": stamp, "unix": round(now, 3), "event": event,
                  "message": message, **fields}
        with open(self.path, "a", encoding="utf-8") as fh:
            fh.write(json.dumps(record, sort_keys=True) + "\n")


@dataclasses.dataclass
class Standing:
    """Where a run stands: its recoveries and the steps they cost.

    lost_noted: the VM's loss is counted and its recovery under way (a
    restarted launcher finishes it without counting it again).
    vm_hosts: hosts of the VM that exists; dead_hosts: hosts of deleted VMs.
    step_at_loss: the last step seen before the loss being recovered;
    redo: steps trained again after each preemption (None: not seen).
    trained_here: a trainer was started on the VM that exists; announced:
    the recoveries whose new trainer has started.
    """
    recoveries: int = 0
    lost_noted: bool = False
    vm_hosts: set = dataclasses.field(default_factory=set)
    dead_hosts: set = dataclasses.field(default_factory=set)
    last_step: int | None = None
    total: int | None = None
    step_at_loss: int | None = None
    awaiting_resume: bool = False
    redo: list = dataclasses.field(default_factory=list)
    trained_here: bool = False
    announced: int = 0

    def apply(self, record: dict) -> None:
        """Replays one journal event."""
        event = record.get("event")
        if event == "preempted":
            self.recoveries = int(record.get("recovery", self.recoveries + 1))
            self.lost_noted, self.step_at_loss = True, record.get("step")
            self.awaiting_resume = record.get("redo") is None
            self.redo.append(record.get("redo"))
        elif event == "deleted":
            self.dead_hosts |= self.vm_hosts
            self.vm_hosts = set()
        elif event == "created":
            self.lost_noted = self.trained_here = False
        elif event in ("training", "recovered"):
            self.trained_here = True
            self.vm_hosts = set(record.get("hosts", self.vm_hosts))
            self.last_step = record.get("step", self.last_step)
            self.announced = record.get("recovery", self.announced)
        elif event == "resumed" and self.redo:
            self.redo[-1] = record.get("redo")
            self.awaiting_resume = False

    def note_resume(self, resumed: int) -> int | None:
        """The steps trained again, once the new trainer says where it
        resumed (0 when it found no checkpoint)."""
        self.awaiting_resume = False
        if self.step_at_loss is None:
            return None
        redo = max(0, self.step_at_loss - resumed)
        if self.redo:
            self.redo[-1] = redo
        return redo


def replay(path: Path | None) -> Standing:
    """The `Standing` of the unfinished run that ``path`` records (a fresh
    one when there is no file, or its last event ends a run)."""
    progress = Standing()
    if path is None or not path.is_file():
        return progress
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue  # a line cut short by a kill
        if not isinstance(record, dict):
            continue
        if record.get("event") in ENDING_EVENTS:
            progress = Standing()
        else:
            progress.apply(record)
    return progress
