"""One run per ``model_dir``: ``MODEL_DIR/.lock``, held by the chief for the whole run.

The lock, and what it guarantees on each filesystem, is
`mnist_common.storage_lock`'s. Specific to the trainer: the chief takes the
lock before it restores anything and checks it still holds it before it
commits an export; ``gs://`` goes through google-cloud-storage's own client
(`gcs_backend`: each request waits `GCS_TIMEOUT_SECONDS` for the server and
a failing one is retried for `GCS_RETRY_SECONDS`, so an unreachable server
ends the start with one line in under a minute); other ``tf.io.gfile``
schemes go through `GfileLockFile`.
"""

from __future__ import annotations

import json
import re
import time
import uuid
from http import HTTPStatus

import trainer  # noqa: F401  (sets TF_USE_LEGACY_KERAS before TF loads)
import tensorflow as tf

from mnist_common import storage_lock
from mnist_contract import join_path
from trainer.errors import TrainerError, os_reason, summarize_error

# Per request to GCS: (connect, read) seconds. Requests that fail in a way
# worth retrying (no connection, timeout, 429, 5xx) are retried with backoff
# for GCS_RETRY_SECONDS in all.
GCS_TIMEOUT_SECONDS = (5.0, 15.0)
GCS_RETRY_SECONDS = 30.0


class GfileLockFile:
    """The lock through ``tf.io.gfile``, for the schemes with no create-if-absent
    (its guarantee: `mnist_common.storage_lock`). A token is the lock's bytes as
    written."""

    def __init__(self, path: str):
        self.path = path

    def create(self, data: bytes):
        if tf.io.gfile.exists(self.path):
            return None
        temp = self._write_temp(data)
        try:
            tf.io.gfile.rename(temp, self.path, overwrite=False)
        except tf.errors.AlreadyExistsError:
            tf.io.gfile.remove(temp)
            return None
        current = self.read()
        return data if current is not None and current[0] == data else None

    def _write_temp(self, data: bytes) -> str:
        """``data`` in a new file beside the lock, not named after it (ram://
        takes a path that prefixes another as existing)."""
        folder, name = self.path.rsplit("/", 1)
        temp = f"{folder}/.new-{uuid.uuid4().hex}{name}"
        with tf.io.gfile.GFile(temp, "wb") as f:
            f.write(data)
        return temp

    def read(self):
        try:
            with tf.io.gfile.GFile(self.path, "rb") as f:
                data = f.read()
            mtime = tf.io.gfile.stat(self.path).mtime_nsec / 1e9
        except tf.errors.NotFoundError:
            return None
        return data, data, mtime

    def refresh(self, token, data: bytes):
        current = self.read()
        if current is None or current[0] != token:
            return None
        # Renamed over it: a rewrite in place may keep a longer old tail (ram://).
        tf.io.gfile.rename(self._write_temp(data), self.path, overwrite=True)
        return data

    def delete_if(self, token) -> bool:
        current = self.read()
        if current is None or current[0] != token:
            return False
        try:
            tf.io.gfile.remove(self.path)
        except tf.errors.NotFoundError:
            return False
        return True


class RunLock(storage_lock.HeldLock):
    """The held ``model_dir`` lock; `release` it when the run ends."""

    def check_held(self, model_dir: str) -> None:
        """Raises unless this run still holds the lock (`trainer.run.claim`:
        before each write into ``model_dir``)."""
        try:
            lost = self.lost_reason()
        except _storage_errors() as e:
            raise TrainerError(f"{self.path}: cannot read this run's lock "
                               f"({storage_reason(e)}); stopped without writing more "
                               "into --model_dir") from None
        if lost:
            raise TrainerError(f"{model_dir}: this run lost its lock ({lost}); stopped "
                               "without writing more (the run that holds it carries on "
                               "from the checkpoints)")


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


def backend(path: str):
    """The local-disk backend for plain paths, GCS's for gs://, gfile's for other schemes."""
    if path.startswith("gs://"):
        return gcs_backend(path)
    return GfileLockFile(path) if "://" in path else storage_lock.LocalLockFile(path)


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
    """A storage failure in a few words: the OS's reason for a connection
    (``Connection refused``), the HTTP status of a refused request (``404
    Not Found: ...``), the gist of anything else."""
    cause = getattr(error, "cause", None)  # google-api-core's RetryError: the last try's
    if isinstance(cause, BaseException):
        return f"{storage_reason(cause)}; gave up after {GCS_RETRY_SECONDS:.0f}s of retries"
    if isinstance(error, OSError) and error.strerror:
        return error.strerror
    status = _http_status(error)
    if status:
        return f"{status.value} {status.phrase}{_server_message(error)}"
    found = re.search(r"\[Errno -?\d+\] ([^'\")]+)|(\w+ timed out)", str(error))
    if found:
        return found.group(1) or found.group(2)
    if isinstance(error, (OSError, tf.errors.OpError)):
        return os_reason(error)
    return summarize_error(error)


def _http_status(error) -> HTTPStatus | None:
    """The HTTP status of a refused request (google-api-core's ``code``), if any."""
    code = getattr(error, "code", None)
    try:
        return HTTPStatus(code) if isinstance(code, int) else None
    except ValueError:
        return None


def _server_message(error) -> str:
    """``: MESSAGE`` from a GCS JSON error body (``{"error": {"message": ...}}``), else ""."""
    try:
        message = json.loads(error.response.text)["error"]["message"]
    except (AttributeError, ValueError, KeyError, TypeError):
        return ""
    return f": {message}" if isinstance(message, str) and message else ""


def _cannot_lock(path: str, reason: str) -> TrainerError:
    return TrainerError(f"{path}: cannot take the lock of --model_dir ({reason})")


def acquire(model_dir: str) -> RunLock:
    """Takes ``model_dir``'s lock or raises `TrainerError` naming its holder."""
    path = join_path(model_dir, storage_lock.LOCK_FILE)
    info = storage_lock.LockInfo.for_this_process(uuid.uuid4().hex[:12])
    try:
        store = backend(path)
        token, holder = storage_lock.claim(store, info, model_dir,
                                           gone=storage_lock.dead_hosts())
    except _storage_errors() as e:
        raise _cannot_lock(path, storage_reason(e)) from None
    if holder is not None and holder.unreadable:
        raise TrainerError(
            f"{path}: {holder.describe(time.time())}, so no run can be named as its "
            f"holder; remove it if no run is using {model_dir} (it is taken over once "
            f"{storage_lock.STALE_SECONDS:.0f}s old)")
    if holder is not None:
        raise TrainerError(
            f"{model_dir}: in use by {holder.describe(time.time())}; one run per "
            "--model_dir: wait for it to end or use another --model_dir (a dead "
            f"holder's lock is taken over after {storage_lock.STALE_SECONDS:.0f}s "
            "without heartbeat)")
    if token is None:
        raise TrainerError(f"{path}: other runs keep taking this lock; try again")
    return RunLock(path, store, info, token)
