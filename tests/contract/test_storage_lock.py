"""`mnist_common.storage_lock`'s own acquire, check and release on a local disk,
which the job and the trainer word in their own messages, and the backend
each kind of path gets."""

from __future__ import annotations

import os

import pytest

from mnist_common import storage_lock


def test_acquire_refuses_a_live_holder_then_frees_on_release(tmp_path):
    path = str(tmp_path / storage_lock.LOCK_FILE)
    held = storage_lock.acquire(path, storage_lock.LocalLockFile(path), "first", "here")
    try:
        with pytest.raises(storage_lock.LockRefused) as refused:
            storage_lock.acquire(path, storage_lock.LocalLockFile(path), "second", "here")
        assert refused.value.holder.run_id == "first"
        assert str(refused.value).startswith(f"{path}: locked by run first (host ")
    finally:
        held.release()
    assert not os.path.exists(path)
    storage_lock.acquire(path, storage_lock.LocalLockFile(path), "second", "here").release()


def test_raise_if_lost_raises_the_callers_refusal(tmp_path):
    path = str(tmp_path / storage_lock.LOCK_FILE)
    held = storage_lock.acquire(path, storage_lock.LocalLockFile(path), "mine", "here")
    try:
        held.raise_if_lost(ValueError)  # still held: nothing raised
        os.remove(path)
        with pytest.raises(ValueError, match="^lock removed$"):
            held.raise_if_lost(ValueError)
    finally:
        held.release()


def test_backend_for_each_kind_of_path():
    def gcs(path):
        return ("gcs", path)

    assert isinstance(storage_lock.backend_for("/tmp/x/.lock", gcs),
                      storage_lock.LocalLockFile)
    assert storage_lock.backend_for("gs://b/x/.lock", gcs) == ("gcs", "gs://b/x/.lock")
    assert isinstance(storage_lock.backend_for("ram://x/.lock", gcs),
                      storage_lock.LocalLockFile)
    assert isinstance(storage_lock.backend_for("ram://x/.lock", gcs,
                                               storage_lock.GfileLockFile),
                      storage_lock.GfileLockFile)
