"""``launch_tpu_vm.py run``: a spot TPU run from start to result, through preemptions.

A loop in the manner of Orbit's controller: observe (`Cloud.observe`: the
VM's state, and the trainer's over ssh when the VM is READY), ask
`spot_decide.decide`, act, observe again. The actions:

create   ``tpu-vm create --spot`` (or a queued resource with ``--queued``);
         a stockout is retried with backoff.
setup    copy and install the project wheel (built once, here), then start
         the trainer detached (the ``setup`` and ``train`` steps' commands).
recover  the VM was preempted (or the trainer stopped on SIGTERM): delete
         it, wait until describe says it is gone, and let the next round
         create a new one; its trainer resumes from the newest checkpoint
         in the gs:// model_dir and takes over the dead VM's lock at once
         (`tpu_vm_commands.train_script`'s ``dead_hosts``).
wait     training, or the VM is being made, or a call failed (retried with
         backoff for at most ``--retry_seconds``).

There is one VM name, and a create happens only after describe said
NOT_FOUND, so there is never a second VM of the run; every ending deletes
the VM (``--keep`` keeps a READY one), Ctrl-C and SIGTERM included.
"""

from __future__ import annotations

import signal
import sys
import time
from typing import Callable

import spot_decide as sd
import tpu_vm_commands as tc
from spot_cloud import Cloud, create_failure, last_line
from spot_events import Events, Standing, replay

EXIT_INTERRUPTED = {signal.SIGINT: 130, signal.SIGTERM: 143}


class Interrupted(Exception):
    """The launcher got SIGTERM (SIGINT arrives as KeyboardInterrupt)."""


class RunError(Exception):
    """The run must end now with ``code``; the message is one line."""

    def __init__(self, code: int, message: str):
        super().__init__(message)
        self.code = code


class RunEnds:
    """A run's state and counts, and how it removes its VM and ends
    (`SpotRun` adds how it goes)."""

    def __init__(self, cfg: tc.TpuConfig, cloud: Cloud, events: Events,
                 standing: Standing, clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep):
        self.cfg, self.cloud, self.events, self.s = cfg, cloud, events, standing
        self.clock, self.sleep = clock, sleep
        self.started = clock()
        self.had_vm = False
        self.setup_rc: int | None = None
        self.failures, self.failing_since = 0, None
        self.wheel_built = False

    def _tally(self) -> sd.Tally:
        failing = 0.0 if self.failing_since is None else self.clock() - self.failing_since
        return sd.Tally(recoveries=self.s.recoveries - self.s.lost_noted,
                        max_recoveries=self.cfg.max_recoveries, had_vm=self.had_vm,
                        setup_rc=self.setup_rc, failing_seconds=failing,
                        retry_seconds=self.cfg.retry_seconds,
                        elapsed=self.clock() - self.started,
                        wait_timeout=self.cfg.wait_timeout)

    def _failed(self) -> None:
        self.failures += 1
        if self.failing_since is None:
            self.failing_since = self.clock()

    def _answered(self) -> None:
        self.failures, self.failing_since = 0, None

    def _remove(self) -> None:
        """Deletes the VM and returns once describe says it is gone; retried
        for ``--retry_seconds``, then `RunError` (255) naming the VM left."""
        deadline = self.clock() + self.cfg.retry_seconds
        failures = 0
        while True:
            state = self.cloud.vm_state()
            if state == sd.GONE:
                break
            if state != "DELETING":
                rc, out, err = self.cloud.delete()
                if rc == 0 or "NOT_FOUND" in err:
                    continue
                failures += 1
            if self.clock() > deadline:
                raise RunError(sd.EXIT_LOST, f"{self.cfg.name} could not be deleted in "
                               f"{self.cfg.retry_seconds:g} s (--retry_seconds); delete it "
                               "yourself: " + " ".join(tc.delete_commands(self.cfg)[0]))
            self.sleep(sd.backoff(failures, self.cfg.poll_seconds))
        self.s.dead_hosts |= self.s.vm_hosts
        self.s.vm_hosts, self.had_vm, self.setup_rc = set(), False, None
        self.events.emit("deleted", f"{self.cfg.name}", vm=self.cfg.name)

    def _end(self, decision: sd.Decision, vm: str) -> int:
        code = decision.code
        if decision.action == sd.FAIL and vm == sd.READY:
            self._fetch_log()
        usable = vm == sd.READY and decision.action != sd.GIVE_UP
        try:
            if not (self.cfg.keep and usable):
                self._remove()
        except RunError as exc:
            print(f"error: {exc}", file=sys.stderr)
            code = code or exc.code
        event = {sd.FINISH: "finished", sd.FAIL: "failed", sd.GIVE_UP: "gave up",
                 sd.LOST: "lost", sd.TIMEOUT: "timeout"}[decision.action]
        message = decision.why or "the trainer exited 0"
        if self.cfg.keep and usable:
            message += f"; {self.cfg.name} kept (--keep)"
        self.events.emit(event, f"{self.cfg.name}: {message}", exit=code)
        self._summary(code)
        if code:
            print(f"error: {self.cfg.name}: {message}", file=sys.stderr)
        return code

    def _fetch_log(self) -> None:
        dest = self.cfg.logs_dir / f"{self.cfg.name}-train.log"
        rc, out, err = self.cloud.fetch_log(dest)
        if rc == 0:
            print(f"the trainer's log: {dest}", file=sys.stderr)
        else:
            print(f"warning: the trainer's log was not copied ({last_line(err + out)})",
                  file=sys.stderr)

    def _interrupted(self, signum: int) -> int:
        """Ctrl-C or SIGTERM: deletes the VM (``--keep``: keeps it) with
        further signals ignored, so the VM is never left half handled."""
        code = EXIT_INTERRUPTED[signum]
        previous = {s: signal.signal(s, signal.SIG_IGN) for s in EXIT_INTERRUPTED}
        try:
            if not self.cfg.keep:
                print(f"{signal.Signals(signum).name}: deleting {self.cfg.name} before "
                      "exiting", file=sys.stderr, flush=True)
                self._remove()
        except RunError as exc:
            print(f"error: {exc}", file=sys.stderr)
        finally:
            for s, handler in previous.items():
                signal.signal(s, handler)
        self.events.emit("interrupted", f"{self.cfg.name}: stopped by "
                         f"{signal.Signals(signum).name}", exit=code)
        self._summary(code)
        return code

    def _summary(self, code: int) -> None:
        redo = ", ".join("?" if r is None else str(r) for r in self.s.redo) or "none"
        wall = self.clock() - self.started
        self.events.emit("summary", f"{self.s.recoveries} recoveries; steps trained "
                         f"again after each preemption: {redo}; wall time {wall:.0f} s; "
                         f"exit {code}", recoveries=self.s.recoveries, redo=self.s.redo,
                         wall_seconds=round(wall, 1), exit=code)


class SpotRun(RunEnds):
    """One spot run: observe, `spot_decide.decide`, act, until an ending."""

    def run(self) -> int:
        """The whole run; its exit status (`spot_decide`'s, or 130/143)."""
        try:
            return self._loop()
        except RunError as exc:
            return self._end(sd.Decision(sd.FAIL, exc.code, str(exc)), sd.UNKNOWN)
        except (KeyboardInterrupt, Interrupted) as exc:
            signum = signal.SIGINT if isinstance(exc, KeyboardInterrupt) else signal.SIGTERM
            return self._interrupted(signum)

    def _loop(self) -> int:
        while True:
            vm, trainer = self._observe()
            decision = sd.decide(vm, trainer, self._tally())
            if decision.action in sd.ENDINGS:
                return self._end(decision, vm)
            if decision.action == sd.WAIT:
                self.sleep(sd.backoff(self.failures, self.cfg.poll_seconds))
            elif decision.action == sd.CREATE:
                self._create()
            elif decision.action == sd.SETUP:
                self._setup()
            elif decision.action == sd.RECOVER:
                self._recover(decision)
            else:  # REPLACE: a queued resource that failed
                self.events.emit("replacing", f"{self.cfg.name}: {decision.why}")
                self._remove()

    # ------------------------------------------------------------ observe

    def _observe(self) -> tuple[str, sd.Trainer]:
        """The VM's state and, when it is READY, its trainer's; a failed
        describe or status check counts toward ``--retry_seconds``."""
        vm = self.cloud.vm_state()
        if vm == sd.UNKNOWN:
            self._failed()
            return vm, sd.Trainer(sd.UNASKED)
        if vm not in (sd.GONE, "DELETING"):
            self.had_vm = True
        if vm != sd.READY:
            self._answered()
            return vm, sd.Trainer(sd.UNASKED)
        trainer, progress = self.cloud.trainer()
        if trainer.state == sd.UNREACHABLE:
            self._failed()
            return vm, trainer
        self._answered()
        self.s.trained_here |= trainer.state != "not started"
        if progress:
            self._note_progress(progress)
        return vm, trainer

    def _note_progress(self, progress: list[tc.Progress]) -> None:
        """A ``training`` event when the step moved, ``resumed`` once the
        trainer of a recovery says where it resumed."""
        hosts = sorted({p.host for p in progress})
        steps = [p for p in progress if p.step is not None]
        if self.s.awaiting_resume and steps:
            resumed = max((p.resumed or 0) for p in steps)
            redo = self.s.note_resume(resumed)
            self.events.emit("resumed", f"{self.cfg.name}: resumed at step {resumed}; "
                             f"{'?' if redo is None else redo} step(s) trained again",
                             step=resumed, redo=redo)
        if not steps:
            self.s.vm_hosts |= set(hosts)
            return
        latest = max(steps, key=lambda p: p.step)
        if latest.step != self.s.last_step or set(hosts) - self.s.vm_hosts:
            self.s.vm_hosts |= set(hosts)
            self.s.last_step, self.s.total = latest.step, latest.total
            self.events.emit("training", f"{self.cfg.name}: step {latest.step}/"
                             f"{latest.total}", step=latest.step, total=latest.total,
                             hosts=sorted(self.s.vm_hosts))

    # ------------------------------------------------------------ actions

    def _create(self) -> None:
        rc, out, err = self.cloud.create()
        what = "queued resource" if self.cfg.queued else "spot VM" if self.cfg.spot else "VM"
        if rc == 0:
            self._answered()
            self.setup_rc, self.s.lost_noted, self.s.trained_here = None, False, False
            self.events.emit("created", f"{self.cfg.name}: {what} "
                             f"{self.cfg.accelerator_type} in {self.cfg.zone}", vm=self.cfg.name)
            return
        kind = create_failure(err + out)
        if kind == "permanent":
            raise RunError(1, f"creating {self.cfg.name} failed: {last_line(err + out)}")
        self._failed()
        self.events.emit("no capacity" if kind == "stockout" else "create failed",
                         f"{self.cfg.name}: {last_line(err + out)}; trying again in "
                         f"{sd.backoff(self.failures, self.cfg.poll_seconds):g} s")
        self.sleep(sd.backoff(self.failures, self.cfg.poll_seconds))

    def _setup(self) -> None:
        """Installs on the VM and starts the trainer; a failure is kept in
        ``setup_rc`` for `decide` (255: ssh could not reach the VM, retried)."""
        if not self.wheel_built:
            self.cloud.build_wheel()
            self.wheel_built = True
        rc, out, err = self.cloud.install()
        if rc == 0:
            self.events.emit("set up", f"{self.cfg.name}: TensorFlow and the project "
                             "installed")
            rc, out, err = self.cloud.start_trainer(sorted(self.s.dead_hosts))
        self.setup_rc = rc or None
        if rc == 0:
            self._answered()
            self._started()
        elif rc == sd.EXIT_LOST:
            self._failed()
            self.events.emit("ssh failed", f"{self.cfg.name}: {last_line(err or out)}")
            self.sleep(sd.backoff(self.failures, self.cfg.poll_seconds))
        else:
            print(f"{(err + out).strip()[-3000:]}", file=sys.stderr)

    def _started(self) -> None:
        self.s.trained_here = True
        if self.s.recoveries > self.s.announced:
            self.s.announced = self.s.recoveries
            self.events.emit("recovered", f"{self.cfg.name}: training again "
                             f"({self.s.recoveries} of {self.cfg.max_recoveries})",
                             recovery=self.s.recoveries)
        else:
            self.events.emit("training", f"{self.cfg.name}: trainer started",
                             step=self.s.last_step)

    def _recover(self, decision: sd.Decision) -> None:
        """Deletes the lost VM and waits until it is gone; the next round
        creates the new one. A VM lost before its trainer started cost no
        steps; otherwise the new trainer's resume step tells how many."""
        if not self.s.lost_noted:
            self.s.recoveries += 1
            self.s.lost_noted, self.s.step_at_loss = True, self.s.last_step
            self.s.awaiting_resume = self.s.trained_here
            redo = None if self.s.trained_here else 0
            self.s.redo.append(redo)
            where = (f"at step {'?' if self.s.last_step is None else self.s.last_step}"
                     if self.s.trained_here else "before its trainer started")
            self.events.emit("preempted", f"{self.cfg.name}: {decision.why}; preempted "
                             f"{where}", step=self.s.last_step, redo=redo,
                             recovery=self.s.recoveries)
        self._remove()

def _raise_interrupted(signum, frame):
    raise Interrupted()


def run_spot(cfg: tc.TpuConfig, cloud: Cloud) -> int:
    """``run`` with real gcloud calls: SIGTERM stops it as Ctrl-C does, and
    a killed launcher's run is taken up from the ``--events`` journal."""
    previous = signal.signal(signal.SIGTERM, _raise_interrupted)
    try:
        return SpotRun(cfg, cloud, Events(cfg.events), replay(cfg.events)).run()
    finally:
        signal.signal(signal.SIGTERM, previous)
