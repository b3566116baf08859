"""One writer per output: ``OUTPUT/.lock``, held from before the run touches the
output until it ends.

The lock, and what it guarantees on a local disk and on ``gs://``, is
`mnist_common.storage_lock`'s; here the GCS backend gets Beam's client and
retry policy, and losing the lock stops the publish.
"""

from __future__ import annotations

import time

import mnist_contract as contract
from mnist_common.storage_lock import (LOCK_FILE, STALE_SECONDS, GcsLockObject, HeldLock,
                                       LocalLockFile, LockInfo, claim, split_gs_path)

from pipeline import _compat, storage
from pipeline.errors import PipelineInputError


def _gcs(path: str) -> GcsLockObject:
    """The lock object through Beam's GCS client, with Beam's retry policy (the
    deadline `storage.configure_gcs` gave it)."""
    storage.use_anonymous_gcs_for_emulator()
    bucket, name = split_gs_path(path)
    return GcsLockObject(_compat.gcs_bucket(bucket), name, retry=_compat.gcs_retry())


class OutputLock(HeldLock):
    """A held lock; `release` it when the run ends. Built by `acquire`."""

    def __init__(self, output: str, backend, info: LockInfo, token):
        super().__init__(contract.join_path(output, LOCK_FILE), backend, info, token)
        self.output = output

    def check_held(self) -> None:
        """Raises unless this run still holds the lock (called before publishing)."""
        lost = self.lost_reason()
        if lost:
            raise PipelineInputError(
                f"{self.output}: this run lost its lock ({lost}); "
                "not publishing, the output was left as it was")


def acquire(output: str, run_id: str) -> OutputLock:
    """Takes the output's lock or raises `PipelineInputError` naming its holder.

    Storage failures (unwritable, full, unreachable) propagate as OSError or
    the client's exception for the caller to report.
    """
    path = contract.join_path(output, LOCK_FILE)
    backend = _gcs(path) if path.startswith("gs://") else LocalLockFile(path)
    info = LockInfo.for_this_process(run_id)
    token, holder = claim(backend, info, output)
    if token is not None:
        return OutputLock(output, backend, info, token)
    if holder is not None:
        raise PipelineInputError(
            f"{output}: locked by {holder.describe(time.time())}; another run is writing "
            f"here: wait for it to end (a dead holder's lock is taken over "
            f"automatically after {STALE_SECONDS:.0f}s without heartbeat)")
    raise PipelineInputError(f"{output}: could not take the lock {path}: other runs "
                             "keep taking it; try again")
