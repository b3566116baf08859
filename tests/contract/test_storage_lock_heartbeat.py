"""A lock's heartbeat is judged by the storage's clock (`mnist_common.storage_lock`):
a local file's mtime, a GCS object's update time (the local GCS API server's,
as GCS's). The heartbeat a lock's content carries is the holder's clock: one
that is not finite, far in the future or far behind changes nothing. The
holder's fields, shown in one-line messages, are escaped."""

from __future__ import annotations

import json
import os
import socket
import time
import uuid

import pytest

from mnist_common import storage_lock
from tests.helpers import EMULATOR_BUCKET, locks_judged_later


def _holder(**fields) -> bytes:
    now = time.time()
    return json.dumps({"run_id": "other", "host": "elsewhere", "pid": 1, "started": now,
                       "heartbeat": now, **fields}).encode()


def _claim(store):
    me = storage_lock.LockInfo.for_this_process("mine")
    return storage_lock.claim(store, me, "here")


def _local(tmp_path, content: bytes, age: float):
    path = str(tmp_path / storage_lock.LOCK_FILE)
    with open(path, "wb") as f:
        f.write(content)
    then = time.time() - age
    os.utime(path, (then, then))
    return storage_lock.LocalLockFile(path)


@pytest.mark.parametrize("beat", [1e18, float("nan"), float("inf"), -1e18])
def test_a_local_holders_own_heartbeat_does_not_keep_it_alive(tmp_path, beat):
    """Its file unwritten for longer than the stale age: dead, whatever its
    content says (json writes NaN and Infinity, and reads them back)."""
    store = _local(tmp_path, _holder(heartbeat=beat), storage_lock.STALE_SECONDS + 60)
    token, holder = _claim(store)
    assert token is not None and holder is None


@pytest.mark.parametrize("beat", [1e18, float("nan"), time.time() - 10**6],
                         ids=["1e18", "nan", "1e6s-behind"])
def test_a_local_holder_written_recently_is_alive_whatever_its_content_says(tmp_path, beat):
    store = _local(tmp_path, _holder(heartbeat=beat), 30)
    token, holder = _claim(store)
    assert token is None and holder.run_id == "other"
    assert holder.describe(time.time()).endswith(", heartbeat 30s ago)")


def test_a_lock_file_written_far_in_the_future_counts_as_no_heartbeat(tmp_path):
    """An mtime more than the stale age ahead is no clock's skew: no heartbeat."""
    store = _local(tmp_path, _holder(), -10 * storage_lock.STALE_SECONDS)
    token, holder = _claim(store)
    assert token is not None and holder is None


def test_a_hosts_name_cannot_break_the_line(tmp_path):
    store = _local(tmp_path, _holder(host="vm\nerror: all good", run_id="r\tx"), 30)
    _, holder = _claim(store)
    refusal = str(storage_lock.LockRefused(store.path, holder))
    assert "\n" not in refusal and "\t" not in refusal
    assert "run 'r\\tx' (host 'vm\\nerror: all good', pid 1" in refusal


def test_a_holder_with_a_huge_pid_on_this_host_is_judged_without_a_traceback(tmp_path):
    store = _local(tmp_path, _holder(host=socket.gethostname(), pid=10**30), 30)
    token, holder = _claim(store)
    assert token is not None and holder is None  # no such pid: gone


# -- gs:// ---------------------------------------------------------------------

@pytest.fixture
def gcs_lock(gcs_emulator):
    """``write(content)`` uploads a lock as another run's client would; the
    backend reads it."""
    name = f"locks/{uuid.uuid4().hex[:8]}/{storage_lock.LOCK_FILE}"
    bucket = gcs_emulator.client().bucket(EMULATOR_BUCKET)

    def write(content: bytes) -> storage_lock.GcsLockObject:
        bucket.blob(name).upload_from_string(content, timeout=10)
        return storage_lock.GcsLockObject(gcs_emulator.client().bucket(EMULATOR_BUCKET),
                                          name, timeout=10)
    return write


def test_gcs_reports_the_objects_update_time(gcs_lock):
    before = time.time()
    _, _, heartbeat = gcs_lock(_holder(heartbeat=1.0)).read()
    assert before - 60 < heartbeat < time.time() + 60  # the server's clock, not the content's


def test_a_live_gcs_holder_whose_clock_is_behind_is_alive(gcs_lock):
    """Its last write is now on the storage's clock; its own clock says 301 s ago."""
    store = gcs_lock(_holder(heartbeat=time.time() - storage_lock.STALE_SECONDS - 1))
    token, holder = _claim(store)
    assert token is None and holder.run_id == "other"


@pytest.mark.parametrize("beat", [time.time() + 10**6, 1e18, float("nan")],
                         ids=["1e6s-ahead", "1e18", "nan"])
def test_a_dead_gcs_holder_whose_clock_runs_ahead_expires(gcs_lock, beat):
    store = gcs_lock(_holder(heartbeat=beat))
    token, holder = _claim(store)
    assert token is None and holder.run_id == "other"  # written just now: alive
    with locks_judged_later(storage_lock.STALE_SECONDS + 60):  # never written again
        token, holder = _claim(store)
    assert token is not None and holder is None
