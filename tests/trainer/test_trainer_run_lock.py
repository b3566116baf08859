"""One run per model_dir: a second trainer refuses with one line naming the holder;
a provably dead holder's lock is taken over."""

from __future__ import annotations

import errno
import json
import os
import re
import signal
import socket
import threading
import subprocess
import sys
import time
import uuid

import pytest
import tensorflow as tf

from mnist_common import storage_lock
from tests import trainer_data
from tests.helpers import EMULATOR_BUCKET, RefusingGcsServer, free_port, locks_judged_later
from tests.trainer.trainer_runs import errors, start
from trainer.errors import TrainerError
from trainer.run import lock as run_lock

HOLDER = re.compile(r"in use by run \w+ \(host [^,]+, pid \d+, started \S+Z, "
                    r"heartbeat \d+s ago\)")


@pytest.fixture(params=["local", "ram", "gcs"])
def model_dir(request, tmp_path) -> str:
    if request.param == "gcs":  # google-cloud-storage against the local GCS server
        request.getfixturevalue("gcs_emulator")
        return f"gs://{EMULATOR_BUCKET}/run-lock-{uuid.uuid4().hex[:8]}"
    if request.param == "ram":
        path = f"ram://run-lock-{uuid.uuid4().hex}"
    else:
        path = str(tmp_path / "m")
    tf.io.gfile.makedirs(path)
    return path


def gcs_bucket():
    """The emulator's bucket, through a client that finds it as the trainer's does."""
    from google.cloud import storage
    return storage.Client(project=None).bucket(EMULATOR_BUCKET)


def gcs_name(model_dir: str) -> str:
    return f"{model_dir[len(f'gs://{EMULATOR_BUCKET}/'):]}/{storage_lock.LOCK_FILE}"


def write_lock(model_dir: str, **fields) -> None:
    info = {"run_id": "old", "host": socket.gethostname(), "pid": os.getpid(),
            "started": time.time(), "heartbeat": time.time(), **fields}
    path = f"{model_dir}/{storage_lock.LOCK_FILE}"
    if path.startswith("gs://"):  # written over whatever is there, as another run would
        gcs_bucket().blob(gcs_name(model_dir)).upload_from_string(
            json.dumps(info).encode(), timeout=10)
        return
    if tf.io.gfile.exists(path):  # ram:// rewrites in place without truncating
        tf.io.gfile.remove(path)
    with tf.io.gfile.GFile(path, "wb") as f:
        f.write(json.dumps(info).encode())
    if "://" not in path:  # a local lock's heartbeat is its mtime
        os.utime(path, (info["heartbeat"], info["heartbeat"]))


def test_second_acquire_is_refused_naming_the_holder(model_dir):
    held = run_lock.acquire(model_dir)
    try:
        with pytest.raises(TrainerError) as e:
            run_lock.acquire(model_dir)
        assert str(e.value).startswith(f"{model_dir}: in use by run {held.run_id} (host ")
        assert HOLDER.search(str(e.value))
        assert "use another --model_dir" in str(e.value)
    finally:
        held.release()
    run_lock.acquire(model_dir).release()  # released: free again


@pytest.mark.parametrize("holder", [
    dict(pid=999_999_999),  # this host, pid gone
    dict(host="elsewhere", heartbeat=time.time() - storage_lock.STALE_SECONDS - 60),
])
def test_dead_holder_is_taken_over(model_dir, caplog, holder):
    write_lock(model_dir, **holder)
    # On gs:// the lock's age is its update time (just now): judged that much later.
    later = storage_lock.STALE_SECONDS + 60 if "heartbeat" in holder and \
        model_dir.startswith("gs://") else 0
    with locks_judged_later(later):
        held = run_lock.acquire(model_dir)
    held.release()
    assert "taking over the lock of run old" in caplog.text


def test_a_live_holder_on_this_host_wins_over_dead_hosts(model_dir, monkeypatch, caplog):
    """``MNIST_LOCK_DEAD_HOSTS`` naming this host (set by hand) does not take
    the lock of a holder whose pid lives here (this test's own process)."""
    monkeypatch.setenv(storage_lock.DEAD_HOSTS_ENV, f"other,{socket.gethostname()}")
    write_lock(model_dir)
    with pytest.raises(TrainerError, match=f"in use by run old .*pid {os.getpid()},"):
        run_lock.acquire(model_dir)
    assert f"but pid {os.getpid()} lives on it: the lock is not taken over" in caplog.text


@pytest.mark.parametrize("holder", [
    dict(pid=999_999_999),  # this host, pid gone
    dict(host="gone-vm"),  # another host, named as gone
])
def test_dead_hosts_still_take_over_a_dead_holder(model_dir, monkeypatch, caplog, holder):
    monkeypatch.setenv(storage_lock.DEAD_HOSTS_ENV, f"gone-vm,{socket.gethostname()}")
    write_lock(model_dir, **holder)
    run_lock.acquire(model_dir).release()
    assert "taking over the lock of run old" in caplog.text


def test_live_holder_elsewhere_is_not_taken_over(model_dir):
    write_lock(model_dir, host="elsewhere")
    with pytest.raises(TrainerError, match="in use by run old"):
        run_lock.acquire(model_dir)


@pytest.mark.parametrize("content", [b"", b"\x00garbage"], ids=["empty", "garbage"])
def test_an_unreadable_lock_is_named_as_such(tmp_path, content):
    """Not "in use by run ? (pid -1)": the file, that it is unreadable, its age.
    (On ram:// a lock has no age but its content's heartbeat, or an mtime of
    0: an unreadable one there is stale, and taken over at once; on gs:// its
    age is the object's update time, as a local file's is its mtime.)"""
    model_dir = str(tmp_path)
    path = f"{model_dir}/{storage_lock.LOCK_FILE}"
    with open(path, "wb") as f:
        f.write(content)
    os.utime(path, (time.time() - 42, time.time() - 42))
    with pytest.raises(TrainerError) as e:
        run_lock.acquire(model_dir)
    assert str(e.value) == (
        f"{path}: an unreadable lock file (empty or not a run's JSON), last written "
        f"42s ago, so no run can be named as its holder; remove it if no run is using "
        f"{model_dir} (it is taken over once 300s old)")


def test_a_lost_lock_stops_the_commit(model_dir):
    held = run_lock.acquire(model_dir)
    write_lock(model_dir, run_id="intruder")
    with pytest.raises(TrainerError, match="this run lost its lock .*intruder"):
        held.check_held(model_dir)
    held.release()


def test_a_lock_that_cannot_be_read_stops_the_commit(model_dir, monkeypatch):
    """Storage failing when the run checks its lock before committing: one line."""
    held = run_lock.acquire(model_dir)
    if model_dir.startswith("gs://"):
        from google.api_core.exceptions import ServiceUnavailable
        failure = ServiceUnavailable("backend unavailable")
    else:
        failure = OSError(errno.EIO, "Input/output error")

    def unreadable():
        raise failure
    monkeypatch.setattr(held._backend, "read", unreadable)
    with pytest.raises(TrainerError) as e:
        held.check_held(model_dir)
    reason = "503 Service Unavailable" if model_dir.startswith("gs://") else "Input/output error"
    assert str(e.value) == (f"{held.path}: cannot read this run's lock ({reason}); "
                            "stopped without writing more into --model_dir")
    monkeypatch.undo()
    held.release()


RACERS = 6


def test_racing_runs_on_gs_one_wins_holding_the_objects_generation(gcs_emulator):
    """`RACERS` runs take one gs:// model_dir's lock at the same moment: one
    holds it, at the generation GCS gave the object; the rest name it."""
    model_dir = f"gs://{EMULATOR_BUCKET}/race-{uuid.uuid4().hex[:8]}"
    start_line = threading.Barrier(RACERS)
    outcomes: list = []

    def race() -> None:
        start_line.wait()
        try:
            outcomes.append(run_lock.acquire(model_dir))
        except TrainerError as e:
            outcomes.append(e)

    threads = [threading.Thread(target=race) for _ in range(RACERS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    [held] = [o for o in outcomes if isinstance(o, run_lock.RunLock)]
    refused = [str(o) for o in outcomes if isinstance(o, TrainerError)]
    assert len(refused) == RACERS - 1
    assert all(r.startswith(f"{model_dir}: in use by run {held.run_id} ") for r in refused)
    blob = gcs_bucket().get_blob(gcs_name(model_dir), timeout=10)
    assert blob.generation == held._token
    assert json.loads(blob.download_as_bytes(timeout=10))["run_id"] == held.run_id
    held.release()
    assert gcs_bucket().get_blob(gcs_name(model_dir), timeout=10) is None


FORBIDDEN = ("runner@p.iam.gserviceaccount.com does not have storage.objects.create "
             "access to the Google Cloud Storage object.")


@pytest.mark.parametrize("server,reason", [
    ("no bucket", "404 Not Found"),
    ("forbidden", f"403 Forbidden: {FORBIDDEN}"),
    ("unreachable", "Connection refused; gave up after 2s of retries"),
    ("silent", "Read timed out; gave up after 2s of retries"),
    ("no credentials", "no Google credentials: File {missing} was not found"),
], ids=["no-bucket", "forbidden", "unreachable", "silent", "no-credentials"])
def test_gs_lock_failures_are_one_line_in_bounded_time(gcs_emulator, monkeypatch, tmp_path,
                                                       server, reason):
    """What stops the lock (bucket, permission, network, credentials) ends
    in the one-line error, in seconds: retries and waits are bounded."""
    monkeypatch.setattr(run_lock, "GCS_RETRY_SECONDS", 2.0)
    monkeypatch.setattr(run_lock, "GCS_TIMEOUT_SECONDS", (1.0, 1.0))
    bucket = "no-such-bucket" if server == "no bucket" else EMULATOR_BUCKET
    model_dir = f"gs://{bucket}/m-{uuid.uuid4().hex[:8]}"
    missing = tmp_path / "no-key.json"
    with RefusingGcsServer(403, FORBIDDEN) as refusing, socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)  # connections complete in the backlog; nothing answers
        hosts = {"forbidden": refusing.host, "unreachable": f"http://127.0.0.1:{free_port()}",
                 "silent": f"http://127.0.0.1:{silent.getsockname()[1]}"}
        if server in hosts:
            monkeypatch.setenv("STORAGE_EMULATOR_HOST", hosts[server])
        elif server == "no credentials":  # real GCS, with a key file that is not there
            monkeypatch.delenv("STORAGE_EMULATOR_HOST")
            monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(missing))
        began = time.monotonic()
        with pytest.raises(TrainerError) as e:
            run_lock.acquire(model_dir)
        took = time.monotonic() - began
    message = str(e.value)
    assert message.startswith(f"{model_dir}/{storage_lock.LOCK_FILE}: cannot take the lock of "
                              f"--model_dir ({reason.format(missing=missing)}"), message
    assert "\n" not in message
    # A hang bound, not a speed bar: the slowest case (the silent server) ends
    # in 3 s on a quiet machine; a request or retry without its bound would
    # wait for ever.
    assert took < 60, took


@pytest.mark.slow
def test_two_trainers_on_one_model_dir(tmp_path):
    """The second, started while the first trains, exits 1 with one line, and
    so does a third told by ``MNIST_LOCK_DEAD_HOSTS`` that this host is gone
    (the first's pid lives here); the first finishes and its results are the
    ones on disk."""
    data = str(tmp_path / "data")
    trainer_data.write_dataset(data, num_train=64, num_test=16, train_shards=2,
                               test_shards=1)
    model_dir = str(tmp_path / "m")
    flags = ("--loop=custom", "--epochs=40", "--checkpoint_every=1")
    first = start(data, model_dir, *flags)
    try:
        while not os.path.exists(f"{model_dir}/{storage_lock.LOCK_FILE}"):
            assert first.poll() is None, first.communicate()
            time.sleep(0.01)
        for env in ({}, {storage_lock.DEAD_HOSTS_ENV: socket.gethostname()}):
            second = start(data, model_dir, *flags, env=env)
            out, err = second.communicate(timeout=300)
            assert first.poll() is None, "the first run ended before the second was refused"
            assert second.returncode == 1, out + err
            (line,) = errors(err)
            assert line.startswith(f"error: {model_dir}: in use by run ") and HOLDER.search(line)
            assert f"pid {first.pid}," in line
        out, err = first.communicate(timeout=600)
        assert first.returncode == 0, err[-3000:]
    finally:
        first.kill()
    assert not os.path.exists(f"{model_dir}/{storage_lock.LOCK_FILE}")  # released
    with open(f"{model_dir}/metrics.json") as f:
        assert json.load(f)["train_steps"] == 40 * 8


def snapshot(folder: str) -> dict:
    """Every file under ``folder``: its size and mtime."""
    found = {}
    for root, _, names in os.walk(folder):
        for name in names:
            stat = os.stat(os.path.join(root, name))
            found[os.path.relpath(os.path.join(root, name), folder)] = (stat.st_size,
                                                                        stat.st_mtime_ns)
    return found


def wait_for(condition, proc: subprocess.Popen, what: str) -> None:
    deadline = time.monotonic() + 240
    while not condition():
        assert proc.poll() is None, (what, proc.communicate())
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


@pytest.mark.slow
def test_a_run_that_lost_its_lock_writes_nothing_more(tmp_path):
    """A stopped (SIGSTOP) past the stale age; B takes the lock over and is
    stopped in turn; A continues (SIGCONT): one line, exit 1, and not a byte
    of A lands in model_dir. B then finishes the run from the checkpoints.

    A writes only at epoch ends (100-step epochs), so the stop lands in its
    training steps, not inside a write: a write already under way when a
    process is stopped completes when it continues (the check comes before
    each write; docs/trainer.md, A run you can trust)."""
    data, model_dir = str(tmp_path / "data"), str(tmp_path / "m")
    trainer_data.write_dataset(data, num_train=64, num_test=16, train_shards=2,
                               test_shards=1)
    env = {"MNIST_LOCK_HEARTBEAT_SECONDS": "0.2", "MNIST_LOCK_STALE_SECONDS": "2"}
    flags = ("--loop=custom", "--epochs=3", "--steps_per_epoch=100", "--log_every=1000")
    lock = f"{model_dir}/{storage_lock.LOCK_FILE}"
    first = start(data, model_dir, *flags, env=env)
    second = None
    try:
        wait_for(lambda: os.path.exists(f"{model_dir}/checkpoints/checkpoint"), first,
                 "a first checkpoint")
        os.kill(first.pid, signal.SIGSTOP)
        time.sleep(3)  # its heartbeat is now older than the stale age
        second = start(data, model_dir, *flags, env=env)

        def taken_over() -> bool:
            try:
                with open(lock) as f:
                    return json.load(f)["pid"] == second.pid
            except (OSError, ValueError):
                return False
        wait_for(taken_over, second, "the takeover")
        os.kill(second.pid, signal.SIGSTOP)
        before = snapshot(model_dir)
        os.kill(first.pid, signal.SIGCONT)
        out, err = first.communicate(timeout=120)
        assert first.returncode == 1, out[-2000:] + err[-3000:]
        (line,) = errors(err)
        assert line.startswith(f"error: {model_dir}: this run lost its lock (the lock "), line
        assert snapshot(model_dir) == before
        os.kill(second.pid, signal.SIGCONT)
        out, err = second.communicate(timeout=600)
        assert second.returncode == 0, err[-3000:]
    finally:
        for proc in (first, second):
            if proc is not None:
                proc.kill()
    assert not [name for name in os.listdir(model_dir) if name.startswith(".export")]
    with open(f"{model_dir}/metrics.json") as f:
        assert json.load(f)["train_steps"] == 3 * 100


def test_the_trainer_does_not_import_pipeline():
    code = ("import sys, trainer.run.lock, trainer.train; "
            "sys.exit(any(m == 'pipeline' or m.startswith('pipeline.') for m in sys.modules))")
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0
