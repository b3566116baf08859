"""What a spot run reports, and what a restarted launcher reads back.

Each event is one line on stdout (a UTC timestamp, the event, a message)
and, with ``--events=FILE``, one JSON object appended to that file. The file
is also the run's journal (`spot_journal`): a launcher started again with
the same command and file reads the events since the last ending
(`replay`), so it goes on counting recoveries where the killed one stopped
and knows the hosts of the VMs it lost (their hold on the model_dir lock is
taken over at once).
"""

from __future__ import annotations

import dataclasses
import sys
import time
from typing import Callable, Iterable, Protocol, TextIO

from launch.tpu.spot import decide as sd

# Control characters as escapes: an event is one line whatever it names.
ONE_LINE = {c: repr(chr(c))[1:-1] for c in (*range(32), 127)}
# Events that end a run: a journal starts after the last of them.
ENDING_EVENTS = frozenset({"finished", "failed", "gave up", "lost", "timeout",
                           "interrupted"})


class Sink(Protocol):
    def append(self, record: dict) -> None: ...


class Events:
    """Prints each event, its control characters escaped (one line whatever
    a setting holds), and appends it to ``journal`` (if any) as JSON. A
    journal that can no longer be written (a full disk) is a warning, once:
    the run goes on, and a restarted launcher would miss what came after."""

    def __init__(self, journal: Sink | None, clock: Callable[[], float] = time.time,
                 out: TextIO | None = None):
        self.journal = journal
        self.clock = clock
        self.out = out

    def emit(self, event: str, message: str, **fields) -> None:
        now = self.clock()
        stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now))
        print(f"{stamp} {event}: {message.translate(ONE_LINE)}", file=self.out or sys.stdout,
              flush=True)
        if self.journal is None:
            return
        try:
            self.journal.append({"time": stamp, "unix": round(now, 3), "event": event,
                                 "message": message, **fields})
        except OSError as exc:
            print(f"warning: the journal was not written from here on ({exc})",
                  file=sys.stderr, flush=True)
            self.journal = None


@dataclasses.dataclass
class Standing:
    """Where a run stands: its recoveries and the steps they cost.

    lost_noted: the VM's loss is counted and its recovery under way (a
    restarted launcher finishes it without counting it again).
    vm_hosts: hosts of the VM that exists; dead_hosts: hosts of lost or
    deleted VMs. seen_here: the last step seen on this VM's trainer (None:
    none yet). step_at_loss, stopped_cleanly: the last step seen before the
    loss being recovered, and whether that trainer stopped on SIGTERM (it
    saved at that step). redo: a `spot_decide.Redo` per preemption (None:
    the new trainer's resume step not seen yet). trained_here: a trainer
    was started on the VM that exists; announced: the recoveries whose new
    trainer has started. run: the ``started`` event's identity of the run
    (`spot_journal.identity`), and its journal line; vm_named: the first VM
    name an event of the run names, and its line. events: the run's events
    so far (0: a run not begun); first_line: the line of its first.
    """
    recoveries: int = 0
    lost_noted: bool = False
    lost_unrecovered: bool = False
    vm_hosts: set = dataclasses.field(default_factory=set)
    dead_hosts: set = dataclasses.field(default_factory=set)
    last_step: int | None = None
    total: int | None = None
    seen_here: int | None = None
    step_at_loss: int | None = None
    stopped_cleanly: bool = False
    awaiting_resume: bool = False
    redo: list = dataclasses.field(default_factory=list)
    trained_here: bool = False
    announced: int = 0
    run: dict | None = None
    run_line: int = 0
    vm_named: tuple[str, int] | None = None
    events: int = 0
    first_line: int = 0

    def apply(self, record: dict) -> None:
        """Replays one journal event (`spot_journal` checked its fields)."""
        event = record["event"]
        if event == "preempted":
            self._lost(record)
        elif event in ("deleted", "gone"):
            self.forget_vm()
        elif event == "created":
            self.lost_noted = self.lost_unrecovered = self.trained_here = False
            self.seen_here = None
        elif event in ("training", "recovered"):
            self.trained_here = True
            self.vm_hosts = set(record.get("hosts", self.vm_hosts))
            if record.get("step") is not None:
                self.last_step = self.seen_here = record["step"]
            self.total = record.get("total", self.total)
            self.announced = record.get("recovery", self.announced)
        elif event == "resumed" and self.redo and record.get("redo") is not None:
            self.redo[-1] = sd.Redo(*record["redo"])
            self.awaiting_resume = False

    def _lost(self, record: dict) -> None:
        self.forget_vm()
        if record.get("recovery") is None:  # not recovered: the run gives up
            self.lost_unrecovered = True
            return
        self.recoveries = record["recovery"]
        self.lost_noted, self.step_at_loss = True, record.get("step")
        self.stopped_cleanly = bool(record.get("stopped_cleanly"))
        redo = record.get("redo")
        self.awaiting_resume = redo is None
        self.redo.append(None if redo is None else sd.Redo(*redo))

    def forget_vm(self) -> None:
        """The VM's hosts are dead: lost, or deleted."""
        self.dead_hosts |= self.vm_hosts
        self.vm_hosts = set()

    def note_resume(self, resumed: int, gap: int | None) -> sd.Redo:
        """The steps trained again, once the new trainer says where it
        resumed (0 when it found no checkpoint)."""
        self.awaiting_resume = False
        redo = sd.redo_after(self.step_at_loss, resumed, self.stopped_cleanly, gap)
        if self.redo:
            self.redo[-1] = redo
        return redo

    def redo_known(self, gap: int | None) -> list[sd.Redo]:
        """Each preemption's `spot_decide.Redo`; one whose new trainer was
        not seen resuming is bounded by the checkpoint gap alone."""
        return [sd.Redo(0, gap) if r is None else r for r in self.redo]


def replay(records: Iterable[tuple[int, dict]]) -> Standing:
    """The `Standing` of the unfinished run that the journal's ``(line,
    record)`` pairs record (a fresh one when its last event ends a run)."""
    progress = Standing()
    for line, record in records:
        if record["event"] in ENDING_EVENTS:
            progress = Standing()
            continue
        if record["event"] == "summary":  # the last word of the run that ended
            continue
        progress.events += 1
        progress.first_line = progress.first_line or line
        if record["event"] == "started" and progress.run is None:
            progress.run, progress.run_line = record.get("run"), line
        if "vm" in record and progress.vm_named is None:
            progress.vm_named = record["vm"], line
        progress.apply(record)
    return progress
