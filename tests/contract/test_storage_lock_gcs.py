"""The shared GCS lock backend (`mnist_common.storage_lock.GcsLockObject`) against a
real local GCS API server that enforces ``ifGenerationMatch`` as GCS does; and the
neutral packages load no google library until a GCS lock is used."""

from __future__ import annotations

import subprocess
import sys
import threading
import uuid

import pytest

from mnist_common import storage_lock
from tests.helpers import EMULATOR_BUCKET, REPO

RACERS = 8


@pytest.fixture
def name(gcs_emulator) -> str:
    return f"locks/{uuid.uuid4().hex[:8]}/{storage_lock.LOCK_FILE}"


def lock_object(emulator, name: str) -> storage_lock.GcsLockObject:
    """A backend with a client of its own, as another run would have."""
    return storage_lock.GcsLockObject(emulator.client().bucket(EMULATOR_BUCKET), name,
                                      timeout=10)


def test_create_is_exclusive(gcs_emulator, name):
    first, second = lock_object(gcs_emulator, name), lock_object(gcs_emulator, name)
    token = first.create(b"first")
    assert isinstance(token, int) and token > 0
    assert second.create(b"second") is None
    assert second.read()[:2] == (b"first", token)


def test_refresh_fails_once_another_run_replaced_the_lock(gcs_emulator, name):
    mine, theirs = lock_object(gcs_emulator, name), lock_object(gcs_emulator, name)
    token = mine.create(b"mine")
    refreshed = mine.refresh(token, b"mine, later")
    assert refreshed not in (None, token)
    assert mine.read()[:2] == (b"mine, later", refreshed)
    theirs.bucket.blob(name).upload_from_string(b"theirs", timeout=10)  # a takeover
    assert mine.refresh(refreshed, b"mine again") is None
    assert theirs.read()[0] == b"theirs"


def test_delete_if_only_deletes_the_generation_judged(gcs_emulator, name):
    store = lock_object(gcs_emulator, name)
    judged = store.create(b"holder")
    current = store.refresh(judged, b"holder, heartbeat")  # it was alive after all
    assert not store.delete_if(judged)
    assert store.read()[:2] == (b"holder, heartbeat", current)
    assert store.delete_if(current)
    assert store.read() is None
    assert not store.delete_if(current)  # already gone


def test_racing_claims_have_exactly_one_winner(gcs_emulator, name):
    """`RACERS` runs, each with its own client, claim one free lock at the same moment."""
    start = threading.Barrier(RACERS)
    results: dict[str, tuple] = {}

    def race(run_id: str) -> None:
        store = lock_object(gcs_emulator, name)
        info = storage_lock.LockInfo.for_this_process(run_id)
        start.wait()
        results[run_id] = storage_lock.claim(store, info, "the race")

    threads = [threading.Thread(target=race, args=(f"run{i}",)) for i in range(RACERS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert len(results) == RACERS
    winners = [run for run, (token, _) in results.items() if token is not None]
    assert len(winners) == 1, results
    holders = {holder.run_id for token, holder in results.values() if token is None}
    assert holders == set(winners)
    data, generation, _ = lock_object(gcs_emulator, name).read()
    assert storage_lock.LockInfo.from_bytes(data, 0.0).run_id == winners[0]
    assert generation == results[winners[0]][0]


LOCAL_LOCK_TAKEN_AND_RELEASED = """
import tempfile
from mnist_common import storage_lock
folder = tempfile.mkdtemp()
store = storage_lock.LocalLockFile(f"{folder}/{storage_lock.LOCK_FILE}")
info = storage_lock.LockInfo.for_this_process("run")
token, _ = storage_lock.claim(store, info, folder)
storage_lock.HeldLock(store.path, store, info, token).release()
"""


@pytest.mark.parametrize("use", ["import mnist_contract", LOCAL_LOCK_TAKEN_AND_RELEASED],
                         ids=["mnist_contract", "mnist_common.storage_lock"])
def test_the_neutral_packages_import_no_google_library(use):
    """Only a GCS lock may load google-api-core. Namespace packages (no __file__)
    do not count: an installed package's *-nspkg.pth makes `google` and
    `google.cloud` at interpreter start."""
    code = (f"import sys\n{use}\n"
            "sys.exit(sorted(m for m, mod in sys.modules.items() if m.split('.')[0] == "
            "'google' and getattr(mod, '__file__', None)) or 0)")
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
