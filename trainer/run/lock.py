"""One run per ``model_dir``: ``MODEL_DIR/.lock``, held by the chief for the whole run.

The lock, and what it guarantees on each filesystem, is
`mnist_common.storage_lock`'s. Specific to the trainer: the chief takes the
lock before it restores anything and checks it still holds it before it
commits an export; ``gs://`` goes through google-cloud-storage's own client
(`gcs_backend`: each request waits `GCS_TIMEOUT_SECONDS` for the server and
a failing one is retried for `GCS_RETRY_SECONDS`, so an unreachable server
ends the start with one line in under a minute); other ``tf.io.gfile``
schemes go through `mnist_common.storage_lock.GfileLockFile`.
"""

from __future__ import annotations

import time
import uuid

import tensorflow as tf

from mnist_common import storage_errors, storage_lock
from mnist_contract import join_path
from trainer.errors import TrainerError, os_reason, summarize_error

# Per request to GCS: (connect, read) seconds. Requests that fail in a way
# worth retrying (no connection, timeout, 429, 5xx) are retried with backoff
# for GCS_RETRY_SECONDS in all.
GCS_TIMEOUT_SECONDS = (5.0, 15.0)
GCS_RETRY_SECONDS = 30.0


class RunLock(storage_lock.HeldLock):
    """The held ``model_dir`` lock; `release` it when the run ends."""

    def check_held(self, model_dir: str) -> None:
        """Raises unless this run still holds the lock (`trainer.run.claim`:
        before each write into ``model_dir``)."""
        try:
            self.raise_if_lost(lambda lost: TrainerError(
                f"{model_dir}: this run lost its lock ({lost}); stopped without writing "
                "more (the run that holds it carries on from the checkpoints)"))
        except _storage_errors() as e:
            raise TrainerError(f"{self.path}: cannot read this run's lock "
                               f"({storage_reason(e)}); stopped without writing more "
                               "into --model_dir") from None


def gcs_backend(path: str) -> storage_lock.GcsLockObject:
    """The ``gs://`` lock through google-cloud-storage's own client.

    The client finds credentials as Google's libraries do
    (``GOOGLE_APPLICATION_CREDENTIALS``, gcloud's application default, on a
    Cloud TPU VM the metadata server's service account); with
    ``STORAGE_EMULATOR_HOST`` set it talks to that server without any. It
    gets no project: object requests need none, and looking one up fails
    where credentials name none.
    """
    try:
        from google.auth.exceptions import DefaultCredentialsError
        from google.cloud import storage
        from google.cloud.storage.retry import DEFAULT_RETRY
    except ImportError as e:
        raise _cannot_lock(path, f"google-cloud-storage does not import: {e}; "
                                 "install the trainer extra") from None
    bucket, name = storage_lock.split_gs_path(path)
    try:
        client = storage.Client(project=None)
    except DefaultCredentialsError as e:
        raise _cannot_lock(path, f"no Google credentials: {summarize_error(e)}; run "
                                 "`gcloud auth application-default login` or set "
                                 "GOOGLE_APPLICATION_CREDENTIALS (a Cloud TPU VM uses "
                                 "its service account)") from None
    return storage_lock.GcsLockObject(client.bucket(bucket), name,
                                      retry=DEFAULT_RETRY.with_timeout(GCS_RETRY_SECONDS),
                                      timeout=GCS_TIMEOUT_SECONDS)


def _storage_errors() -> tuple:
    """What a failing store raises: OSError, TensorFlow's errors and, where
    installed, google-api-core's and google-auth's."""
    try:
        from google.api_core.exceptions import GoogleAPIError
        from google.auth.exceptions import GoogleAuthError
    except ImportError:
        return OSError, tf.errors.OpError
    return OSError, tf.errors.OpError, GoogleAPIError, GoogleAuthError


def storage_reason(error: BaseException) -> str:
    """A storage failure in a few words (`mnist_common.storage_errors`), with
    TensorFlow's file errors reduced to the operating system's reason."""
    return storage_errors.storage_reason(error, GCS_RETRY_SECONDS, _file_error_reason)


def _file_error_reason(error: BaseException) -> str:
    if isinstance(error, (OSError, tf.errors.OpError)):
        return os_reason(error)
    return summarize_error(error)


def _cannot_lock(path: str, reason: str) -> TrainerError:
    return TrainerError(f"{path}: cannot take the lock of --model_dir ({reason})")


def acquire(model_dir: str) -> RunLock:
    """Takes ``model_dir``'s lock or raises `TrainerError` naming its holder.
    The backend: local disk for plain paths, GCS's for gs://, gfile's for
    other schemes."""
    path = join_path(model_dir, storage_lock.LOCK_FILE)
    try:
        store = storage_lock.backend_for(path, gcs_backend, storage_lock.GfileLockFile)
        return storage_lock.acquire(path, store, uuid.uuid4().hex[:12], model_dir,
                                    gone=storage_lock.dead_hosts(), held=RunLock)
    except _storage_errors() as e:
        raise _cannot_lock(path, storage_reason(e)) from None
    except storage_lock.LockRefused as refused:
        raise _refusal(model_dir, path, refused.holder) from None


def _refusal(model_dir: str, path: str, holder) -> TrainerError:
    """Why the lock held by ``holder`` (None: contended) is not this run's."""
    if holder is None:
        return TrainerError(f"{path}: other runs keep taking this lock; try again")
    if holder.unreadable:
        return TrainerError(
            f"{path}: {holder.describe(time.time())}, so no run can be named as its "
            f"holder; remove it if no run is using {model_dir} (it is taken over once "
            f"{storage_lock.STALE_SECONDS:.0f}s old)")
    return TrainerError(
        f"{model_dir}: in use by {holder.describe(time.time())}; one run per "
        "--model_dir: wait for it to end or use another --model_dir (a dead "
        f"holder's lock is taken over after {storage_lock.STALE_SECONDS:.0f}s "
        "without heartbeat)")
