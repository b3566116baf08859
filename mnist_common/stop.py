"""Stopping on SIGTERM, SIGINT or SIGHUP: the one mechanism every program uses.

A spot VM's or Kubernetes' preemption sends SIGTERM, a terminal's Ctrl-C
SIGINT and a closed terminal or ssh session SIGHUP (`STOP_SIGNALS`). Each
program decides only what it saves and what it prints; what they share is
here:

* `Stopped`, the exception of a stop: the signal, the exit status 128 + N
  (`mnist_common.console.stopped_by`, docs/README.md "Exit status") and,
  when the program has one, what it says of the stop;
* `install` / `restore` (and `on_stop_signals`, the two as a block): a
  handler for the stop signals and the previous ones back;
* `deferred`: a step that must not be cut in the middle (taking or
  releasing a lock, removing a temp folder) holds the signal until it ends;
* `exit_on_signals`: the whole policy of a program with nothing to save.

What each program does with a signal: docs/pipeline.md ("Flags and
behaviour", Signals), docs/trainer.md ("Preemption: SIGTERM, Ctrl-C and
SIGHUP"), docs/launch.md ("TPU VM", "Spot runs: `run`").

Python runs handlers in the main thread only, and only there can they be
set: outside it nothing here changes a handler. A signal the process was
started ignoring (``nohup`` ignores SIGHUP, a script's ``cmd &`` SIGINT)
stays ignored.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from typing import Callable, Iterator, Optional

from mnist_common import console

# SIGTERM first: when the workers of one run received different signals,
# the first of these that any received is the one they all stop on
# (`trainer.run.preemption.StopSignals.requested`), and a preemption wins.
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)

Handler = Callable[[int, object], None]


class Stopped(BaseException):
    """A stop signal ended the work under way.

    A BaseException: library code that catches ``Exception`` (Beam's file
    systems, Google's retries, Keras' traceback filter) neither wraps nor
    swallows it, so it reaches the program's own ``except Stopped``.

    ``detail``: what the program says of the stop (the trainer's line, what
    the job's output holds), also the exception's text; without one the
    text is the signal's name. ``exit_status``: 128 + N unless the program
    chose another (a launcher's child that stopped with its own status);
    ``reported``: that child already printed why it stopped.
    """

    def __init__(self, signum: int, detail: str = "", *,
                 exit_status: Optional[int] = None, reported: bool = False):
        super().__init__(detail or signal.Signals(signum).name)
        self.signum = int(signum)
        self.detail = detail
        self.exit_status = console.stopped_by(signum) if exit_status is None else exit_status
        self.reported = reported

    @property
    def name(self) -> str:
        """The signal's name, ``SIGTERM``."""
        return signal.Signals(self.signum).name


def install(handler: Handler) -> dict:
    """``handler`` for each of `STOP_SIGNALS`; the handlers it replaced, for
    `restore`. A signal ignored now stays ignored; outside the main thread
    nothing changes (and nothing is returned)."""
    if threading.current_thread() is not threading.main_thread():
        return {}
    replaced = {}
    for signum in STOP_SIGNALS:
        if signal.getsignal(signum) is not signal.SIG_IGN:
            replaced[signum] = signal.signal(signum, handler)
    return replaced


def restore(replaced: dict) -> None:
    """Puts back the handlers `install` replaced; a second call does nothing."""
    for signum, handler in replaced.items():
        signal.signal(signum, handler)
    replaced.clear()


@contextlib.contextmanager
def on_stop_signals(handler: Handler) -> Iterator[None]:
    """``handler`` for the stop signals inside the block (`install`), the
    previous handlers after it."""
    replaced = install(handler)
    try:
        yield
    finally:
        restore(replaced)


def _deferrable(handler) -> bool:
    """A program's own handler; Python's KeyboardInterrupt and the default
    and ignored actions are left as they are."""
    return callable(handler) and handler is not signal.default_int_handler


@contextlib.contextmanager
def deferred() -> Iterator[None]:
    """Inside the block a stop signal waits: the first one is given to the
    handler it would have reached when the block ends, however it ends, and
    later ones inside it are dropped. A failing block's own error goes on: a
    `Stopped` the handler raises then is dropped (the handler has noted the
    stop).

    Only the program's own handlers wait (`_deferrable`); outside the main
    thread nothing changes. Nested blocks hold the signal until the
    outermost ends.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    held: list[int] = []

    def hold(signum, frame) -> None:
        if not held:
            held.append(signum)

    replaced = {}
    for signum in STOP_SIGNALS:
        if _deferrable(signal.getsignal(signum)):
            replaced[signum] = signal.signal(signum, hold)
    try:
        yield
    except BaseException:
        with contextlib.suppress(Stopped):
            _release(held, replaced)
        raise
    else:
        _release(held, replaced)


def _release(held: list[int], replaced: dict) -> None:
    """Puts the handlers `deferred` held the signals from back, then gives the
    held signal, if any, to its handler. In that order: ``held`` is final
    only once ``hold`` is no longer installed (Python runs a handler between
    two bytecodes, so one may run while the handlers are being put back);
    a signal after that reaches its handler directly."""
    handlers = dict(replaced)
    restore(replaced)
    if held:
        handlers[held[0]](held[0], None)


@contextlib.contextmanager
def exit_on_signals(program: str, *, note: str = "") -> Iterator[None]:
    """Inside the block the stop signals end the process with one line
    ``error: PROGRAM: stopped by SIGTERM[; NOTE]`` on stderr and status
    128 + N, for a program with nothing to save on the way out.

    ``os._exit`` after the line: unwinding would print a traceback from
    wherever the signal landed. A signal while TensorFlow starts finds fd 2
    captured (`mnist_common.console.tensorflow_start`): it is put back first.
    """
    def handle(signum, frame):
        console.end_capture()
        line = f"error: {program}: stopped by {signal.Signals(signum).name}"
        os.write(2, f"{line}{'; ' + note if note else ''}\n".encode())
        os._exit(console.stopped_by(signum))

    with on_stop_signals(handle):
        yield
