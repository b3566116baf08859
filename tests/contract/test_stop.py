"""`mnist_common.stop`: the handlers every program's stop goes through, and
`deferred`, which holds a signal through a step that must not be cut.

In-process: the test sends itself the signal while a handler of its own is
set, so nothing but that handler sees it.
"""

from __future__ import annotations

import os
import signal

import pytest

from mnist_common import stop


def _noted():
    seen: list[int] = []
    return seen, lambda signum, frame: seen.append(signum)


def test_deferred_holds_the_first_signal_until_the_outermost_block_ends():
    seen, note = _noted()
    with stop.on_stop_signals(note):
        with stop.deferred():
            with stop.deferred():
                os.kill(os.getpid(), signal.SIGTERM)
                os.kill(os.getpid(), signal.SIGHUP)
            assert seen == []
        assert seen == [signal.SIGTERM]
        assert signal.getsignal(signal.SIGTERM) is note


def test_a_signal_as_the_block_ends_reaches_the_handler(monkeypatch):
    """A signal whose handler runs while `deferred` puts the handlers back
    (as the block's last step returns) is given to the program's handler."""
    seen, note = _noted()
    put_back = stop.restore
    sent = []

    def signalled_while_restoring(replaced):
        if not sent:  # once: as the block ends, not as on_stop_signals ends
            sent.append(True)
            os.kill(os.getpid(), signal.SIGTERM)
        put_back(replaced)

    monkeypatch.setattr(stop, "restore", signalled_while_restoring)
    with stop.on_stop_signals(note):
        with stop.deferred():
            pass
        assert seen == [signal.SIGTERM]


def test_a_failing_block_keeps_its_error_and_the_handler_notes_the_stop():
    seen: list[int] = []

    def raising(signum, frame):
        seen.append(signum)
        raise stop.Stopped(signum)

    with stop.on_stop_signals(raising):
        with pytest.raises(ValueError):
            with stop.deferred():
                os.kill(os.getpid(), signal.SIGINT)
                raise ValueError("the step failed")
        assert seen == [signal.SIGINT]
        with pytest.raises(stop.Stopped) as stopped:
            with stop.deferred():
                os.kill(os.getpid(), signal.SIGINT)
        assert (stopped.value.name, stopped.value.exit_status) == ("SIGINT", 130)


def test_pythons_keyboard_interrupt_is_not_held():
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    with pytest.raises(KeyboardInterrupt):
        with stop.deferred():
            os.kill(os.getpid(), signal.SIGINT)
            for _ in range(10_000):  # the handler runs between two bytecodes
                pass
            pytest.fail("the signal waited for the block's end")


def test_an_ignored_signal_stays_ignored():
    seen, note = _noted()
    previous = signal.signal(signal.SIGHUP, signal.SIG_IGN)
    try:
        with stop.on_stop_signals(note):
            assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
            assert signal.getsignal(signal.SIGTERM) is note
        assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGHUP, previous)


def test_stopped_says_the_signal_or_the_programs_detail():
    assert str(stop.Stopped(signal.SIGTERM)) == "SIGTERM"
    assert str(stop.Stopped(signal.SIGTERM, "saved ckpt-3")) == "saved ckpt-3"
    child = stop.Stopped(signal.SIGTERM, exit_status=1, reported=True)
    assert (child.exit_status, child.reported, stop.Stopped(signal.SIGHUP).exit_status) == (
        1, True, 129)
