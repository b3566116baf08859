"""The ``--events`` file of ``mnist-launch-tpu run``: the run's journal.

`Journal.open` reads and checks the whole file before the launcher touches
the cloud, and holds it locked (``flock``) until the launcher exits, so two
launchers never follow one run. A damaged journal is refused in one line
naming the file and line (exit 2), as a journal is trusted for the counts
and the dead hosts it holds; one exception is the classic crash case, a
last line without its newline (a write cut short by a kill), which is
dropped with a warning. A journal whose unfinished run is another run's
(another VM, zone, project, accelerator, model_dir or kind of resource) is
refused too: its dead hosts would let this run's trainer take over a lock
that is not this run's. So is an unfinished run whose first line is not a
``started`` line naming it in full (`NAMED`, the run id included): nothing
would tell whose it is.
"""

from __future__ import annotations

import codecs
import fcntl
import json
import os
import stat
import sys
from pathlib import Path

from launch.tpu import commands as tc
from launch.tpu.config import TpuConfig
from mnist_common import console
from launch.tpu.spot.events import Standing, replay

# The fields `spot_events.Standing.apply` reads, and what each may hold.
COUNTS = {"step": 0, "total": 1, "recovery": 1}
# What a run's ``started`` line says of it (`identity`): all of it.
NAMED = ("name", "zone", "project", "accelerator_type", "model_dir", "queued", "run_id")


class JournalError(Exception):
    """The journal cannot be used; the message is one line."""

    def __init__(self, message: str, code: int = console.BAD_INPUT):
        super().__init__(message)
        self.code = code


def identity(cfg: TpuConfig) -> dict:
    """What makes a run the same run for its journal; its run id (the mark
    on its VM) once known."""
    run = {"name": cfg.name, "zone": cfg.zone, "project": cfg.project,
           "accelerator_type": cfg.accelerator_type, "model_dir": cfg.model_dir,
           "queued": cfg.queued}
    if cfg.run_id is not None:
        run["run_id"] = cfg.run_id
    return run


def _count_problem(key: str, value) -> str | None:
    if value is None or (type(value) is int and value >= COUNTS[key]):
        return None
    return f'"{key}" is {json.dumps(value)}, not a whole number >= {COUNTS[key]}'


def _redo_problem(value) -> str | None:
    if value is None:
        return None
    if (isinstance(value, list) and len(value) == 2 and type(value[0]) is int
            and value[0] >= 0 and (value[1] is None or (type(value[1]) is int
                                                      and value[1] >= value[0]))):
        return None
    return f'"redo" is {json.dumps(value)}, not [least, most] steps'


def record_problem(record) -> str | None:
    """What is wrong with one journal line's JSON value (None: nothing)."""
    if not isinstance(record, dict):
        return f"{type(record).__name__}, not a JSON object"
    if not isinstance(record.get("event"), str):
        return 'no "event" name'
    for key in COUNTS:
        problem = _count_problem(key, record.get(key))
        if problem:
            return problem
    hosts = record.get("hosts", [])
    if not (isinstance(hosts, list) and all(isinstance(h, str) for h in hosts)):
        return f'"hosts" is {json.dumps(hosts)}, not a list of host names'
    if not isinstance(record.get("run", {}), dict):
        return f'"run" is {json.dumps(record["run"])}, not a JSON object'
    if not isinstance(record.get("vm", ""), str):
        return f'"vm" is {json.dumps(record["vm"])}, not a VM name'
    if record["event"] in ("preempted", "resumed"):
        return _redo_problem(record.get("redo"))
    return None


class Journal:
    """An open journal, locked for this launcher; `append` writes a record."""

    def __init__(self, path: Path, fd: int):
        self.path, self.fd = path, fd

    @classmethod
    def open(cls, path: Path, run: dict) -> tuple["Journal", Standing]:
        """The journal at ``path`` (made if missing) and the `Standing` of
        its unfinished run; `JournalError` when it cannot be used."""
        if path.is_dir():
            raise JournalError(f"{path}: a directory, not a journal file (--events)")
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o644)
        except OSError as exc:
            raise JournalError(f"{path}: cannot open the journal for writing "
                               f"({exc.strerror})") from None
        journal = cls(path, fd)
        try:
            journal._lock()
            standing = replay(journal._records())
            _check_same_run(path, standing, run)
        except BaseException:
            journal.close()
            raise
        return journal, standing

    def _lock(self) -> None:
        if not stat.S_ISREG(os.fstat(self.fd).st_mode):
            raise JournalError(f"{self.path}: not a regular file (--events)")
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise JournalError(f"{self.path}: in use by another launcher of this run; "
                               "let it end, or pass another --events file",
                               console.FAILURE) from None

    def _records(self) -> list[tuple[int, dict]]:
        """Each line's record, checked; a torn last line is cut off."""
        data = self._read_all()
        *whole, last = data.split(b"\n")
        records = [(number, self._checked(number, raw))
                   for number, raw in enumerate(whole, 1) if raw.strip()]
        if not last.strip():
            return records
        number = len(whole) + 1
        if _torn(last) and not records:
            raise JournalError(f"{self.path}: line {number}: not a journal: no whole "
                               "record, only the start of one (--events)")
        if _torn(last):
            print(f"warning: {self.path}: line {number}: an unfinished last line "
                  "(a write cut short by a kill), dropped", file=sys.stderr)
            os.ftruncate(self.fd, len(data) - len(last))
            return records
        records.append((number, self._checked(number, last)))
        os.write(self.fd, b"\n")  # a whole record but for its newline
        return records

    def _read_all(self) -> bytes:
        os.lseek(self.fd, 0, os.SEEK_SET)
        chunks = []
        while chunk := os.read(self.fd, 1 << 20):
            chunks.append(chunk)
        return b"".join(chunks)

    def _checked(self, number: int, raw: bytes) -> dict:
        where = f"{self.path}: line {number}"
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise JournalError(f"{where}: not UTF-8 text (byte {exc.start + 1})") from None
        try:
            record = json.loads(text)
        except ValueError as exc:
            raise JournalError(f"{where}: not a JSON object ({exc})") from None
        problem = record_problem(record)
        if problem:
            raise JournalError(f"{where}: {problem}")
        return record

    def append(self, record: dict) -> None:
        os.write(self.fd, (json.dumps(record, sort_keys=True) + "\n").encode())

    def close(self) -> None:
        os.close(self.fd)


def _torn(raw: bytes) -> bool:
    """A last line cut short while it was written: the start of a record,
    valid UTF-8 but maybe for a character cut at its end, not yet JSON."""
    try:
        text = codecs.getincrementaldecoder("utf-8")().decode(raw, final=False)
        json.loads(text)
    except UnicodeDecodeError:
        return False
    except ValueError:
        return text.lstrip().startswith("{")
    return False


def _check_same_run(path: Path, standing: Standing, run: dict) -> None:
    """`JournalError` when the journal's unfinished run is another one: its
    ``started`` event names another run, or an event another VM."""
    known, line = dict(standing.run or {}), standing.run_line
    if standing.run is None and standing.vm_named is not None:
        (known["name"], line) = standing.vm_named
    differ = [f"{key} {known[key]!r}, not {value!r}"
              for key, value in run.items() if key in known and known[key] != value]
    if differ:
        raise JournalError(f"{path}: line {line}: the journal of another "
                           f"run, not yet ended ({'; '.join(differ)}); pass another "
                           "--events file, or end that run with its own command")
    problem = _unnamed(standing)
    if problem:
        raise JournalError(f"{path}: {problem}; pass another --events file")


def _unnamed(standing: Standing) -> str | None:
    """Why the journal's unfinished run is not known to be anyone's, or
    None: its first line is a ``started`` one naming the whole run."""
    if not standing.events:
        return None
    if standing.run is None or standing.run_line != standing.first_line:
        return (f'line {standing.first_line}: a run that no "started" line names '
                "before it, so not known to be this run")
    missing = [key for key in NAMED if key not in standing.run]
    if missing:
        return (f'line {standing.run_line}: "started" does not name its run '
                f"(no {', '.join(missing)})")
    run_id = standing.run["run_id"]
    if not (isinstance(run_id, str) and tc.RUN_ID_RE.fullmatch(run_id)):
        return f'line {standing.run_line}: "run_id" is {json.dumps(run_id)}, not a run id'
    return None
