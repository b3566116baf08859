"""`pipeline.stop.handling_signals`: once the job is stopping, only the main thread
writes to stderr (Beam's SDK worker prints the traceback of the bundle the stop
ended straight to ``sys.stderr``), and the block leaves stderr as it found it."""

import sys
import threading

from pipeline import stop


def write_from_a_thread(text: str) -> None:
    thread = threading.Thread(target=lambda: print(text, file=sys.stderr))
    thread.start()
    thread.join()


def test_other_threads_write_until_the_job_stops(capsys):
    before = sys.stderr
    with stop.handling_signals():
        write_from_a_thread("worker before the stop")
        stop.requested.set()
        write_from_a_thread("Traceback (most recent call last): worker after the stop")
        print("error: main thread's line", file=sys.stderr)
    assert sys.stderr is before
    assert not stop.requested.is_set()
    assert capsys.readouterr().err.splitlines() == [
        "worker before the stop", "error: main thread's line"]


def test_stderr_passes_everything_while_no_stop_is_requested(capsys):
    with stop.handling_signals():
        write_from_a_thread("a")
        sys.stderr.write("b\n")
        sys.stderr.flush()
    assert capsys.readouterr().err == "a\nb\n"


def test_a_thread_that_dies_once_the_job_stops_prints_nothing(capsys, monkeypatch):
    monkeypatch.setattr(threading, "excepthook", threading.__excepthook__)  # not pytest's

    def fail():
        raise RuntimeError("a Beam thread ended by the stop")
    with stop.handling_signals():
        stop.requested.set()
        thread = threading.Thread(target=fail)
        thread.start()
        thread.join()
    assert capsys.readouterr().err == ""
