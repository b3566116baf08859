"""One writer per output: a lock object created exclusively, kept fresh by a heartbeat.

Two runs writing one output would delete each other's temp folders and
publish over each other. So before touching the output a run creates
``OUTPUT/.lock`` with an exclusive create: ``O_CREAT|O_EXCL`` on a local
disk, ``if_generation_match=0`` (create only if absent) on ``gs://``. The
lock names the run (id, host, pid, start time) and carries a heartbeat that
a background thread refreshes while the run lives: locally the file's mtime
(touching it never replaces anyone's content), on GCS a rewrite guarded by
``if_generation_match=<our generation>``, which fails instead of overwriting
a lock someone else took.

A second run refuses with one line naming the holder, unless the holder is
provably dead: same host and its pid gone, or a heartbeat older than
`STALE_SECONDS`. Such a lock is taken over with a warning; the takeover is
itself conditional (GCS: delete at the stale generation; local: rename aside,
then check it is still the stale file), so two runs racing for a dead lock
cannot both win. The lock is released when the run ends, successfully or not.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import socket
import threading
import time
from typing import Optional

import mnist_contract as contract

from pipeline import _compat, storage
from pipeline.errors import PipelineInputError

LOCK_FILE = ".lock"
HEARTBEAT_SECONDS = 10.0
STALE_SECONDS = 300.0


@dataclasses.dataclass(frozen=True)
class LockInfo:
    run_id: str
    host: str
    pid: int
    started: float
    heartbeat: float

    def to_bytes(self) -> bytes:
        return json.dumps(dataclasses.asdict(self), sort_keys=True).encode()

    @classmethod
    def from_bytes(cls, data: bytes, heartbeat: float) -> "LockInfo":
        """Parses a lock; an unreadable one (half written) counts as an unknown holder."""
        try:
            raw = json.loads(data.decode())
            return cls(str(raw["run_id"]), str(raw["host"]), int(raw["pid"]),
                       float(raw["started"]), max(float(raw["heartbeat"]), heartbeat))
        except (ValueError, KeyError, TypeError, AttributeError):
            return cls("?", "?", -1, heartbeat, heartbeat)

    def describe(self, now: float) -> str:
        started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.started))
        return (f"run {self.run_id} (host {self.host}, pid {self.pid}, started "
                f"{started}, heartbeat {max(0, now - self.heartbeat):.0f}s ago)")


def dead_reason(info: LockInfo, now: float, host: Optional[str] = None) -> str:
    """Why the holder is provably dead, or "" if it may be alive."""
    if now - info.heartbeat > STALE_SECONDS:
        return f"heartbeat {now - info.heartbeat:.0f}s old (> {STALE_SECONDS:.0f}s)"
    if info.host == (host or socket.gethostname()) and info.pid > 0:
        try:
            os.kill(info.pid, 0)
        except ProcessLookupError:
            return f"pid {info.pid} is gone on this host"
        except PermissionError:
            pass
    return ""


class _Local:
    """The lock as a local file. A token is (content, mtime_ns): what was judged."""

    def __init__(self, path: str):
        self.path = path

    def create(self, data: bytes):
        try:
            fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            return None
        try:
            try:
                os.write(fd, data)
                os.fsync(fd)
            finally:
                os.close(fd)
        except OSError:  # e.g. disk full: leave no empty lock behind
            os.unlink(self.path)
            raise
        return self.read()[1]

    def read(self):
        try:
            with open(self.path, "rb") as f:
                data = f.read()
                mtime_ns = os.fstat(f.fileno()).st_mtime_ns
        except FileNotFoundError:
            return None
        return data, (data, mtime_ns), mtime_ns / 1e9

    def refresh(self, token, data: bytes):
        current = self.read()
        if current is None or current[1][0] != token[0]:
            return None
        os.utime(self.path)
        return self.read()[1]

    def delete_if(self, token) -> bool:
        aside = f"{self.path}.taking-{os.getpid()}-{time.monotonic_ns()}"
        try:
            os.rename(self.path, aside)
        except FileNotFoundError:
            return False
        with open(aside, "rb") as f:
            same = (f.read(), os.fstat(f.fileno()).st_mtime_ns) == token
        if not same:  # refreshed or replaced since it was judged: put it back
            try:
                os.link(aside, self.path)
            except FileExistsError:
                pass
        os.unlink(aside)
        return same


class _Gcs:
    """The lock as a GCS object. A token is its generation."""

    def __init__(self, path: str):
        storage.use_anonymous_gcs_for_emulator()
        bucket, self.name = path[len("gs://"):].split("/", 1)
        self.bucket = _compat.gcs_bucket(bucket)

    def blob(self):
        return self.bucket.blob(self.name)

    @staticmethod
    def retry():
        """Beam's GCS retry policy, with the deadline `storage.configure_gcs` gave it."""
        return _compat.gcs_retry()

    def create(self, data: bytes):
        from google.api_core import exceptions
        blob = self.blob()
        try:
            blob.upload_from_string(data, if_generation_match=0, retry=self.retry())
        except exceptions.PreconditionFailed:
            return None
        return blob.generation

    def read(self):
        from google.api_core import exceptions
        try:
            blob = self.bucket.get_blob(self.name, retry=self.retry())
            if blob is None:
                return None
            generation = blob.generation
            data = blob.download_as_bytes(if_generation_match=generation,
                                          retry=self.retry())
        except (exceptions.NotFound, exceptions.PreconditionFailed):
            return None  # gone, or replaced since: the caller tries again
        return data, generation, 0.0

    def refresh(self, token, data: bytes):
        from google.api_core import exceptions
        blob = self.blob()
        try:
            blob.upload_from_string(data, if_generation_match=token, retry=self.retry())
        except (exceptions.PreconditionFailed, exceptions.NotFound):
            return None
        return blob.generation

    def delete_if(self, token) -> bool:
        from google.api_core import exceptions
        try:
            self.blob().delete(if_generation_match=token, retry=self.retry())
        except (exceptions.PreconditionFailed, exceptions.NotFound):
            return False
        return True


class OutputLock:
    """A held lock; `release` it when the run ends. Built by `acquire`."""

    def __init__(self, output: str, backend, info: LockInfo, token):
        self.output = output
        self.path = contract.join_path(output, LOCK_FILE)
        self._backend = backend
        self._info = info
        self._token = token
        self._mutex = threading.Lock()
        self._stop = threading.Event()
        self.lost = ""
        self._thread = threading.Thread(target=self._beat, daemon=True,
                                        name=f"lock-heartbeat-{info.run_id}")
        self._thread.start()

    def _beat(self) -> None:
        while not self._stop.wait(HEARTBEAT_SECONDS):
            try:
                self.refresh()
            except Exception as e:  # storage hiccup: the next beat retries
                logging.warning("Could not refresh the lock %s: %s", self.path, e)

    def refresh(self) -> None:
        with self._mutex:
            if self.lost or self._token is None:
                return
            info = dataclasses.replace(self._info, heartbeat=time.time())
            token = self._backend.refresh(self._token, info.to_bytes())
            if token is None:
                self.lost = "the lock was taken over or removed by another run"
                logging.error("%s: %s", self.path, self.lost)
            else:
                self._info, self._token = info, token

    def check_held(self) -> None:
        """Raises unless this run still holds the lock (called before publishing)."""
        current = self._backend.read()
        if current is not None and not self.lost:
            info = LockInfo.from_bytes(current[0], current[2])
            if info.run_id == self._info.run_id:
                return
            self.lost = f"the lock is now held by {info.describe(time.time())}"
        raise PipelineInputError(
            f"{self.output}: this run lost its lock ({self.lost or 'lock removed'}); "
            "not publishing, the output was left as it was")

    def release(self) -> None:
        self._stop.set()
        if self._thread is not threading.current_thread():
            self._thread.join(timeout=30)
        with self._mutex:
            token, self._token = self._token, None
            if token is None or self.lost:
                return
            try:
                if not self._backend.delete_if(token):
                    logging.warning("%s: not releasing, another run holds it now",
                                    self.path)
            except Exception as e:  # the run's outcome stands; say what is left
                logging.warning("Could not release the lock %s (%s); the next run "
                                "takes it over once this process is gone", self.path, e)


def acquire(output: str, run_id: str) -> OutputLock:
    """Takes the output's lock or raises `PipelineInputError` naming its holder.

    Storage failures (unwritable, full, unreachable) propagate as OSError or
    the client's exception for the caller to report.
    """
    path = contract.join_path(output, LOCK_FILE)
    backend = _Gcs(path) if path.startswith("gs://") else _Local(path)
    now = time.time()
    info = LockInfo(run_id, socket.gethostname(), os.getpid(), now, now)
    for _ in range(5):
        token = backend.create(info.to_bytes())
        if token is not None:
            return OutputLock(output, backend, info, token)
        current = backend.read()
        if current is None:
            continue  # released between our create and read: try again
        data, token, heartbeat = current
        holder = LockInfo.from_bytes(data, heartbeat)
        if holder.run_id == run_id:  # our create succeeded, its reply was lost and retried
            return OutputLock(output, backend, info, token)
        now = time.time()
        reason = dead_reason(holder, now)
        if not reason:
            raise PipelineInputError(
                f"{output}: locked by {holder.describe(now)}; another run is writing "
                f"here: wait for it to end (a dead holder's lock is taken over "
                f"automatically after {STALE_SECONDS:.0f}s without heartbeat)")
        if backend.delete_if(token):
            logging.warning("%s: taking over the lock of %s: %s", output,
                            holder.describe(now), reason)
    raise PipelineInputError(f"{output}: could not take the lock {path}: other runs "
                             "keep taking it; try again")
