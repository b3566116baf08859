"""One writer per output: ``OUTPUT/.lock``, held from before the run touches the
output until it ends.

The lock, and what it guarantees on a local disk and on ``gs://``, is
`mnist_common.storage_lock`'s; here the GCS backend gets Beam's client and
retry policy, every other path the local-disk backend, and the job's words
for a refused or lost lock.
"""

from __future__ import annotations

import functools
import time

import mnist_contract as contract
from mnist_common import storage_lock
from mnist_common.storage_lock import LOCK_FILE, STALE_SECONDS

from pipeline import _compat, storage
from pipeline.errors import PipelineInputError


def _gcs(path: str) -> storage_lock.GcsLockObject:
    """The lock object through Beam's GCS client, with Beam's retry policy (the
    deadline `storage.configure_gcs` gave it)."""
    storage.use_anonymous_gcs_for_emulator()
    bucket, name = storage_lock.split_gs_path(path)
    return storage_lock.GcsLockObject(_compat.gcs_bucket(bucket), name,
                                      retry=_compat.gcs_retry())


class OutputLock(storage_lock.HeldLock):
    """A held lock; `release` it when the run ends. Built by `acquire`."""

    def __init__(self, path: str, backend, info, token, output: str):
        super().__init__(path, backend, info, token)
        self.output = output

    def check_held(self) -> None:
        """Raises unless this run still holds the lock (called before publishing)."""
        self.raise_if_lost(lambda lost: PipelineInputError(
            f"{self.output}: this run lost its lock ({lost}); "
            "not publishing, the output was left as it was"))


def acquire(output: str, run_id: str) -> OutputLock:
    """Takes the output's lock or raises `PipelineInputError` naming its holder.

    Storage failures (unwritable, full, unreachable) propagate as OSError or
    the client's exception for the caller to report.
    """
    path = contract.join_path(output, LOCK_FILE)
    backend = storage_lock.backend_for(path, _gcs)
    try:
        return storage_lock.acquire(path, backend, run_id, output,
                                    held=functools.partial(OutputLock, output=output))
    except storage_lock.NotALockFile as e:
        raise PipelineInputError(f"{path}: {e.strerror}; nothing there was changed") \
            from None
    except storage_lock.LockRefused as refused:
        if refused.holder is None:
            raise PipelineInputError(f"{output}: could not take the lock {path}: other "
                                     "runs keep taking it; try again") from None
        raise PipelineInputError(
            f"{output}: locked by {refused.holder.describe(time.time())}; "
            "another run is writing here: wait for it to end (a dead holder's lock is "
            f"taken over automatically after {STALE_SECONDS:.0f}s without heartbeat)"
        ) from None
