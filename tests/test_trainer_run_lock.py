"""One run per model_dir: a second trainer refuses with one line naming the holder;
a provably dead holder's lock is taken over."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import time
import uuid

import pytest
import tensorflow as tf

from mnist_contract import lockfile
from tests import trainer_data
from tests.trainer_runs import errors, start
from trainer import run_lock
from trainer.errors import TrainerError

HOLDER = re.compile(r"in use by run \w+ \(host [^,]+, pid \d+, started \S+Z, "
                    r"heartbeat \d+s ago\)")


@pytest.fixture(params=["local", "ram"])
def model_dir(request, tmp_path) -> str:
    if request.param == "ram":
        path = f"ram://run-lock-{uuid.uuid4().hex}"
    else:
        path = str(tmp_path / "m")
    tf.io.gfile.makedirs(path)
    return path


def write_lock(model_dir: str, **fields) -> None:
    info = {"run_id": "old", "host": socket.gethostname(), "pid": os.getpid(),
            "started": time.time(), "heartbeat": time.time(), **fields}
    path = f"{model_dir}/{lockfile.LOCK_FILE}"
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
    dict(host="elsewhere", heartbeat=time.time() - lockfile.STALE_SECONDS - 60),
])
def test_dead_holder_is_taken_over(model_dir, caplog, holder):
    write_lock(model_dir, **holder)
    held = run_lock.acquire(model_dir)
    held.release()
    assert "taking over the lock of run old" in caplog.text


def test_live_holder_elsewhere_is_not_taken_over(model_dir):
    write_lock(model_dir, host="elsewhere")
    with pytest.raises(TrainerError, match="in use by run old"):
        run_lock.acquire(model_dir)


def test_a_lost_lock_stops_the_commit(model_dir):
    held = run_lock.acquire(model_dir)
    write_lock(model_dir, run_id="intruder")
    with pytest.raises(TrainerError, match="this run lost its lock .*intruder"):
        held.check_held(model_dir)
    held.release()


@pytest.mark.slow
def test_two_trainers_on_one_model_dir(tmp_path):
    """The second, started while the first trains, exits 1 with one line; the
    first finishes and its results are the ones on disk."""
    data = str(tmp_path / "data")
    trainer_data.write_dataset(data, num_train=64, num_test=16, train_shards=2,
                               test_shards=1)
    model_dir = str(tmp_path / "m")
    flags = ("--loop=custom", "--epochs=40", "--checkpoint_every=1")
    first = start(data, model_dir, *flags)
    try:
        while not os.path.exists(f"{model_dir}/{lockfile.LOCK_FILE}"):
            assert first.poll() is None, first.communicate()
            time.sleep(0.01)
        second = start(data, model_dir, *flags)
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
    assert not os.path.exists(f"{model_dir}/{lockfile.LOCK_FILE}")  # released
    with open(f"{model_dir}/metrics.json") as f:
        assert json.load(f)["train_steps"] == 40 * 8


def test_the_trainer_does_not_import_pipeline():
    code = ("import sys, trainer.run_lock, trainer.train; "
            "sys.exit(any(m == 'pipeline' or m.startswith('pipeline.') for m in sys.modules))")
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0
