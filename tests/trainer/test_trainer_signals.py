"""SIGTERM, SIGINT and SIGHUP at any moment of a trainer's life: one line, exit
128 + N, the model_dir lock released, and never a traceback.

A handler that raised would surface inside whatever the main thread runs; in
a ``tf.function`` being traced that comes out wrapped by AutoGraph or Keras
as a traceback. So the handlers only set a flag (during training) or end the
process themselves (`trainer.run.preemption.ProcessSignals`); the first
tests check that mechanism in a small process, the last ones the trainer.
"""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from mnist_common import storage_lock
from tests import trainer_data
from tests.helpers import REPO
from tests.trainer.trainer_runs import start

NAMES = {signal.SIGTERM: "SIGTERM", signal.SIGINT: "SIGINT", signal.SIGHUP: "SIGHUP"}


def python(code: str, tmp_path) -> subprocess.CompletedProcess:
    # A hang bound, not a speed bar: a run that imports TensorFlow takes about
    # 4.5 s on a quiet machine (25-29 s with every core busy).
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=REPO,
                          capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, MARKER=str(tmp_path / "cleaned")))


@pytest.mark.parametrize("signum", list(NAMES))
def test_a_signal_outside_training_ends_the_process_after_its_cleanups(tmp_path, signum):
    result = python(f"""
        import os, time
        from trainer.run import preemption
        with preemption.ProcessSignals():
            preemption.at_stop(lambda: open(os.environ["MARKER"], "w").close())
            os.kill(os.getpid(), {int(signum)})
            time.sleep(30)
        """, tmp_path)
    assert result.returncode == 128 + signum, result.stderr
    assert result.stderr.splitlines() == [
        f"{NAMES[signum]} received outside the training steps: stopped; a rerun resumes "
        "from the last checkpoint, if any"]
    assert (tmp_path / "cleaned").exists()


@pytest.mark.parametrize("signum", list(NAMES))
def test_a_second_signal_in_training_ends_the_process_without_raising(tmp_path, signum):
    """The second signal does not raise into the code it interrupts (here a
    `try` that would swallow it): the process ends from the handler."""
    result = python(f"""
        import os, time
        from trainer.run import preemption
        with preemption.ProcessSignals():
            preemption.at_stop(lambda: open(os.environ["MARKER"], "w").close())
            signals = preemption.StopSignals()
            signals.watch()
            os.kill(os.getpid(), {int(signum)})
            assert signals.received == {int(signum)}
            try:
                os.kill(os.getpid(), {int(signum)})
                time.sleep(30)
            except BaseException as e:
                print("raised", type(e).__name__)
        """, tmp_path)
    assert result.returncode == 128 + signum, result.stdout + result.stderr
    name = NAMES[signum]
    assert result.stderr.splitlines() == [
        f"{name} received: stopping after the current steps to save a checkpoint",
        f"{name} received twice: stopped without saving; a rerun resumes from the last "
        "checkpoint"]
    assert result.stdout == "" and (tmp_path / "cleaned").exists()


def test_a_signal_ignored_at_start_stays_ignored(tmp_path):
    """nohup and detached launchers ignore SIGHUP: the trainer keeps it so."""
    result = python("""
        import os, signal
        from trainer.run import preemption
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
        with preemption.ProcessSignals():
            signals = preemption.StopSignals()
            signals.watch()
            os.kill(os.getpid(), signal.SIGHUP)
            print("still running", signals.received)
        """, tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout == "still running None\n"


_HELD_BY_TRAINING = """
    import os, sys
    import trainer.train
    from trainer.errors import TrainerError
    from mnist_common.stop import Stopped

    class Held:  # stands for the interrupted loop's input iterators
        def __del__(self):
            open(os.environ["MARKER"], "w").close()

    def began(error):  # as trainer.train marks an error raised while training
        error.after_training_began = True
        return error

    def train_and_evaluate(config):
        held = Held()
        print("trained 3 steps")
        raise {error}

    trainer.train.train_and_evaluate = train_and_evaluate
    from trainer.__main__ import main
    sys.argv = ["trainer", "--data=gs://b/mnist", "--model_dir=gs://b/run", "--preset=smoke"]
    sys.exit(main({argv}))
    """
_STOPPED = ("Stopped(15, 'SIGTERM received: stopped at step 3/8, saved ckpt-3; "
            "rerun the same command to resume')")
_FAILED = "TrainerError('M: this run lost its lock')"


@pytest.mark.parametrize("error, status, line", [
    (_STOPPED, 128 + signal.SIGTERM,
     "SIGTERM received: stopped at step 3/8, saved ckpt-3; rerun the same command to resume"),
    (f"began({_FAILED})", 1,
     "error: M: this run lost its lock")])
def test_a_run_stopped_in_training_ends_without_tearing_it_down(tmp_path, error, status,
                                                                line):
    """After the line, the command ends at once: what the stopped training
    still holds, whose TensorFlow teardown can take a minute (docs/trainer.md,
    "Preemption: SIGTERM, Ctrl-C and SIGHUP"), is never freed, and what was printed before is kept."""
    result = python(_HELD_BY_TRAINING.format(error=error, argv=""), tmp_path)
    assert (result.returncode, result.stdout) == (status, "trained 3 steps\n"), result.stderr
    assert result.stderr.splitlines()[-1] == line
    assert not (tmp_path / "cleaned").exists()


_ARGV = "sys.argv[1:]"  # the same arguments, given


@pytest.mark.parametrize("error, argv, status", [
    (_STOPPED, _ARGV, 128 + signal.SIGTERM), (f"began({_FAILED})", _ARGV, 1), (_FAILED, "", 1)])
def test_main_returns_to_a_caller_and_before_training(tmp_path, error, argv, status):
    """Given its arguments, `main` returns (tests call it so); from the
    command line, an error raised before training began returns too."""
    result = python(_HELD_BY_TRAINING.format(error=error, argv=argv), tmp_path)
    assert result.returncode == status, result.stderr
    assert (tmp_path / "cleaned").exists()


class _Lines:
    """A process's stdout and stderr lines as they come, from two threads.

    A stream has no more lines once its reader has read it to the end, which
    may come a while after the process ended: the readers are waited for,
    never a fixed time. Lines of the two streams interleave as the readers
    got them; ``stderr`` holds that stream's own, in its order."""

    def __init__(self, proc: subprocess.Popen):
        self.proc, self.seen, self.stderr, self.queue = proc, [], [], queue.Queue()
        self.readers = [threading.Thread(target=self._read, args=(stream, name), daemon=True)
                        for stream, name in ((proc.stdout, "stdout"), (proc.stderr, "stderr"))]
        for reader in self.readers:
            reader.start()

    def _read(self, stream, name: str) -> None:
        for line in stream:
            self.queue.put((name, line))

    def _take(self, item: tuple[str, str]) -> str:
        name, line = item
        self.seen.append(line)
        if name == "stderr":
            self.stderr.append(line)
        return line

    def _ended(self) -> bool:
        """Both streams read to their end: what is queued is all there is."""
        return not any(reader.is_alive() for reader in self.readers)

    def wait_for(self, text: str, timeout: float = 240) -> bool:
        """True once a line containing ``text`` came; False if the streams
        ended first."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                item = self.queue.get(timeout=0.01)
            except queue.Empty:
                if self._ended() and self.queue.empty():
                    return False
                continue
            if text in self._take(item):
                return True
        raise AssertionError(f"no {text!r} in {timeout}s: {''.join(self.seen)[-3000:]}")

    def rest(self) -> list[str]:
        self.proc.wait(timeout=120)
        for reader in self.readers:
            reader.join(timeout=120)  # a hang bound: the streams end with the process
        while not self.queue.empty():
            self._take(self.queue.get())
        return self.seen


@pytest.mark.slow
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_second_signal_while_tensorflow_traces_is_one_line(tmp_path, signum):
    """The first signal once ``Epoch 1/`` is printed (fit has begun: a stop
    request), the second as soon as the first is acknowledged, while the
    first train function is being traced."""
    data, model_dir = str(tmp_path / "data"), str(tmp_path / "m")
    trainer_data.write_dataset(data, num_train=128, num_test=16, train_shards=1,
                               test_shards=1)
    proc = start(data, model_dir, "--model=convnet", "--epochs=40", "--verbose=2",
                 "--steps_per_execution=1", "--global_batch_size=32", "--seed=1")
    try:
        lines = _Lines(proc)
        assert lines.wait_for("Epoch 1/")
        proc.send_signal(signum)
        if lines.wait_for("stopping after the current steps"):
            proc.send_signal(signum)
        seen = lines.rest()
    finally:
        proc.kill()
    text = "".join(seen)
    assert proc.returncode == 128 + signum, text[-3000:]
    assert "Traceback" not in text and "Error" not in text, text[-3000:]
    assert not os.path.exists(f"{model_dir}/{storage_lock.LOCK_FILE}")  # released
    assert lines.stderr[-1].startswith(f"{NAMES[signum]} received"), lines.stderr[-1]


def signal_once_ready(proc, signum, ready):
    """Sends ``signum`` once ``ready()`` holds (polled with no time bound but
    the process's own life); returns its (stdout, stderr). 120 s bounds a hang
    after the signal: the stop takes seconds on a quiet machine."""
    try:
        while not ready():
            assert proc.poll() is None, proc.communicate()
            time.sleep(0.002)
        proc.send_signal(signum)
        return proc.communicate(timeout=120)
    finally:
        proc.kill()


@pytest.mark.slow
@pytest.mark.parametrize("signum", list(NAMES))
def test_a_signal_once_the_lock_is_taken_releases_it(tmp_path, signum):
    """Sent as soon as ``model_dir/.lock`` appears (the model is being built):
    one line, 128 + N, and the lock gone."""
    data, model_dir = str(tmp_path / "data"), str(tmp_path / "m")
    trainer_data.write_dataset(data, num_train=64, num_test=16, train_shards=1,
                               test_shards=1)
    proc = start(data, model_dir, "--epochs=40")
    lock = f"{model_dir}/{storage_lock.LOCK_FILE}"
    _, err = signal_once_ready(proc, signum, lambda: os.path.exists(lock))
    assert proc.returncode == 128 + signum, err[-3000:]
    assert "Traceback" not in err, err[-3000:]
    assert err.strip().splitlines()[-1].startswith(f"{NAMES[signum]} received"), err[-2000:]
    assert not os.path.exists(lock)


def _stderr_redirected(pid: int, ours: str) -> bool:
    """Whether ``pid``'s fd 2 is no longer ``ours`` (the pipe it was started
    with): the quiet start-up's capture (`mnist_common.console.tensorflow_start`)."""
    try:
        return os.readlink(f"/proc/{pid}/fd/2") != ours
    except FileNotFoundError:
        return False


@pytest.mark.slow
@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="reads /proc/PID/fd")
@pytest.mark.parametrize("signum", list(NAMES))
def test_a_signal_while_tensorflow_starts_is_one_line_on_the_real_stderr(tmp_path, signum):
    """Sent once the start-up has redirected fd 2 (TensorFlow's import): the
    line reaches the stderr the trainer was given, 128 + N. The wait for the
    redirection polls with no time bound but the process's own life."""
    data, model_dir = str(tmp_path / "data"), str(tmp_path / "m")
    trainer_data.write_dataset(data, num_train=64, num_test=16, train_shards=1,
                               test_shards=1)
    proc = start(data, model_dir, "--epochs=40")
    ours = os.readlink(f"/proc/{proc.pid}/fd/2")
    _, err = signal_once_ready(proc, signum, lambda: _stderr_redirected(proc.pid, ours))
    assert proc.returncode == 128 + signum, err[-3000:]
    assert "Traceback" not in err, err[-3000:]
    assert len([line for line in err.splitlines()
                if line.startswith(f"{NAMES[signum]} received")]) == 1, err[-3000:]
