"""The trainer's stop on SIGTERM (a spot VM's or Kubernetes' preemption), SIGINT
(Ctrl-C) and SIGHUP (a closed terminal or ssh session).

The trainer's policy, built on `mnist_common.stop` (the `Stopped` exception,
the handlers, `deferred`); what the user sees is in docs/trainer.md
("Preemption: SIGTERM, Ctrl-C and SIGHUP").

No handler here raises: an exception raised in a signal handler surfaces in
whatever the main thread runs, and inside TensorFlow (a ``tf.function``
being traced, a Keras layer being called) it comes out wrapped in
TensorFlow's or Keras' own errors, as a traceback. So a handler either sets
a flag that the training loop reads at its next step boundary, or ends the
process itself.

`StopSignals` turns the first signal during training into a request: the
controller sees it at the next step boundary (custom loop: after each
``steps_per_execution`` call; Keras loop: after each train-function call),
saves a checkpoint of that step with the run's history, and raises
`Stopped` (`stopped_after_saving`); the command line prints one line and
exits with its status (`mnist_common.console.stopped_by`: 128 + the signal
number, as a shell reports a process the signal ended). Rerunning the same command resumes
from that checkpoint exactly as after a kill; a command that starts the
trainer for its user and starts over when rerun (`scripts/run_local.sh`)
names the command that resumes instead (`resume_with`), and the lines say
that one. `ProcessSignals`, which the
command line installs for its whole run, ends the process at once, with one
line and that status, on a signal outside the training steps (nothing to
save: no step was trained since the last checkpoint, or training is
complete and checkpointed) and on a second signal during them (the last
checkpoint on disk stays the resume point); first it runs what the run
registered with `at_stop` (releasing the ``model_dir`` lock; while the lock
is being taken the signal waits, `mnist_common.stop.deferred`). A signal that
was ignored when the process started (``nohup``, a detached launcher) stays
ignored.

Under multi-worker training the signal reaches one worker (the VM or pod
being preempted) while the others train on inside the same collectives, so
the workers decide together: at every boundary they exchange what each
received (`StopSignals.requested`, one all-reduce of three numbers), and all
stop at the same step, each saving the checkpoint of that step (the
chief's in ``model_dir``, the one a rerun resumes from on every worker).
Every worker exits with the same status; the others' line says the signal
reached another worker.

Why not ``tf.distribute.experimental.PreemptionCheckpointHandler`` (checked
against TF 2.21.0 ``failure_handling.py``): its ``save_checkpoint_if_preempted``
does nothing on Compute Engine CPU and TPU VMs (it logs that it "does not
support usage with TPU or CPU device on GCP"), and on Compute Engine GPU
VMs it watches the metadata server's maintenance event, not SIGTERM. It
supports only ``MultiWorkerMirroredStrategy`` and ``TPUStrategy`` (not the
default or ``MirroredStrategy`` runs), replaces the process's SIGTERM
handler and leaves SIGINT alone, restores the checkpoint the state file
names when it is created (a damaged state file or newest checkpoint would
bypass `trainer.run.checkpoint_repair`), adds its own counter of ``run`` calls to the
checkpoint, exits the process itself, and cannot wrap ``Model.fit``'s steps
(Keras reaches it only through ``BackupAndRestore``, which mis-counts steps
with ``steps_per_execution > 1``; see docs/trainer.md).
"""

from __future__ import annotations

import os
import signal
from typing import Callable, Mapping, Optional, Sequence

from mnist_common import console, stop
from mnist_common.stop import STOP_SIGNALS, Stopped
from trainer.errors import TrainerInputError

_resume_command: Optional[str] = None  # `resume_with`'s; None: the same command
# The command line's setting of `resume_with`: one line, the command to print.
RESUME_COMMAND_ENV = "TRAINER_RESUME_COMMAND"


def resume_command(environ: Mapping[str, str]) -> Optional[str]:
    """`RESUME_COMMAND_ENV`'s value in ``environ`` (None: unset), checked as a
    flag is: empty or more than one line raises `TrainerInputError`."""
    command = environ.get(RESUME_COMMAND_ENV)
    if command is None:
        return None
    if not command.strip() or not command.isprintable():
        raise TrainerInputError(f"{RESUME_COMMAND_ENV}={command!r}: expected the command "
                                "that resumes this run, on one line")
    return command.strip()


def resume_with(command: Optional[str]) -> None:
    """The stop lines name ``command`` as the one that resumes (None: a rerun
    of the same command). The command line sets it from `RESUME_COMMAND_ENV`:
    a wrapper that starts over when rerun knows how it resumes, the trainer
    does not."""
    global _resume_command
    _resume_command = command


def _rerun_resumes(since: str) -> str:
    """``a rerun resumes from SINCE``, or with `resume_with`'s command: ``to
    resume from SINCE, run: COMMAND``."""
    if _resume_command is None:
        return f"a rerun resumes from {since}"
    return f"to resume from {since}, run: {_resume_command}"


def stopped_after_saving(signum: int, here: bool, step: str, checkpoint: str) -> Stopped:
    """The stop after saving ``checkpoint`` at ``step`` (``N/TOTAL``), its
    line the one to print; ``here``: the signal came to this process, not to
    another worker."""
    resume = ("rerun the same command to resume" if _resume_command is None
              else f"to resume, run: {_resume_command}")
    return Stopped(signum, f"{signal.Signals(signum).name} received"
                           f"{'' if here else ' by another worker'}: stopped at step "
                           f"{step}, saved {checkpoint}; {resume}")


class ProcessSignals:
    """The command line's signals from start to exit (a context manager): each
    ends the process at once (`end`), unless `StopSignals` watches training."""

    def __init__(self) -> None:
        self.cleanups: list[Callable[[], None]] = []
        self._replaced: dict = {}

    def __enter__(self) -> "ProcessSignals":
        global _process
        self._replaced, _process = stop.install(self._handle), self
        return self

    def __exit__(self, *exc) -> None:
        global _process
        stop.restore(self._replaced)
        _process = None

    def _handle(self, signum: int, frame) -> None:
        self.end(signum, f"{signal.Signals(signum).name} received outside the training "
                         f"steps: stopped; {_rerun_resumes('the last checkpoint, if any')}")

    def end(self, signum: int, message: str) -> None:
        """Prints ``message``, runs the cleanups (newest first), exits 128 + ``signum``.

        ``os._exit``: unwinding (an exception) would pass through whatever
        TensorFlow is doing; the cleanups are what must not be skipped. A
        signal while TensorFlow starts finds fd 2 captured
        (`mnist_common.console.tensorflow_start`): it is put back first, so
        the line reaches the real stderr.
        """
        console.end_capture()
        os.write(2, f"{message}\n".encode())  # a print could re-enter an interrupted one
        for cleanup in reversed(self.cleanups):
            try:
                cleanup()
            except Exception as e:  # noqa: BLE001  (the exit goes ahead; say what is left)
                os.write(2, f"while stopping: {type(e).__name__}: {e}\n".encode())
        os._exit(console.stopped_by(signum))


_process: Optional[ProcessSignals] = None  # the command line's, while installed


def at_stop(cleanup: Callable[[], None]) -> None:
    """Runs ``cleanup`` if a signal ends the process (command line only) until
    `forget`; e.g. releasing the ``model_dir`` lock."""
    if _process is not None:
        _process.cleanups.append(cleanup)


def forget(cleanup: Callable[[], None]) -> None:
    if _process is not None and cleanup in _process.cleanups:
        _process.cleanups.remove(cleanup)


class StopSignals:
    """While watched, the stop signals request a stop at the next step boundary."""

    def __init__(self) -> None:
        self.received: Optional[int] = None
        self._previous: dict = {}

    def watch(self) -> None:
        """From now until `release`, the signals request a stop."""
        self._previous = stop.install(self._handle)

    @property
    def name(self) -> str:
        """The received signal's name (``SIGTERM``); only once one was received."""
        return signal.Signals(self.received).name

    def requested(self, share: Optional[Callable[[Sequence[float]], list]] = None
                  ) -> Optional[tuple[int, bool]]:
        """The signal to stop on and whether this process received it; None: go on.

        ``share`` (`trainer.strategy.sum_over_replicas`, multi-worker runs):
        every worker calls this at the same boundaries and they decide from
        the same sums of what each received, so all stop at the same step if
        any one was signalled. The decision uses one reading of `received`:
        a signal arriving meanwhile is seen at the next boundary, by every
        worker.
        """
        mine = self.received
        if share is None:
            return None if mine is None else (mine, True)
        counts = share([mine == signum for signum in STOP_SIGNALS])
        if mine is not None:
            return mine, True
        for signum, count in zip(STOP_SIGNALS, counts):
            if count:
                return signum, False
        return None

    def release(self) -> None:
        """The signals act as before `watch` again."""
        stop.restore(self._previous)

    def _handle(self, signum: int, frame) -> None:
        if self.received is not None:  # asked twice: stop now, without a checkpoint
            message = (f"{signal.Signals(signum).name} received twice: stopped without "
                       f"saving; {_rerun_resumes('the last checkpoint')}")
            if _process is None:  # in a Python program: its exception, its choice
                raise Stopped(signum, message)
            _process.end(signum, message)
        self.received = signum
        os.write(2, f"{self.name} received: stopping after the current steps to save "
                    "a checkpoint\n".encode())
