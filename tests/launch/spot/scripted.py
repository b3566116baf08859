"""The spot run's loop (`spot_runner.SpotRun`) against a scripted cloud: VM
states, trainer states and call results from lists, a clock that moves only
when the run sleeps, and every wait the run asked for recorded."""

from __future__ import annotations

import dataclasses

from launch.tpu.spot import decide as sd
from launch.tpu.spot import events as spot_events
from launch.tpu.spot import journal as spot_journal
from launch.tpu.spot import runner as spot_runner
from launch.tpu import states as ts
from tests.helpers import with_defaults
from tests.launch.helpers import tpu_plan


class ScriptedCloud:
    """VM states and call results from lists; records the calls. Once the
    states run out, the VM is gone."""

    def __init__(self, states, trainers=(), creates=(), installs=(), budget=200):
        self.states, self.trainers = list(states), list(trainers)
        self.creates, self.installs = list(creates), list(installs)
        self.calls, self.budget = [], budget

    def call(self, name: str) -> None:
        """Records a call; a run that makes more than ``budget`` is stuck."""
        self.calls.append(name)
        if len(self.calls) > self.budget:
            raise AssertionError(f"more than {self.budget} calls: {self.calls[-12:]}")

    def vm_state(self):
        self.call("describe")
        return self.states.pop(0) if self.states else sd.GONE

    def trainer(self):
        self.call("status")
        return self.trainers.pop(0)

    def create(self):
        self.call("create")
        return self.creates.pop(0) if self.creates else (0, "", "")

    def build_wheel(self):
        self.call("build")

    def install(self):
        self.call("install")
        return self.installs.pop(0) if self.installs else (0, "", "")

    def start_trainer(self, dead_hosts):
        self.call(f"train dead={','.join(dead_hosts)}")
        return 0, "", ""

    def delete(self):
        self.call("delete")
        return 0, "", ""

    def fetch_log(self, dest):
        self.call("fetch log")
        return 0, "", ""


def loop(cloud, tmp_path, *flags, events=None, sleeps=None, out=None):
    """The run's exit status and what it printed. ``sleeps`` gets each wait
    it asked for; ``out``: a stream for its lines instead of a file."""
    cfg, _ = tpu_plan("run", *with_defaults(["--poll_seconds=1", "--retry_seconds=30"], flags))
    cfg = dataclasses.replace(cfg, events=events)
    now = [0.0]

    def sleep(seconds):
        if sleeps is not None:
            sleeps.append(seconds)
        now[0] += seconds
    journal, standing = (spot_journal.Journal.open(events, spot_journal.identity(cfg))
                         if events else (None, spot_events.Standing()))
    path = tmp_path / "out.txt"
    try:
        with open(path, "w") as fh:
            run = spot_runner.SpotRun(cfg, cloud, spot_events.Events(journal, out=out or fh),
                                      standing, clock=lambda: now[0], sleep=sleep)
            code = run.run()
    finally:
        if journal:
            journal.close()
    return code, out.getvalue() if out else path.read_text()


def progress(state, code=None, step=None, host="h1", resumed=None, total=66):
    return sd.Trainer(state, code), [ts.Progress(host, step, total, resumed)]


def kinds(out: str) -> list[str]:
    """The events a run printed, in order."""
    return [line.split(" ", 1)[1].split(":", 1)[0] for line in out.splitlines()]
