"""The shared GCS lock backend (`mnist_contract.lockfile.GcsLockObject`) against a
real local GCS API server that enforces ``ifGenerationMatch`` as GCS does."""

from __future__ import annotations

import subprocess
import sys
import threading
import uuid

import pytest

from mnist_contract import lockfile
from tests.helpers import EMULATOR_BUCKET, REPO

RACERS = 8


@pytest.fixture
def name(gcs_emulator) -> str:
    return f"locks/{uuid.uuid4().hex[:8]}/{lockfile.LOCK_FILE}"


def lock_object(emulator, name: str) -> lockfile.GcsLockObject:
    """A backend with a client of its own, as another run would have."""
    return lockfile.GcsLockObject(emulator.client().bucket(EMULATOR_BUCKET), name,
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
        info = lockfile.LockInfo.for_this_process(run_id)
        start.wait()
        results[run_id] = lockfile.claim(store, info, "the race")

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
    assert lockfile.LockInfo.from_bytes(data, 0.0).run_id == winners[0]
    assert generation == results[winners[0]][0]


def test_the_contract_imports_no_google_library():
    # Namespace packages (no __file__) do not count: an installed package's
    # *-nspkg.pth makes `google` and `google.cloud` at interpreter start.
    code = ("import sys, mnist_contract.lockfile; "
            "sys.exit(sorted(m for m, mod in sys.modules.items() if m.split('.')[0] == "
            "'google' and getattr(mod, '__file__', None)) or 0)")
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
