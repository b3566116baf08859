"""Stopping cleanly on SIGTERM (a spot VM's or Kubernetes' preemption) and SIGINT (Ctrl-C).

`StopSignals` turns the first signal into a request: the controller sees it
at the next step boundary (custom loop: after each ``steps_per_execution``
call; Keras loop: after each train-function call), saves a checkpoint of
that step with the run's history, and raises `Stopped`; the command line
prints one line and exits with `EXIT_STATUS` (128 + the signal number, as a
shell reports a process the signal ended). Rerunning the same command
resumes from that checkpoint exactly as after a kill. A second signal stops
at once, without saving (the last checkpoint on disk stays the resume point).

Why not ``tf.distribute.experimental.PreemptionCheckpointHandler``: it
supports only ``MultiWorkerMirroredStrategy`` and ``TPUStrategy`` (not the
default or ``MirroredStrategy`` runs), restores and names checkpoints by its
own count of ``run`` calls rather than the optimizer step, exits the process
itself from inside ``run``, and cannot wrap ``Model.fit``'s steps (Keras
reaches it only through ``BackupAndRestore``, which mis-counts steps with
``steps_per_execution > 1``; see docs/trainer.md). Under multi-worker
training the signals are left alone: one worker saving on its own would
leave the others waiting in the save's collectives; a preempted worker ends
at once and the rerun resumes from the last checkpoint.
"""

from __future__ import annotations

import os
import signal
import threading
from typing import Optional

EXIT_STATUS = {signal.SIGTERM: 128 + signal.SIGTERM, signal.SIGINT: 128 + signal.SIGINT}


class Stopped(Exception):
    """Training stopped on a signal; the message is the one line to print."""

    def __init__(self, signum: int, message: str):
        super().__init__(message)
        self.exit_status = EXIT_STATUS[signum]


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
