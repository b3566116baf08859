"""What the chief may write into ``model_dir``, and from when: the run's `Claim`.

Two rules, both held by the parts that write (the run's checkpoints, the
TensorBoard writers, the profiler, the export), which are handed the claim:

* Nothing about a run is recorded before every check has passed. The lock
  and the dataset check come first (`trainer.train`), the resume checks with
  the restore (`trainer.run.checkpoints.RunCheckpoints.restore`); only then
  does the restore call `Claim.accept`, which records the dataset pin
  (`trainer.run.dataset_pin.record`). A refused run leaves ``model_dir``
  describing the run it holds.
* A run that has lost its lock writes nothing more. Its lock can be taken
  over only after its heartbeat stopped for
  `mnist_common.storage_lock.STALE_SECONDS` (a process
  stopped with SIGSTOP, a frozen VM, storage cut off); when it wakes, its
  next write would land among the new holder's files under the same names.
  So every write is preceded by `Claim.check`, which reads the lock (one
  small read: a local file, one GCS object) and ends the run with one line
  if another run holds it; the staged export, the one thing only this run
  wrote, is removed first.

A worker other than the chief writes only into its scratch folder and holds
no lock: its claim checks and records nothing.
"""

from __future__ import annotations

from typing import Optional

from trainer.errors import TrainerError
from trainer.run import dataset_pin, outputs
from trainer.run.dataset_pin import DatasetPin
from trainer.run.lock import RunLock


class Claim:
    """The chief's claim on ``model_dir`` (``lock`` held); ``Claim()``, holding
    nothing, is a non-chief's."""

    def __init__(self, model_dir: str = "", lock: Optional[RunLock] = None,
                 pin: Optional[DatasetPin] = None):
        self.model_dir, self.lock, self.pin = model_dir, lock, pin
        self.run_id = lock.run_id if lock else "worker"

    def accept(self) -> None:
        """Every check has passed: records the run's dataset (chief only)."""
        if self.lock is not None:
            dataset_pin.record(self.model_dir, self.pin)

    def check(self, leftover: str = "") -> None:
        """Raises `TrainerError` (after removing ``leftover``, this run's own
        staged export) unless this run still holds ``model_dir``'s lock."""
        if self.lock is None:
            return
        try:
            self.lock.check_held(self.model_dir)
        except TrainerError:
            if leftover:
                outputs.discard_partial(leftover)
            raise
