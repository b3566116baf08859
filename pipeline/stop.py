"""The job's stop on SIGINT, SIGTERM or SIGHUP: one line, exit 128+N, lock and temp gone.

The policy of the conversion job, built on `mnist_common.stop` (the
`Stopped` exception, the handlers, `deferred`); what the user sees is in
docs/pipeline.md ("Flags and behaviour", Signals).

Python runs signal handlers in the main thread, between two bytecodes of
whatever code runs there. So the handler raises `Stopped`, a BaseException:
library code that catches ``Exception`` (Beam's file systems, Google's
retries) neither wraps nor swallows it, and the job's own ``except
Stopped`` blocks clean up and report.

Beam's runner is the exception: it wraps whatever a DoFn raises (a
KeyboardInterrupt becomes ``RuntimeError: KeyboardInterrupt [while running
...]``), and under ``--direct_running_mode=multi_processing`` an interrupt
while it starts its workers leaves it waiting for them forever, the lock's
heartbeat still fresh. So the graph runs on a thread of its own
(`run_in_thread`), started with these signals blocked: that thread, the
threads it starts and the worker processes they spawn (which inherit the
blocked mask) never receive them, even when a terminal's Ctrl-C reaches the
whole process group. On a stop the main thread sets `requested` (in-process
workers stop at their next batch, `raise_if_requested`), kills the worker
processes (again while the run's thread may be starting more) and waits a
bounded time for them to be dead, or for that thread to end if it had none.
From then on only the main thread writes to stderr, so the job's one line is
the last.

A step that must not be cut in the middle (taking or releasing the lock,
removing the temp folder) runs inside `mnist_common.stop.deferred`: a signal
there is acted on when the step ends; the publish runs inside `last_step`.
Signals after the first are ignored: the job is already cleaning up, which
takes seconds.
"""
from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import time
from typing import Callable, Collection, Iterator, TypeVar

from mnist_common.stop import STOP_SIGNALS, Stopped, deferred, on_stop_signals

T = TypeVar("T")
# How long a stopped run's thread gets to end after its workers were told to stop.
HALT_WAIT_S = 20.0
# A stopped run that had worker processes starts no more after this long without one.
QUIET_S = 0.5

requested = threading.Event()  # set by the first signal, read by in-process workers
_state = {"signum": 0, "done": False, "writers": 0}
_writers = threading.Condition()  # guards _state["writers"]: in-process writes under way


class StopRequested(Exception):
    """Raised inside an in-process Beam worker once the job is stopping; the
    runner may wrap it as it likes: the main thread already knows why."""


def raise_if_requested() -> None:
    """Called by the job's DoFns between batches: ends an in-process worker's
    bundle once a signal stopped the job."""
    if requested.is_set():
        raise StopRequested("the job is stopping")


@contextlib.contextmanager
def writing() -> Iterator[None]:
    """Wraps a DoFn's writes into the temp folder: refused once the job is
    stopping, and `_halt` waits for those under way, so the temp folder is
    removed after the last of them (a write would create it again)."""
    with _writers:
        raise_if_requested()
        _state["writers"] += 1
    try:
        yield
    finally:
        with _writers:
            _state["writers"] -= 1
            _writers.notify_all()


def too_late() -> None:
    """From here on a signal is ignored: the job has published its dataset (or
    found it there) and only releases its lock and reports."""
    _state["done"] = True


def _handle(signum, _frame) -> None:
    if _state["signum"] or _state["done"]:
        return  # already stopping (the job is cleaning up), or done
    _state["signum"] = signum
    requested.set()
    raise Stopped(signum)


class _QuietOtherThreads:
    """``sys.stderr`` while signals are handled: once the job is stopping, only
    the main thread writes to it. Beam's SDK worker prints a failed bundle's
    traceback straight to ``sys.stderr`` (``SdkWorker._execute``, checked in
    Beam 2.77.0), and an in-process worker the stop ended is such a bundle;
    the default `threading.excepthook` of Beam's threads writes there too."""

    def __init__(self, stream):
        self._stream = stream

    def write(self, text: str) -> int:
        if requested.is_set() and threading.current_thread() is not threading.main_thread():
            return len(text)
        return self._stream.write(text)

    def __getattr__(self, name: str):
        return getattr(self._stream, name)


@contextlib.contextmanager
def handling_signals() -> Iterator[None]:
    """Inside the block the signals raise `Stopped` (see the module docstring).

    Outside the main thread nothing changes. A signal the process was started
    ignoring stays ignored (`mnist_common.stop.install`).
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    stderr, sys.stderr = sys.stderr, _QuietOtherThreads(sys.stderr)
    try:
        with on_stop_signals(_handle):
            yield
    finally:
        sys.stderr = stderr
        requested.clear()
        _state.update(signum=0, done=False)


@contextlib.contextmanager
def last_step(state: str) -> Iterator[None]:
    """The job's last step (the publish): a signal inside waits for its end
    (`mnist_common.stop.deferred`) and then stops the job with ``state``,
    what the output holds; once it ends the job is done (`too_late`), and a
    signal up to that moment is still reported."""
    try:
        with deferred():
            yield
        too_late()
    except Stopped as e:  # held through the step, or come as it ended
        too_late()
        raise Stopped(e.signum, state) from None


def run_in_thread(work: Callable[[], T], local: bool = True) -> T:
    """``work()`` on a thread that never receives the stop signals; its result or error.

    If a signal stops the job meanwhile, the workers are halted (`_halt`) and
    `Stopped` propagates. The processes this one had started before (a
    program that runs the job in-process may have its own) are left alone.
    ``local``: the run's workers are here, so the stop waits for them; a
    remote runner's thread only polls a remote job.

    The thread's end is an event it sets, not ``Thread.join``: a signal
    handler that raises inside ``join`` leaves the thread marked as stopped
    while it still runs (``Thread._wait_for_tstate_lock``, checked in Python
    3.11.7), and ``join`` and ``is_alive`` no longer wait for it.
    """
    box: dict = {}
    done = threading.Event()
    earlier = set(descendants(os.getpid()))

    def target() -> None:
        try:
            box["result"] = work()
        except BaseException as e:  # handed to the caller
            box["error"] = e
        finally:
            done.set()

    thread = threading.Thread(target=target, name="beam-run", daemon=True)
    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    try:
        thread.start()
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
    try:
        while not done.wait(0.5):
            pass
    except Stopped:
        if local:
            _halt(done, earlier)
        raise
    if "error" in box:
        raise box["error"]
    return box["result"]


def _halt(done: threading.Event, earlier: set[int]) -> None:
    """Stops the run's workers: in-process ones at their next batch, worker
    processes (this process's descendants, but not ``earlier`` nor theirs) by
    SIGKILL, again and again (the run's thread may be starting one as the
    first are killed). Returns once the killed processes are dead and the
    in-process writes under way (`writing`) are over, or `HALT_WAIT_S` has
    passed; before that, once the run's thread sets ``done`` or, if it had
    worker processes, once `QUIET_S` has passed without a new one (Beam's
    runner waits for ever for the workers it lost)."""
    requested.set()
    deadline = time.monotonic() + HALT_WAIT_S
    killed: set[int] = set()
    last_kill = time.monotonic()
    while True:
        new = _kill_all(descendants(os.getpid(), skip=earlier)) - killed
        now = time.monotonic()
        if new:
            killed, last_kill = killed | new, now
        if (done.wait(0.05) or now >= deadline
                or (killed and now - last_kill >= QUIET_S)):
            break
    while [pid for pid in killed if _running(pid)] and time.monotonic() < deadline:
        time.sleep(0.01)
    with _writers:
        _writers.wait_for(lambda: not _state["writers"],
                          max(0.0, deadline - time.monotonic()))


def _kill_all(pids: list[int]) -> set[int]:
    """SIGKILLs ``pids``; the ones it reached."""
    reached = set()
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
            reached.add(pid)
        except (ProcessLookupError, PermissionError):
            pass
    return reached


def _running(pid: int) -> bool:
    """Whether ``pid`` still runs: a zombie (dead, not yet reaped) does not."""
    if os.path.isdir("/proc"):
        try:
            return _proc_stat(pid)[0] != b"Z"
        except (OSError, IndexError):
            return False  # gone
    import subprocess  # no /proc: ps says the state
    state = subprocess.run(["ps", "-o", "stat=", "-p", str(pid)], capture_output=True,
                           text=True, check=False).stdout.strip()
    return bool(state) and not state.startswith("Z")


def descendants(pid: int, skip: Collection[int] = ()) -> list[int]:
    """The processes below ``pid`` (children, their children...), but those in
    ``skip`` and below them, from /proc or, where there is none, ``ps``."""
    parents = _parent_table()
    found, frontier = [], [pid]
    while frontier:
        children = [child for child, parent in parents.items()
                    if parent in frontier and child not in skip]
        found.extend(children)
        frontier = children
    return found


def _parent_table() -> dict[int, int]:
    """{pid: parent pid} of every process this user can see."""
    table = {}
    if os.path.isdir("/proc"):
        for name in os.listdir("/proc"):
            try:
                table[int(name)] = int(_proc_stat(name)[1])
            except (ValueError, OSError, IndexError):
                continue  # not a process, or gone meanwhile
        return table
    import subprocess
    listing = subprocess.run(["ps", "-A", "-o", "pid=", "-o", "ppid="],
                             capture_output=True, text=True, check=False).stdout
    for line in listing.splitlines():
        pid, ppid = line.split()
        table[int(pid)] = int(ppid)
    return table


def _proc_stat(pid) -> list[bytes]:
    """The fields of ``/proc/PID/stat`` after the command name: state, parent pid..."""
    with open(f"/proc/{pid}/stat", "rb") as f:
        return f.read().rsplit(b")", 1)[1].split()


def exit_at_once(status: int) -> None:
    """Ends the stopped process with ``status`` once its output is flushed.

    Threads a stopped Beam run leaves behind would otherwise be joined at
    exit (or keep logging while the interpreter shuts down).
    """
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)
