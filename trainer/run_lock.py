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

Guarantees per filesystem:

* local paths: exclusive create (``O_CREAT|O_EXCL``), so of two runs
  starting together exactly one wins; takeover is conditional (rename
  aside, check it is still the stale file).
* other ``tf.io.gfile`` filesystems (``gs://``, ``ram://``): gfile offers
  no create-if-absent, so `GfileLockFile` writes the lock under a unique
  temporary name, renames it into place without overwrite and reads it
  back: the run whose id it reads holds the lock. On ``gs://`` the
  rename's existence check and copy are separate requests, so two runs
  that start within that window (well under a second) can both pass it;
  the read-back then names one of them and the other refuses, except when
  both read back before either copy lands. The heartbeat rewrites the lock
  only after reading back its own id. This is the best gfile offers; the
  trainer's dependencies (TensorFlow, tf-keras, TensorBoard) include no
  GCS client with generation preconditions.
"""

from __future__ import annotations

import time
import uuid

import trainer  # noqa: F401  (sets TF_USE_LEGACY_KERAS before TF loads)
import tensorflow as tf

from mnist_contract import join_path
from mnist_contract import lockfile
from trainer.errors import TrainerError, os_reason


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
        lost = self.lost_reason()
        if lost:
            raise TrainerError(f"{model_dir}: this run lost its lock ({lost}); "
                               "stopped without exporting")


def backend(path: str):
    """The local-disk backend for plain paths, gfile's for every other scheme."""
    return GfileLockFile(path) if "://" in path else lockfile.LocalLockFile(path)


def acquire(model_dir: str) -> RunLock:
    """Takes ``model_dir``'s lock or raises `TrainerError` naming its holder."""
    path = join_path(model_dir, lockfile.LOCK_FILE)
    store = backend(path)
    info = lockfile.LockInfo.for_this_process(uuid.uuid4().hex[:12])
    try:
        token, holder = lockfile.claim(store, info, model_dir)
    except (OSError, tf.errors.OpError) as e:
        reason = e.strerror if isinstance(e, OSError) and e.strerror else os_reason(e)
        raise TrainerError(f"{path}: cannot take the lock of --model_dir ({reason})"
                           ) from None
    if holder is not None:
        raise TrainerError(
            f"{model_dir}: in use by {holder.describe(time.time())}; one run per "
            "--model_dir: wait for it to end or use another --model_dir (a dead "
            f"holder's lock is taken over after {lockfile.STALE_SECONDS:.0f}s "
            "without heartbeat)")
    if token is None:
        raise TrainerError(f"{path}: other runs keep taking this lock; try again")
    return RunLock(path, store, info, token)

