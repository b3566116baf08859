"""One writer per folder: a lock file created exclusively, kept fresh by a heartbeat.

Two writers in one folder undo each other's work: two conversion jobs would
delete each other's temp folders and publish over each other, two trainers
would restore each other's half-trained checkpoints and save under the same
names. So the job locks its output (`pipeline.publish.lock`) and the
trainer its ``model_dir`` (`trainer.run.lock`) with ``FOLDER/.lock``,
created only if absent. The lock names its run (id, host, pid, start time)
and carries a heartbeat that a background thread refreshes every
`HEARTBEAT_SECONDS` while the run lives. A second run refuses with one line
naming the holder, unless the holder is provably dead: same host and its
pid gone, a heartbeat older than `STALE_SECONDS` on the storage's clock
(`heartbeat_age`: the holder's own clock never counts), or a host that the
caller names as gone in `DEAD_HOSTS_ENV` (the TPU launcher names the hosts
of a VM it has deleted, whose holder would otherwise count as live for
`STALE_SECONDS` after its last heartbeat) unless it is this host and the
holder's pid lives. Such a lock is taken
over with a warning, and the takeover is itself conditional, so two runs
racing for a dead holder's lock cannot both win. A run checks that it still
holds the lock before it publishes what it wrote, and releases the lock
when it ends, successfully or not.

The guarantee per filesystem, for runs racing for a free or a dead
holder's lock:

=============  ============================================================
filesystem     backend and guarantee
=============  ============================================================
local disk     `LocalLockFile`. Created with ``O_CREAT|O_EXCL``; the
               heartbeat is the file's mtime (a touch never replaces
               anyone's content); a takeover renames the stale file aside
               and checks it is still the one judged. Of two runs starting
               together exactly one wins.
``gs://``      `GcsLockObject`. Every write is conditional on the object's
               generation: created only if absent (``if_generation_match=0``),
               refreshed only at the generation this run wrote, taken over
               by a delete at the generation judged stale. GCS decides each
               race (HTTP 412 to the loser), so exactly one run wins, and a
               run whose lock was taken over can no longer refresh it. The
               heartbeat is the object's update time (GCS's clock).
other gfile    `GfileLockFile` (``tf.io.gfile``: TensorFlow is imported
schemes        only when such a lock is used, by the trainer). gfile has
(``ram://``,   no create-if-absent: the lock is written under a unique
plugins)       temporary name, renamed into place without overwrite and
               read back, and the run whose id it reads holds it; the
               heartbeat rewrites it only after reading back its own id.
               Where the rename's existence check and its write are
               separate steps, two runs starting in that window can both
               pass it; the read-back then names one and the other refuses,
               unless both read back before either write lands. (``ram://``
               lives in one process's memory: only its threads share it.)
=============  ============================================================

The parts:

* `LockInfo`: what a lock says of its holder and the one line that names it;
* `dead_reason`: when a holder is provably dead;
* `LocalLockFile`, `GcsLockObject`, `GfileLockFile`: the backends above,
  and `backend_for`, which picks one for a path. `GcsLockObject` is given
  a google-cloud-storage bucket (the job reaches GCS through Beam's
  client, the trainer through its own) and imports google-api-core only
  when a GCS lock is used, so this module imports with the standard
  library alone;
* `HeldLock`: a held lock with its heartbeat thread, its refresh, its
  check that it is still held (`HeldLock.raise_if_lost`) and its release;
* `claim`: create the lock, or take over a dead holder's; `acquire`: claim
  it as a `HeldLock`, or raise `LockRefused` naming the live holder.

The job (`pipeline.publish.lock`) and the trainer (`trainer.run.lock`) add
only their messages and their choice of backend.

A backend offers ``create(data) -> token | None`` (None: the lock exists),
``read() -> (data, token, heartbeat) | None``, ``refresh(token, data) ->
token | None`` (None: no longer ours) and ``delete_if(token) -> bool``
(delete only the lock that was judged).
"""

from __future__ import annotations

import dataclasses
import errno
import json
import logging
import math
import os
import socket
import threading
import time
import uuid
from typing import Optional

from mnist_common import local_paths
from mnist_common.flags import SECONDS, EnvironmentValueError, environ_number

LOCK_FILE = ".lock"
HEARTBEAT_ENV = "MNIST_LOCK_HEARTBEAT_SECONDS"
STALE_ENV = "MNIST_LOCK_STALE_SECONDS"
_ENV_PROBLEMS: list = []


def _env_seconds(name: str, default: float) -> float:
    """``$name`` as seconds (`mnist_common.flags.Number`); a value refused is
    kept for `check_environment`, which every program calls before it runs
    and `acquire` before it takes a lock, so the default never stands in."""
    try:
        return environ_number(name, SECONDS, default)
    except EnvironmentValueError as e:
        _ENV_PROBLEMS.append(str(e))
        return default


# Read here, at import, from the environment when set there: tests that run a
# job or trainer as a process shorten them (in-process tests patch them).
HEARTBEAT_SECONDS = _env_seconds(HEARTBEAT_ENV, 10.0)
STALE_SECONDS = _env_seconds(STALE_ENV, 300.0)


def check_environment() -> None:
    """`EnvironmentValueError` (one line naming the variable) when
    `HEARTBEAT_ENV` or `STALE_ENV` holds no `SECONDS` (finite, > 0, at most 10**9)."""
    if _ENV_PROBLEMS:
        raise EnvironmentValueError(_ENV_PROBLEMS[0])


# Comma-separated host names known to be gone (deleted VMs): a lock held
# from one of them is taken over at once.
DEAD_HOSTS_ENV = "MNIST_LOCK_DEAD_HOSTS"


def dead_hosts(environ=None) -> frozenset:
    """The host names `DEAD_HOSTS_ENV` lists (none when it is unset)."""
    value = (os.environ if environ is None else environ).get(DEAD_HOSTS_ENV, "")
    return frozenset(h.strip() for h in value.split(",") if h.strip())


@dataclasses.dataclass(frozen=True)
class LockInfo:
    run_id: str
    host: str
    pid: int
    started: float
    heartbeat: float

    @classmethod
    def for_this_process(cls, run_id: str) -> "LockInfo":
        now = time.time()
        return cls(run_id, socket.gethostname(), os.getpid(), now, now)

    def to_bytes(self) -> bytes:
        return json.dumps(dataclasses.asdict(self), sort_keys=True).encode()

    @classmethod
    def from_bytes(cls, data: bytes, heartbeat: float) -> "LockInfo":
        """Parses a lock; an unreadable one (half written) counts as an unknown holder.

        ``heartbeat``: the storage's time of the lock's last write (a local
        file's mtime, a GCS object's update time), the one the judgment
        trusts (`heartbeat_age`); the content's own heartbeat is the holder's
        clock, used only where the storage keeps no time (0.0).
        """
        try:
            raw = json.loads(data.decode())
            return cls(str(raw["run_id"]), str(raw["host"]), int(raw["pid"]),
                       float(raw["started"]),
                       heartbeat if heartbeat > 0 else float(raw["heartbeat"]))
        except (ValueError, KeyError, TypeError, AttributeError):
            return cls("?", "?", -1, heartbeat, heartbeat)

    @property
    def unreadable(self) -> bool:
        """Parsed from bytes that name no run (empty, half written, garbage)."""
        return self.run_id == "?" and self.pid == -1

    def describe(self, now: float) -> str:
        """One line naming the holder; its fields are escaped (`shown`), so
        a lock's content cannot break the line."""
        beat = _beat_ago(self.heartbeat, now)
        if self.unreadable:
            return (f"an unreadable lock file (empty or not a run's JSON), last written "
                    f"{beat}")
        return (f"run {shown(self.run_id)} (host {shown(self.host)}, pid {self.pid}, "
                f"started {_stamp(self.started)}, heartbeat {beat})")


def shown(text: str) -> str:
    """``text`` for a one-line message: as is when printable, else quoted and
    escaped as Python's repr (``'a\\nerror: b'``)."""
    return text if text.isprintable() and text.strip() == text and text else repr(text)


def _stamp(seconds: float) -> str:
    """``2026-12-07T03:00:00Z``, or ``?`` for a time no calendar holds."""
    try:
        return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(seconds))
    except (OverflowError, OSError, ValueError):
        return "?"


def heartbeat_age(heartbeat: float, now: float) -> float:
    """Seconds since ``heartbeat`` (`LockInfo.from_bytes`: the storage's time
    of the last write); ``inf`` for none: not finite, or more than
    `STALE_SECONDS` ahead of ``now`` (no clock runs that far off, so no live
    run wrote it). A smaller lead is clock skew, age 0."""
    if not math.isfinite(heartbeat) or heartbeat > now + STALE_SECONDS:
        return math.inf
    return max(0.0, now - heartbeat)


def _beat_ago(heartbeat: float, now: float) -> str:
    age = heartbeat_age(heartbeat, now)
    return f"{age:.0f}s ago" if math.isfinite(age) else "none (not finite, or in the future)"


def dead_reason(info: LockInfo, now: float, host: Optional[str] = None,
                gone: frozenset = frozenset()) -> str:
    """Why the holder is provably dead, or "" if it may be alive. ``gone``:
    hosts the caller knows are gone (`dead_hosts`).

    On the holder's own host its pid is the proof either way: gone, the
    holder is dead; alive, the host is not gone, whatever ``gone`` says (a
    hand-set `DEAD_HOSTS_ENV` naming this host never takes a live run's
    lock). A heartbeat older than `STALE_SECONDS` still counts as dead: a
    stopped process (SIGSTOP, a frozen VM) keeps its pid. The heartbeat is
    the storage's time (`LockInfo.from_bytes`), judged by `heartbeat_age`.
    """
    alive_here = False
    if info.host == (host or socket.gethostname()) and info.pid > 0:
        if not _pid_alive(info.pid):
            return f"pid {info.pid} is gone on this host"
        alive_here = True
    age = heartbeat_age(info.heartbeat, now)
    if age > STALE_SECONDS:
        return (f"heartbeat {age:.0f}s old (> {STALE_SECONDS:.0f}s)" if math.isfinite(age)
                else "no valid heartbeat (not finite, or in the future)")
    if info.host in gone and not alive_here:
        return f"its host {shown(info.host)} is gone ({DEAD_HOSTS_ENV})"
    if info.host in gone:
        logging.warning("%s names %s as gone, but pid %d lives on it: the lock is not "
                        "taken over", DEAD_HOSTS_ENV, shown(info.host), info.pid)
    return ""


def _pid_alive(pid: int) -> bool:
    """Whether ``pid`` exists on this host (one of another user's counts)."""
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, OverflowError):  # OverflowError: no pid is that large
        return False
    except PermissionError:
        pass
    return True


class NotALockFile(OSError):
    """A local lock's path holds a symbolic link: no run's lock, never released."""


class LocalLockFile:
    """The lock as a local file. A token is (content, mtime_ns): what was judged."""

    def __init__(self, path: str):
        self.path = path

    def create(self, data: bytes):
        try:
            fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            if os.path.islink(self.path):  # no run's lock: no run ever releases it
                raise NotALockFile(errno.ELOOP, f"a symbolic link to {os.readlink(self.path)}"
                                   ", not a lock file; remove it", self.path) from None
            return None
        try:
            try:
                os.write(fd, data)
                os.fsync(fd)
            finally:
                os.close(fd)
        except OSError:  # e.g. disk full: leave no empty lock behind
            local_paths.remove_file(self.path)
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
            local_paths.move(self.path, aside, overwrite=False)
        except FileNotFoundError:
            return False
        with open(aside, "rb") as f:
            same = (f.read(), os.fstat(f.fileno()).st_mtime_ns) == token
        if not same:  # refreshed or replaced since it was judged: put it back
            try:
                os.link(aside, self.path)
            except FileExistsError:
                pass
        local_paths.remove_file(aside)
        return same


def split_gs_path(path: str) -> tuple[str, str]:
    """``gs://BUCKET/NAME`` as ``(BUCKET, NAME)``."""
    bucket, _, name = path[len("gs://"):].partition("/")
    if not path.startswith("gs://") or not bucket or not name:
        raise ValueError(f"{path}: not a gs://BUCKET/OBJECT path")
    return bucket, name


class GcsLockObject:
    """The lock as a GCS object. A token is its generation (the guarantee:
    the module's table). The heartbeat is the object's update time: the
    storage's clock, set by each refresh, whatever the holder's clock says.
    ``bucket`` is a ``google.cloud.storage.Bucket``; ``retry``
    (a ``google.api_core.retry.Retry``) and ``timeout`` (seconds, or a
    (connect, read) pair), when given, go with every request, else the
    library's defaults do.
    """

    def __init__(self, bucket, name: str, retry=None, timeout=None):
        self.bucket = bucket
        self.name = name
        self._request = {key: value for key, value in
                         (("retry", retry), ("timeout", timeout)) if value is not None}

    def create(self, data: bytes):
        from google.api_core import exceptions
        blob = self.bucket.blob(self.name)
        try:
            blob.upload_from_string(data, if_generation_match=0, **self._request)
        except exceptions.PreconditionFailed:
            return None
        return blob.generation

    def read(self):
        from google.api_core import exceptions
        try:
            blob = self.bucket.get_blob(self.name, **self._request)
            if blob is None:
                return None
            generation = blob.generation
            data = blob.download_as_bytes(if_generation_match=generation, **self._request)
        except (exceptions.NotFound, exceptions.PreconditionFailed):
            return None  # gone, or replaced since: the caller tries again
        return data, generation, blob.updated.timestamp() if blob.updated else 0.0

    def refresh(self, token, data: bytes):
        from google.api_core import exceptions
        blob = self.bucket.blob(self.name)
        try:
            blob.upload_from_string(data, if_generation_match=token, **self._request)
        except (exceptions.PreconditionFailed, exceptions.NotFound):
            return None
        return blob.generation

    def delete_if(self, token) -> bool:
        from google.api_core import exceptions
        try:
            self.bucket.blob(self.name).delete(if_generation_match=token, **self._request)
        except (exceptions.PreconditionFailed, exceptions.NotFound):
            return False
        return True


class GfileLockFile:
    """The lock through ``tf.io.gfile``, for the schemes with no create-if-absent
    (its guarantee: the module's table). A token is the lock's bytes as written."""

    def __init__(self, path: str):
        self.path = path

    def create(self, data: bytes):
        tf = _tensorflow()
        if tf.io.gfile.exists(self.path):
            return None
        temp = self._write_temp(data)
        try:
            local_paths.move(temp, self.path, overwrite=False)
        except (tf.errors.AlreadyExistsError, FileExistsError):
            local_paths.remove_file(temp)
            return None
        current = self.read()
        return data if current is not None and current[0] == data else None

    def _write_temp(self, data: bytes) -> str:
        """``data`` in a new file beside the lock, not named after it (ram://
        takes a path that prefixes another as existing)."""
        folder, name = self.path.rsplit("/", 1)
        temp = f"{folder}/.new-{uuid.uuid4().hex}{name}"
        with _tensorflow().io.gfile.GFile(temp, "wb") as f:
            f.write(data)
        return temp

    def read(self):
        tf = _tensorflow()
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
        local_paths.move(self._write_temp(data), self.path, overwrite=True)
        return data

    def delete_if(self, token) -> bool:
        tf = _tensorflow()
        current = self.read()
        if current is None or current[0] != token:
            return False
        try:
            local_paths.remove_file(self.path)
        except (tf.errors.NotFoundError, FileNotFoundError):
            return False
        return True


def _tensorflow():
    """TensorFlow, imported by the first gfile lock (its caller, the trainer,
    has chosen its Keras by then)."""
    import tensorflow as tf
    return tf


def backend_for(path: str, gcs, other_schemes=LocalLockFile):
    """The backend of the lock at ``path``: `LocalLockFile` for a plain path,
    ``gcs(path)`` for ``gs://``, ``other_schemes(path)`` for any other scheme."""
    if path.startswith("gs://"):
        return gcs(path)
    return other_schemes(path) if "://" in path else LocalLockFile(path)


class HeldLock:
    """A held lock; `release` it when the run ends. Built from `claim`'s token."""

    def __init__(self, path: str, backend, info: LockInfo, token):
        self.path = path
        self.run_id = info.run_id
        self._backend = backend
        self._info = info
        self._token = token
        # Re-entrant: a signal handler may release the lock while the main
        # thread, which it interrupted, is releasing it.
        self._mutex = threading.RLock()
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

    def lost_reason(self) -> str:
        """"" while this run still holds the lock, else why not (reads the lock)."""
        current = self._backend.read()
        if current is not None and not self.lost:
            info = LockInfo.from_bytes(current[0], current[2])
            if info.run_id == self._info.run_id:
                return ""
            self.lost = f"the lock is now held by {info.describe(time.time())}"
        return self.lost or "lock removed"

    def raise_if_lost(self, refusal) -> None:
        """Raises ``refusal(reason)`` unless this run still holds the lock
        (checked before writing into or publishing the folder)."""
        lost = self.lost_reason()
        if lost:
            raise refusal(lost)

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


def claim(backend, info: LockInfo, where: str, gone: frozenset = frozenset()):
    """Creates the lock, taking over a provably dead holder's (with a warning);
    ``gone``: hosts known to be gone (`dead_reason`).

    Returns ``(token, None)`` once this run holds it, ``(None, holder)`` while
    a live run holds it, ``(None, None)`` if other runs kept taking it.
    Storage failures propagate for the caller to report.
    """
    for _ in range(5):
        token = backend.create(info.to_bytes())
        if token is not None:
            return token, None
        current = backend.read()
        if current is None:
            continue  # released between our create and read: try again
        data, token, heartbeat = current
        holder = LockInfo.from_bytes(data, heartbeat)
        if holder.run_id == info.run_id:  # our create succeeded, its reply was lost
            return token, None
        now = time.time()
        reason = dead_reason(holder, now, gone=gone)
        if not reason:
            return None, holder
        if backend.delete_if(token):
            logging.warning("%s: taking over the lock of %s: %s", where,
                            holder.describe(now), reason)
    return None, None



class LockRefused(Exception):
    """`acquire` did not get the lock: ``holder`` (a `LockInfo`) holds it and
    lives, or is None when other runs kept taking it."""

    def __init__(self, path: str, holder: Optional[LockInfo]):
        super().__init__(f"{path}: " + (f"locked by {holder.describe(time.time())}"
                                        if holder else "other runs keep taking it"))
        self.holder = holder


def acquire(path: str, backend, run_id: str, where: str, gone: frozenset = frozenset(),
            held=HeldLock) -> HeldLock:
    """Takes the lock at ``path`` through ``backend`` as ``held`` (`HeldLock`
    or a subclass) or raises `LockRefused`; ``where`` names the folder in
    warnings, ``gone`` as for `claim`. Storage failures propagate."""
    check_environment()
    info = LockInfo.for_this_process(run_id)
    token, holder = claim(backend, info, where, gone)
    if token is None:
        raise LockRefused(path, holder)
    return held(path, backend, info, token)
