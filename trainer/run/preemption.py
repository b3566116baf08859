"""Stopping cleanly on SIGTERM (a spot VM's or Kubernetes' preemption) and SIGINT (Ctrl-C).

`StopSignals` turns the first signal into a request: the controller sees it
at the next step boundary (custom loop: after each ``steps_per_execution``
call; Keras loop: after each train-function call), saves a checkpoint of
that step with the run's history, and raises `Stopped`; the command line
prints one line and exits with `EXIT_STATUS` (`mnist_common.console.stopped_by`:
128 + the signal number, as a shell reports a process the signal ended). Rerunning the same command
resumes from that checkpoint exactly as after a kill. A second signal stops
at once, without saving (the last checkpoint on disk stays the resume point).

Under multi-worker training the signal reaches one worker (the VM or pod
being preempted) while the others train on inside the same collectives, so
the workers decide together: at every boundary they exchange what each
received (`StopSignals.requested`, one all-reduce of two numbers), and all
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
import threading
from typing import Callable, Optional, Sequence

from mnist_common import console

EXIT_STATUS = {signum: console.stopped_by(signum)
               for signum in (signal.SIGTERM, signal.SIGINT)}


class Stopped(Exception):
    """Training stopped on a signal; the message is the one line to print."""

    def __init__(self, signum: int, message: str):
        super().__init__(message)
        self.exit_status = EXIT_STATUS[signum]

    @classmethod
    def saved(cls, signum: int, here: bool, step: str, checkpoint: str) -> "Stopped":
        """A stop after saving ``checkpoint`` at ``step`` (``N/TOTAL``); ``here``:
        the signal came to this process, not to another worker."""
        return cls(signum, f"{signal.Signals(signum).name} received"
                           f"{'' if here else ' by another worker'}: stopped at step "
                           f"{step}, saved {checkpoint}; rerun the same command to resume")


class StopSignals:
    """While watched, SIGTERM and SIGINT request a stop instead of ending the process."""

    def __init__(self) -> None:
        self.received: Optional[int] = None
        self._previous: dict = {}

    def watch(self) -> None:
        """From now until `release`, the signals request a stop (in the main
        thread only: Python runs signal handlers there)."""
        if threading.current_thread() is not threading.main_thread():
            return
        for signum in EXIT_STATUS:
            self._previous[signum] = signal.signal(signum, self._handle)

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
        terms, interrupts = share([mine == signal.SIGTERM, mine == signal.SIGINT])
        if mine is not None:
            return mine, True
        if terms or interrupts:
            return (signal.SIGTERM if terms else signal.SIGINT), False
        return None

    def release(self) -> None:
        """The signals act as before `watch` again."""
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous.clear()

    def _handle(self, signum: int, frame) -> None:
        if self.received is not None:  # asked twice: stop now, without a checkpoint
            raise Stopped(signum, f"{signal.Signals(signum).name} received twice: stopped "
                                  "without saving; a rerun resumes from the last checkpoint")
        self.received = signum
        # os.write: a print here could re-enter a print the signal interrupted.
        os.write(2, f"{self.name} received: stopping after the current steps to save "
                    "a checkpoint\n".encode())
