"""What ``mnist-launch-tpu run`` does next, from what it sees.

`decide` is the whole policy of a spot run, a pure function of the VM's
state (``gcloud ... describe``), the trainer's state on it (the status
script over ssh) and the run's counts, so every ending is tested without a
cloud. `launch/tpu/spot/runner.py` observes, asks `decide`, acts, and asks
again: an action is never assumed to have worked, the next observation
says whether it did.
"""

from __future__ import annotations

import dataclasses

from mnist_common import console

# VM states of ``describe --format=value(state)``, plus two of our own.
READY = "READY"
GONE = "GONE"        # describe: NOT_FOUND
UNKNOWN = "UNKNOWN"  # describe failed otherwise (gcloud or the network)
FAILED = "FAILED"    # a queued resource that could not be provisioned
# A queued resource ACTIVE whose VM is NOT_FOUND: Cloud TPU makes no VM for
# it again, and it holds the name, so it is deleted before the next create.
NODE_GONE = "NODE_GONE"
# The VM is lost for training: preempted, or stopped by Cloud TPU or a
# person. A queued resource reports a preempted spot VM as SUSPENDED.
LOST_STATES = frozenset({"PREEMPTED", "TERMINATED", "STOPPING", "STOPPED",
                         "SUSPENDING", "SUSPENDED"})
# Queued-resource states (``value(state.state)``) and what they mean here.
QUEUED_WAITING = frozenset({"CREATING", "ACCEPTED", "WAITING_FOR_RESOURCES",
                            "PROVISIONING"})
QUEUED_ACTIVE = "ACTIVE"

# Trainer states (launch.tpu.states.summarize_status), plus two of our own.
UNREACHABLE = "unreachable"  # the status check over ssh failed
UNASKED = "unasked"          # not asked: the VM is not READY

# Exit statuses (`mnist_common.console`): the trainer saved and stopped on
# SIGTERM (a preemption notice) is console.TERMINATED; --max_recoveries
# reached, GAVE_UP; --wait_timeout passed, TIMED_OUT; the cloud did not
# answer for --retry_seconds, LOST.

WAIT, CREATE, SETUP, RECOVER, REPLACE = "wait", "create", "setup", "recover", "replace"
FINISH, FAIL, GIVE_UP, LOST, TIMEOUT = "finish", "fail", "give up", "lost", "timeout"
ENDINGS = frozenset({FINISH, FAIL, GIVE_UP, LOST, TIMEOUT})


@dataclasses.dataclass(frozen=True)
class Trainer:
    """The trainer on the VM: a `launch.tpu.states.summarize_status` state
    (or `UNREACHABLE`, `UNASKED`) and its exit status once it exited."""
    state: str
    code: int | None = None

    def lost(self) -> bool:
        """Stopped by SIGTERM after saving (a preemption notice), or gone
        without an exit status (killed with its host): training was cut
        short, not finished and not failed."""
        return ((self.state == "exited" and self.code == console.TERMINATED)
                or self.state == "stopped")


@dataclasses.dataclass(frozen=True)
class Tally:
    """The run's counts and clocks at the moment of a decision.

    had_vm: a VM of this run was seen since the last create, so one that is
    now gone was lost, not never made. setup_rc: the exit status of the last
    setup or trainer start on this VM (None: none failed). failing_seconds:
    how long calls to the cloud have been failing in a row (0: the last one
    answered); refused_seconds: how long every create has been refused (a
    describe that answers NOT_FOUND in between does not end that). elapsed:
    seconds since the run started. queued: creates make queued resources
    (``--queued``).
    """
    recoveries: int = 0
    max_recoveries: int = 5
    had_vm: bool = False
    setup_rc: int | None = None
    failing_seconds: float = 0.0
    refused_seconds: float = 0.0
    retry_seconds: float = 900.0
    elapsed: float = 0.0
    wait_timeout: float = 86400.0
    queued: bool = False


@dataclasses.dataclass(frozen=True)
class Decision:
    action: str
    code: int = 0
    why: str = ""


def decide(vm: str, trainer: Trainer, tally: Tally) -> Decision:
    """The next action for a VM in state ``vm`` whose trainer is ``trainer``.

    Preemption in any form (a lost VM state, a VM gone after it existed, a
    trainer stopped by SIGTERM or killed with its host) is a recovery while
    ``max_recoveries`` allows, whatever else is failing; a trainer that
    failed on its own is never retried.
    """
    if vm in LOST_STATES or (vm in (GONE, NODE_GONE) and tally.had_vm) or (
            vm == READY and trainer.lost()):
        if tally.recoveries >= tally.max_recoveries:
            return Decision(GIVE_UP, console.GAVE_UP, f"{_loss(vm, trainer)}; "
                            f"--max_recoveries={tally.max_recoveries} reached")
        return Decision(RECOVER, why=_loss(vm, trainer))
    if tally.elapsed > tally.wait_timeout:
        return Decision(TIMEOUT, console.TIMED_OUT,
                        f"still not finished after {tally.wait_timeout:g} s (--wait_timeout)")
    if tally.failing_seconds > tally.retry_seconds:
        return Decision(LOST, console.LOST, f"calls to the cloud failed for "
                        f"{tally.failing_seconds:.0f} s (--retry_seconds)")
    if tally.refused_seconds > tally.retry_seconds:
        return Decision(LOST, console.LOST, f"every create was refused for "
                        f"{tally.refused_seconds:.0f} s (--retry_seconds); try "
                        + ("another zone" if tally.queued else "another zone, or --queued"))
    if vm == GONE:
        return Decision(CREATE)
    if vm == FAILED:
        return Decision(REPLACE, why="the queued resource failed")
    if vm == NODE_GONE:
        return Decision(REPLACE, why="the queued resource is ACTIVE but its VM is gone")
    if vm != READY:
        return Decision(WAIT)  # creating, deleting, or describe failing
    return _decide_ready(trainer, tally)


def _decide_ready(trainer: Trainer, tally: Tally) -> Decision:
    if trainer.state == "exited":
        if trainer.code == 0:
            return Decision(FINISH)
        return Decision(FAIL, trainer.code or 1,
                        f"the trainer exited with status {trainer.code}")
    if trainer.state == "not started":
        if tally.setup_rc not in (None, console.LOST):
            return Decision(FAIL, tally.setup_rc,
                            f"setting up or starting the trainer exited {tally.setup_rc}")
        return Decision(SETUP)
    return Decision(WAIT)  # running, or the check failed (retried)


def _loss(vm: str, trainer: Trainer) -> str:
    if vm in LOST_STATES:
        return f"the VM is {vm}"
    if vm == GONE:
        return "the VM is gone"
    if vm == NODE_GONE:
        return "the VM is gone (its queued resource is still ACTIVE)"
    if trainer.state == "stopped":
        return "the trainer was killed without an exit status"
    return "the trainer stopped on SIGTERM"


def queued_vm_state(queued_state: str, node_state: str) -> str:
    """One VM state from a queued resource's state and its node's."""
    if queued_state in LOST_STATES:
        return queued_state
    if queued_state in QUEUED_WAITING:
        return "CREATING"
    if queued_state == QUEUED_ACTIVE:
        return NODE_GONE if node_state == GONE else node_state
    return queued_state  # GONE, UNKNOWN, FAILED, DELETING


def backoff(failures: int, poll_seconds: float) -> float:
    """Seconds to wait after ``failures`` failed calls in a row: 1, 2, 4, ...
    up to ``poll_seconds``, the pause between checks of a healthy run."""
    if failures <= 0:
        return poll_seconds
    return min(poll_seconds, 2.0 ** (failures - 1))


def checkpoint_gap(total: int | None, epochs: int, every: int, per_call: int,
                   keras: bool) -> int | None:
    """The most steps the trainer trains between two checkpoints (None:
    not known): ``every`` (``--checkpoint_every``; the Keras loop saves at
    the end of the ``per_call``-step call that crosses each multiple), and
    at most an epoch (``total`` steps over ``epochs``)."""
    per_epoch = total // epochs if total and epochs and total % epochs == 0 else None
    within = every + (per_call - 1 if keras else 0) if every else None
    known = [gap for gap in (within, per_epoch) if gap]
    return min(known) if known else None


@dataclasses.dataclass(frozen=True)
class Redo:
    """The steps trained again after a preemption: at least ``least``, at
    most ``most`` (None: no bound known)."""
    least: int = 0
    most: int | None = None

    def text(self) -> str:
        if self.most == self.least:
            return str(self.least)
        if self.most is None:
            return f"at least {self.least}" if self.least else "unknown"
        return f"at most {self.most}" if not self.least else f"{self.least} to {self.most}"


def redo_after(seen: int | None, resumed: int | None, stopped_cleanly: bool,
               gap: int | None) -> Redo:
    """What is known of the steps trained again once the lost trainer's
    last seen step (``seen``) and its successor's resume step are known.

    The steps past ``resumed`` that were seen are trained again for sure.
    A trainer that stopped on SIGTERM saved at its last step, which the
    launcher saw: that is all. One killed without that window trained on
    unseen after the last status check, but never past its next
    checkpoint: at most ``gap`` steps (`checkpoint_gap`) past ``resumed``,
    unless the newest checkpoint was damaged and skipped (then the seen
    steps may exceed ``gap``, and only they are known).
    """
    least = max(0, seen - resumed) if seen is not None and resumed is not None else 0
    if stopped_cleanly and seen is not None and resumed is not None:
        return Redo(least, least)
    return Redo(least, gap if gap is not None and gap >= least else None)
