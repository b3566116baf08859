"""One run per ``model_dir``: ``MODEL_DIR/.lock``, held by the chief for the whole run.

Two trainers writing one ``model_dir`` would restore each other's
half-trained checkpoints, save under the same names and leave the disk
holding a mix of both. So the chief takes ``MODEL_DIR/.lock`` before it
restores anything, with the mechanics of `mnist_contract.lockfile` (the
conversion job locks its output the same way): the lock names the run (id,
host, pid, start time), a background heartbeat keeps it fresh, and a second
run refuses with one line naming the holder, unless the holder is provably
dead (same host and its pid gone, or a heartbeat older than
``STALE_SECONDS``), whose lock it takes over with a warning. Before it
commits an export the run checks it still holds the lock.

Guarantees per filesystem (runs racing for a free or a dead holder's lock):

* local paths: exclusive create (``O_CREAT|O_EXCL``), so of two runs
  starting together exactly one wins; takeover is conditional (rename
  aside, check it is still the stale file).
* ``gs://``: the lock is a GCS object whose generation guards every write
  (`mnist_contract.lockfile.GcsLockObject`, through google-cloud-storage):
  created only if absent, refreshed only at the generation this run wrote,
  taken over by a delete at the generation judged stale. GCS decides each
  race, so exactly one run wins, and a run whose lock was taken over can
  no longer refresh it and does not commit. Each request waits
  `GCS_TIMEOUT_SECONDS` for the server and a failing one is retried for
  `GCS_RETRY_SECONDS`, so an unreachable server ends the start with one line
  in under a minute.
* other ``tf.io.gfile`` filesystems (``ram://``, plugins): gfile offers no
  create-if-absent, so `GfileLockFile` writes the lock under a unique
  temporary name, renames it into place without overwrite and reads it
  back: the run whose id it reads holds the lock. Where the rename's
  existence check and its write are separate steps, two runs starting in
  that window can both pass it; the read-back then names one of them and
  the other refuses, unless both read back before either write lands. The
  heartbeat rewrites the lock only after reading back its own id.
  (``ram://`` lives in one process's memory, so only its threads share it.)
"""

from __future__ import annotations

import json
import re
import time
import uuid
from http import HTTPStatus

import trainer  # noqa: F401  (sets TF_USE_LEGACY_KERAS before TF loads)
import tensorflow as tf

from mnist_contract import join_path
from mnist_contract import lockfile
from trainer.errors import TrainerError, os_reason, summarize_error

# Per request to GCS: (connect, read) seconds. Requests that fail in a way
# worth retrying (no connection, timeout, 429, 5xx) are retried with backoff
# for GCS_RETRY_SECONDS in all.
GCS_TIMEOUT_SECONDS = (5.0, 15.0)
GCS_RETRY_SECONDS = 30.0


class GfileLockFile:
    """The lock through ``tf.io.gfile``. A token is the lock's bytes as written."""

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


class RunLock(lockfile.HeldLock):
    """The held ``model_dir`` lock; `release` it when the run ends."""

    def check_held(self, model_dir: str) -> None:
        """Raises unless this run still holds the lock (called before committing)."""
        try:
            lost = self.lost_reason()
        except _storage_errors() as e:
            raise TrainerError(f"{self.path}: cannot read this run's lock "
                               f"({storage_reason(e)}); stopped without exporting") from None
        if lost:
            raise TrainerError(f"{model_dir}: this run lost its lock ({lost}); "
                               "stopped without exporting")


def gcs_backend(path: str) -> lockfile.GcsLockObject:
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
    bucket, name = lockfile.split_gs_path(path)
    try:
        client = storage.Client(project=None)
    except DefaultCredentialsError as e:
        raise _cannot_lock(path, f"no Google credentials: {summarize_error(e)}; run "
                                 "`gcloud auth application-default login` or set "
                                 "GOOGLE_APPLICATION_CREDENTIALS (a Cloud TPU VM uses "
                                 "its service account)") from None
    return lockfile.GcsLockObject(client.bucket(bucket), name,
                                  retry=DEFAULT_RETRY.with_timeout(GCS_RETRY_SECONDS),
                                  timeout=GCS_TIMEOUT_SECONDS)


def backend(path: str):
    """The local-disk backend for plain paths, GCS's for gs://, gfile's for other schemes."""
    if path.startswith("gs://"):
        return gcs_backend(path)
    return GfileLockFile(path) if "://" in path else lockfile.LocalLockFile(path)


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
    path = join_path(model_dir, lockfile.LOCK_FILE)
    info = lockfile.LockInfo.for_this_process(uuid.uuid4().hex[:12])
    try:
        store = backend(path)
        token, holder = lockfile.claim(store, info, model_dir)
    except _storage_errors() as e:
        raise _cannot_lock(path, storage_reason(e)) from None
    if holder is not None:
        raise TrainerError(
            f"{model_dir}: in use by {holder.describe(time.time())}; one run per "
            "--model_dir: wait for it to end or use another --model_dir (a dead "
            f"holder's lock is taken over after {lockfile.STALE_SECONDS:.0f}s "
            "without heartbeat)")
    if token is None:
        raise TrainerError(f"{path}: other runs keep taking this lock; try again")
    return RunLock(path, store, info, token)
