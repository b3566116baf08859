"""``mnist-launch-tpu run``: a spot TPU run from start to result, through preemptions.

A loop in the manner of Orbit's controller: observe (`RunObserves._observe`: the
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
         (`launch.tpu.commands.train_script`'s ``dead_hosts``).
wait     training, or the VM is being made, or a call failed (retried with
         backoff for at most ``--retry_seconds``).

There is one VM name, and a create happens only after describe said
NOT_FOUND, so there is never a second VM of the run; what it creates is
labelled with the run's id, and a VM of the name without it is another's,
left as it is (`launch.tpu.cloud.NotThisRun`, exit 2); every ending deletes
the VM (``--keep`` keeps a READY one), Ctrl-C, SIGTERM and SIGHUP included
(`mnist_common.stop.Stopped`; docs/launch.md, "Spot runs: `run`"). A run
ends once: from the moment it ends, signals are ignored (the VM is being
deleted), so it reports one ending and one summary.
"""

from __future__ import annotations

import dataclasses
import signal
import sys
import time
from contextlib import contextmanager
from typing import Callable, Iterator

from launch import errors as le
from mnist_common import console
from mnist_common.stop import Stopped, on_stop_signals
from launch.tpu.spot import decide as sd
from launch.tpu import commands as tc
from launch.tpu.config import TpuConfig
from launch.tpu import states as ts
from launch.tpu.cloud import Cloud, NotThisRun, create_failure, last_line
from launch.tpu.spot.events import Events, Standing
from launch.tpu.spot.journal import Journal, JournalError, identity


class RunError(Exception):
    """The run must end now with ``code``; the message is one line."""

    def __init__(self, code: int, message: str):
        super().__init__(message)
        self.code = code


def trainer_cadence(cfg: TpuConfig) -> tuple[int, int, int, bool] | None:
    """The trainer's epochs, ``--checkpoint_every``, steps per call and
    whether it runs the Keras loop, from its own flags (None: unreadable)."""
    from trainer.config import flag_problem, parse_flags
    argv = tc.trainer_command(cfg)[3:]
    if flag_problem(argv, on_tpu=True):
        return None
    config = parse_flags(argv, on_tpu=lambda _: True)
    return (config.epochs, config.checkpoint_every, config.steps_per_execution,
            config.loop == "keras")


class RunCounts:
    """A run's state and counts (`RunEnds` adds how it removes its VM and
    ends, `RunObserves` what it sees, `SpotRun` how it goes)."""

    def __init__(self, cfg: TpuConfig, cloud: Cloud, events: Events,
                 standing: Standing, clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep):
        self.cfg, self.cloud, self.events, self.s = cfg, cloud, events, standing
        self.clock, self.sleep = clock, sleep
        self.started = clock()
        self.had_vm = False
        self.setup_rc: int | None = None
        self.failures, self.failing_since = 0, None  # describe and ssh calls
        self.refusals, self.refused_since = 0, None  # creates
        # A create or a trainer start that answered done, and whose VM or
        # trainer no describe or status check has shown since.
        self.created_unseen = self.started_unseen = False
        # When the last removal saw describe say gone, and the removals
        # asked for since then with no create between.
        self.removed_at, self.removals = None, 0
        self.wheel_built = False
        self.ending = False
        self.cadence = trainer_cadence(cfg)

    def _tally(self) -> sd.Tally:
        def since(start):
            return 0.0 if start is None else self.clock() - start
        return sd.Tally(recoveries=self.s.recoveries - self.s.lost_noted,
                        max_recoveries=self.cfg.max_recoveries, had_vm=self.had_vm,
                        setup_rc=self.setup_rc, failing_seconds=since(self.failing_since),
                        refused_seconds=since(self.refused_since),
                        retry_seconds=self.cfg.retry_seconds,
                        elapsed=self.clock() - self.started,
                        wait_timeout=self.cfg.wait_timeout, queued=self.cfg.queued)

    def _failed(self) -> None:
        self.failures += 1
        if self.failing_since is None:
            self.failing_since = self.clock()

    def _answered(self) -> None:
        self.failures, self.failing_since = 0, None

    def _gap(self) -> int | None:
        """The most steps between two of the trainer's checkpoints."""
        if self.cadence is None:
            return None
        return sd.checkpoint_gap(self.s.total, *self.cadence)


class RunEnds(RunCounts):
    """How a run removes its VM and ends, once and with one summary."""

    def _remove(self) -> None:
        """Deletes the VM and returns once describe says it is gone; retried
        for ``--retry_seconds``, then `RunError` (255) naming the VM left.
        A delete that answers done is followed by one describe at once; a
        VM still there then waits a backoff before the next delete, so a
        cloud that answers done and keeps the VM is not asked in a tight
        loop. ``deleted`` is reported only when there was a VM to delete."""
        deadline = self.clock() + self.cfg.retry_seconds
        failures, existed, done = 0, False, False
        while True:
            state = self.cloud.vm_state()
            if state == sd.GONE:
                break
            existed = existed or state != sd.UNKNOWN
            if self.clock() > deadline:
                raise RunError(console.LOST, f"{self.cfg.name} could not be deleted in "
                               f"{self.cfg.retry_seconds:g} s (--retry_seconds); delete it "
                               "yourself: " + " ".join(tc.delete_commands(self.cfg)[0]))
            if state != "DELETING" and not done:
                rc, out, err = self.cloud.delete()
                existed = existed or rc == 0
                done = rc == 0 or "NOT_FOUND" in err
                failures += not done
                if done:  # gcloud's delete waits for the operation: look at once
                    continue
            done = False
            self.sleep(sd.backoff(failures, self.cfg.poll_seconds))
        self.s.forget_vm()
        self.had_vm, self.setup_rc = False, None
        if self.removed_at is None:
            self.removed_at = self.clock()
        if existed:
            self.events.emit("deleted", f"{self.cfg.name}", vm=self.cfg.name)

    def _end(self, decision: sd.Decision, vm: str, trainer: sd.Trainer) -> int:
        self.ending = True
        code = decision.code
        if decision.action == sd.GIVE_UP and not self.s.lost_unrecovered:
            self._note_loss(decision, vm, trainer, recovering=False)
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
        if decision.code:  # else the delete failed, which said so
            print(f"error: {self.cfg.name}: {message}", file=sys.stderr)
        return code

    def _fetch_log(self) -> None:
        dest = self.cfg.logs_dir / f"{self.cfg.name}-train.log"
        try:
            rc, out, err = self.cloud.fetch_log(dest)
        except OSError as exc:
            rc, out, err = 1, "", f"{dest.parent}: {exc.strerror}"
        if rc == 0:
            print(f"the trainer's log: {dest}", file=sys.stderr)
        else:
            print(f"warning: the trainer's log was not copied ({last_line(err + out)})",
                  file=sys.stderr)

    def _interrupted(self, signum: int) -> int:
        """Ctrl-C, SIGTERM or SIGHUP: deletes the VM (``--keep``: keeps it);
        further signals are ignored (`ending`), so the VM is never left
        half handled."""
        self.ending = True
        code = console.stopped_by(signum)
        name = signal.Signals(signum).name
        try:
            if not self.cfg.keep:
                print(f"{name}: deleting {self.cfg.name} before exiting",
                      file=sys.stderr, flush=True)
                self._remove()
        except RunError as exc:
            print(f"error: {exc}", file=sys.stderr)
        self.events.emit("interrupted", f"{self.cfg.name}: stopped by {name}", exit=code)
        self._summary(code)
        return code

    def _summary(self, code: int) -> None:
        redo = self.s.redo_known(self._gap())
        wall = self.clock() - self.started
        self.events.emit("summary", f"{self.s.recoveries} recoveries; steps trained "
                         f"again after each preemption: "
                         f"{', '.join(r.text() for r in redo) or 'none'}; wall time "
                         f"{wall:.0f} s; exit {code}", recoveries=self.s.recoveries,
                         redo=[[r.least, r.most] for r in redo],
                         wall_seconds=round(wall, 1), exit=code)

    def _note_loss(self, decision: sd.Decision, vm: str, trainer: sd.Trainer,
                   recovering: bool = True) -> None:
        """The ``preempted`` event of a lost VM. A VM lost before its trainer
        started cost no steps; otherwise the new trainer's resume step tells
        how many (`Standing.note_resume`). Not ``recovering``: the run gives
        up, and the loss counts no recovery."""
        s = self.s
        seen, stopped = s.seen_here, vm == sd.READY and trainer.state == "exited"
        where = ("before its trainer started" if not s.trained_here else
                 f"at step {seen}" if seen is not None else
                 "before the launcher saw a step of its trainer")
        s.forget_vm()
        if not recovering:
            s.lost_unrecovered = True
            self.events.emit("preempted", f"{self.cfg.name}: {decision.why}; preempted "
                             f"{where}; not recovered", step=seen, vm=self.cfg.name)
            return
        s.recoveries += 1
        s.lost_noted, s.step_at_loss, s.stopped_cleanly = True, seen, stopped
        s.awaiting_resume = s.trained_here
        redo = None if s.trained_here else sd.Redo(0, 0)
        s.redo.append(redo)
        self.events.emit("preempted", f"{self.cfg.name}: {decision.why}; preempted {where}",
                         step=seen, stopped_cleanly=stopped, recovery=s.recoveries,
                         redo=None if redo is None else [0, 0], vm=self.cfg.name)


class RunObserves(RunEnds):
    """What a run sees: the VM's state, its trainer's, and the progress the
    trainer reports (as events)."""

    def _observe(self) -> tuple[str, sd.Trainer]:
        """The VM's state and, when it is READY, its trainer's; a failed
        describe or status check counts toward ``--retry_seconds``."""
        vm = self.cloud.vm_state()
        if vm == sd.UNKNOWN:
            self._failed()
            return vm, sd.Trainer(sd.UNASKED)
        if vm not in (sd.GONE, sd.NODE_GONE, "DELETING"):
            self.had_vm, self.created_unseen = True, False
            self.refusals, self.refused_since = 0, None
        if vm != sd.READY:
            self._answered()
            return vm, sd.Trainer(sd.UNASKED)
        trainer, progress = self.cloud.trainer()
        if trainer.state == sd.UNREACHABLE:
            self._failed()
            return vm, trainer
        self._answered()
        self.s.trained_here |= trainer.state != "not started"
        self.started_unseen &= trainer.state == "not started"
        if progress:
            self._note_progress(progress)
        return vm, trainer

    def _note_progress(self, progress: list[ts.Progress]) -> None:
        """A ``training`` event when the step moved, ``resumed`` once the
        trainer of a recovery says where it resumed."""
        hosts = sorted({p.host for p in progress})
        steps = [p for p in progress if p.step is not None]
        if not steps:
            self.s.vm_hosts |= set(hosts)
            return
        latest = max(steps, key=lambda p: p.step)
        self.s.total = latest.total or self.s.total
        if self.s.awaiting_resume:
            resumed = max((p.resumed or 0) for p in steps)
            redo = self.s.note_resume(resumed, self._gap())
            self.events.emit("resumed", f"{self.cfg.name}: resumed at step {resumed}; "
                             f"{redo.text()} step(s) trained again",
                             step=resumed, redo=[redo.least, redo.most])
        if (latest.step != self.s.seen_here or latest.step != self.s.last_step
                or set(hosts) - self.s.vm_hosts):
            self.s.vm_hosts |= set(hosts)
            self.s.last_step = self.s.seen_here = latest.step
            self.events.emit("training", f"{self.cfg.name}: step {latest.step}/"
                             f"{latest.total}", step=latest.step, total=latest.total,
                             hosts=sorted(self.s.vm_hosts))


class SpotRun(RunObserves):
    """One spot run: observe, `spot_decide.decide`, act, until an ending."""

    def run(self, prepare: Callable[[], None] = lambda: None) -> int:
        """The whole run; its exit status (`spot_decide`'s, or 128+N for
        signal N). ``prepare`` runs first, under the same signal handling."""
        with self._signals_raise():
            try:
                prepare()
                return self._loop()
            except RunError as exc:
                return self._end(sd.Decision(sd.FAIL, exc.code, str(exc)), sd.UNKNOWN,
                                 sd.Trainer(sd.UNASKED))
            except NotThisRun:  # left as it is: `run_spot` says so
                self.ending = True
                raise
            except le.LaunchError as exc:  # the wheel did not build
                return self._end(sd.Decision(sd.FAIL, exc.code, str(exc)), sd.UNKNOWN,
                                 sd.Trainer(sd.UNASKED))
            except Stopped as exc:  # from `_signals_raise`, or a command's (lp.run_command)
                return self._interrupted(exc.signum)
            except KeyboardInterrupt:
                return self._interrupted(signal.SIGINT)

    @contextmanager
    def _signals_raise(self) -> Iterator[None]:
        """SIGINT, SIGTERM and SIGHUP raise `Stopped` until the run ends;
        then they are ignored. One the launcher was started ignoring stays
        ignored: under ``nohup`` a closed terminal leaves the run going."""
        def handler(signum, frame):
            if not self.ending:
                raise Stopped(signum)
        with on_stop_signals(handler):
            yield

    def _loop(self) -> int:
        self._announce()
        while True:
            vm, trainer = self._observe()
            decision = sd.decide(vm, trainer, self._tally())
            if decision.action in sd.ENDINGS:
                return self._end(decision, vm, trainer)
            if decision.action == sd.WAIT:
                self.sleep(sd.backoff(self.failures, self.cfg.poll_seconds))
            elif decision.action == sd.CREATE:
                self._create()
            elif decision.action == sd.SETUP:
                self._setup()
            elif decision.action == sd.RECOVER:
                self._shown_again(vm)
                if not self.s.lost_noted:
                    self._note_loss(decision, vm, trainer)
                self._remove()
            else:  # REPLACE: a queued resource that failed, or whose VM is gone
                self._shown_again(vm)
                self.events.emit("replacing", f"{self.cfg.name}: {decision.why}")
                self._remove()

    def _shown_again(self, vm: str) -> None:
        """Before a removal: a VM this run removed (describe said gone)
        shown again with no create since contradicts that describe; each
        such removal waits a backoff, and after ``--retry_seconds`` of
        them the run ends (`RunError`, 255)."""
        if self.removed_at is None:
            return
        self.removals += 1
        self.sleep(sd.backoff(self.removals, self.cfg.poll_seconds))
        if self.clock() - self.removed_at > self.cfg.retry_seconds:
            raise RunError(console.LOST, f"describe still shows {self.cfg.name} {vm} "
                           f"{self.cfg.retry_seconds:g} s after it said it was gone "
                           "(--retry_seconds)")

    def _announce(self) -> None:
        """The ``started`` event: what runs, and where a restarted launcher
        takes its run up (its identity is checked against the journal's)."""
        cfg, s = self.cfg, self.s
        taken_up = (f"; taking up the run in {cfg.events}: {s.recoveries} "
                    f"recoveries so far" if s.events else "")
        self.events.emit("started", f"{cfg.name}: {cfg.accelerator_type} in {cfg.zone}, "
                         f"model_dir {cfg.model_dir}, run id {cfg.run_id}{taken_up}",
                         run=identity(cfg))

    # ------------------------------------------------------------ actions

    def _create(self) -> None:
        """Creates the VM (the wheel is built first, so a build that fails
        costs no VM); every refusal in a row counts toward ``--retry_seconds``
        and waits longer (`spot_decide.backoff`)."""
        self._build_wheel()
        if self.created_unseen:
            self._refused("create failed", f"{self.cfg.name}: the last create answered "
                          "done, yet describe finds no VM")
        rc, out, err = self.cloud.create()
        what = "queued resource" if self.cfg.queued else "spot VM" if self.cfg.spot else "VM"
        if rc == 0:
            self.created_unseen, self.started_unseen = True, False
            self.removed_at, self.removals = None, 0
            self.setup_rc, self.s.lost_noted, self.s.trained_here = None, False, False
            self.s.lost_unrecovered, self.s.seen_here = False, None
            self.events.emit("created", f"{self.cfg.name}: {what} "
                             f"{self.cfg.accelerator_type} in {self.cfg.zone}", vm=self.cfg.name)
            return
        kind = create_failure(err + out)
        if kind == "permanent":
            raise RunError(console.FAILURE,
                           f"creating {self.cfg.name} failed: {last_line(err + out)}")
        self._refused("no capacity" if kind == "stockout" else "create failed",
                      f"{self.cfg.name}: {last_line(err + out)}")

    def _refused(self, event: str, why: str) -> None:
        """A create refused (or one that answered done and made no VM):
        counts toward ``--retry_seconds``, then waits longer each time in
        a row (`spot_decide.backoff`)."""
        self.refusals += 1
        if self.refused_since is None:
            self.refused_since = self.clock()
        wait = sd.backoff(self.refusals, self.cfg.poll_seconds)
        self.events.emit(event, f"{why}; trying again in {wait:g} s")
        self.sleep(wait)

    def _build_wheel(self) -> None:
        if not self.wheel_built:
            self.cloud.build_wheel()
            self.wheel_built = True

    def _setup(self) -> None:
        """Installs on the VM and starts the trainer; a failure is kept in
        ``setup_rc`` for `decide` (255: ssh could not reach the VM, retried)."""
        self._build_wheel()
        if self.started_unseen:
            raise RunError(console.FAILURE, "the trainer start answered done, yet the "
                           "status check finds no trainer there "
                           f"({tc.REMOTE_DIR}/train.pid missing)")
        rc, out, err = self.cloud.install()
        if rc == 0:
            self.events.emit("set up", f"{self.cfg.name}: TensorFlow and the project "
                             "installed")
            rc, out, err = self.cloud.start_trainer(sorted(self.s.dead_hosts))
        self.setup_rc = rc or None
        if rc == 0:
            self._answered()
            self.started_unseen = True
            self._started()
        elif rc == console.LOST:
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
            self.events.emit("training", f"{self.cfg.name}: trainer started")


def run_spot(cfg: TpuConfig, make_cloud: Callable[[TpuConfig], Cloud],
             prepare: Callable[[Cloud], None] = lambda cloud: None,
             check: Callable[[], None] = lambda: None) -> int:
    """``run`` with real gcloud calls. The ``--events`` journal is read,
    checked and locked before anything else (a damaged one, or one another
    launcher holds, ends the launcher in one line with nothing done); a
    killed launcher's run is taken up from it, with its run id (the mark
    on its VM): else ``--run_id``, else a new one. ``check`` comes next
    (the gcloud version: its `le.LaunchError` ends the launcher with
    nothing done). A VM of the name that is not this run's (`NotThisRun`)
    ends the launcher in one line, the VM left as it is."""
    journal, standing = None, Standing()
    if cfg.events is not None:
        try:
            journal, standing = Journal.open(cfg.events, identity(cfg))
        except JournalError as exc:
            return le.fail(str(exc), exc.code)
    run_id = (standing.run or {}).get("run_id") or cfg.run_id or tc.new_run_id()
    cloud = make_cloud(dataclasses.replace(cfg, run_id=run_id))
    try:
        check()
        return SpotRun(cloud.cfg, cloud, Events(journal), standing).run(
            lambda: prepare(cloud))
    except NotThisRun as exc:
        return le.fail(str(exc), exc.code)
    finally:
        if journal is not None:
            journal.close()
