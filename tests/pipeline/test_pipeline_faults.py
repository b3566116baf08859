"""Faults injected for real: the job killed mid-write, storage dying, more workers.

Whatever happens, readers never see a partial shard under a final name or
metadata for an incomplete dataset, an earlier dataset stays intact, and a
rerun completes with every record exactly once.
"""

import os
import signal
import subprocess
import sys
import time
import uuid

import pytest

import mnist_contract as contract

from pipeline import storage
from pipeline.errors import StorageError
from pipeline.verify import main as verify_main
from pipeline.verify import verify
from tests.helpers import EMULATOR_BUCKET, REPO, GcsEmulator, free_port, job_result, run_job

SYNTHETIC = 60_000  # about 6 s of work on the local runner: time to interrupt it
# On gs:// (the emulator) the job runs slower: half as many records leave it
# still writing for seconds after its first spill file appears.
GCS_SYNTHETIC = 30_000
RETRY_DEADLINE_S = "1"


def start_job(output, *flags, env=None, count=SYNTHETIC):
    return subprocess.Popen(
        [sys.executable, "-m", "pipeline", f"--source=synthetic:{count}",
         f"--output={output}", "--min_shards=4", "--runner=DirectRunner", *flags],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, **(env or {})})


def wait_for(condition, process, timeout=120):
    """Polls until ``condition()`` while ``process`` runs; fails if it ends first."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        if process.poll() is not None:
            pytest.fail(f"job ended (rc={process.returncode}) before the fault: "
                        f"{process.stderr.read()[-2000:]}")
        time.sleep(0.02)
    pytest.fail("job never reached the point of the fault")


def final_files(names):
    """Names a reader could take for data (a killed run leaves its temp folder and lock)."""
    return sorted(n for n in names if not n.startswith(".incomplete-") and n != ".lock")


def test_multi_process_workers_write_identical_files(tmp_path, idx_dir):
    run_job([f"--source={idx_dir}", f"--output={tmp_path}/one", "--min_shards=3",
             "--allow_extreme_sharding"])
    run_job([f"--source={idx_dir}", f"--output={tmp_path}/two", "--min_shards=3",
             "--allow_extreme_sharding",
             "--direct_num_workers=2", "--direct_running_mode=multi_processing"])
    one = {p.name: p.read_bytes() for p in (tmp_path / "one").iterdir()}
    two = {p.name: p.read_bytes() for p in (tmp_path / "two").iterdir()}
    assert one == two and len(one) == 9


@pytest.mark.slow
def test_sigkill_mid_write_local(tmp_path, idx_dir):
    out = tmp_path / "out"
    run_job([f"--source={idx_dir}", f"--output={out}"])
    before = {p.name: p.read_bytes() for p in out.iterdir()}

    process = start_job(out, "--overwrite")
    wait_for(lambda: any(out.glob(".incomplete-*/spill/train-*")), process)
    process.send_signal(signal.SIGKILL)
    process.wait()

    after = {p.name: p.read_bytes() for p in out.iterdir()
             if p.is_file() and p.name != ".lock"}
    assert after == before, "the earlier dataset changed"
    stale = list(out.glob(".incomplete-*"))
    assert stale, "expected the killed run's temp folder"

    rerun = start_job(out, "--overwrite")
    _, stderr = rerun.communicate(timeout=300)
    assert rerun.returncode == 0, stderr[-2000:]
    assert "left by an earlier run that did not finish" in stderr
    assert not any(s.exists() for s in stale)
    manifest = verify(str(out))
    assert manifest.split("train").num_examples == SYNTHETIC


@pytest.mark.slow
def test_sigkill_mid_write_gcs(gcs_emulator):
    prefix = f"killed/{uuid.uuid4().hex[:8]}"
    output = f"gs://{EMULATOR_BUCKET}/{prefix}"
    client = gcs_emulator.client()
    names = lambda: [b.name[len(prefix) + 1:]  # noqa: E731
                     for b in client.list_blobs(EMULATOR_BUCKET, prefix=prefix + "/")]

    process = start_job(output, count=GCS_SYNTHETIC)
    wait_for(lambda: any("/spill/" in n for n in names()), process)
    process.send_signal(signal.SIGKILL)
    process.wait()
    assert final_files(names()) == [], "a killed run published files"

    rerun = start_job(output, count=GCS_SYNTHETIC)
    _, stderr = rerun.communicate(timeout=300)
    assert rerun.returncode == 0, stderr[-2000:]
    assert not any(n.startswith(".incomplete-") for n in names())
    assert verify_main([output]) == 0


def test_retry_deadline_bounds_opening_a_file_for_reading():
    """Opening a gs:// file for reading reloads its metadata first; with no
    server there, the job's deadline ends that call too, not the storage
    library's 120 s default."""
    code = ("from pipeline import storage\n"
            "storage.configure_gcs()\n"
            "try:\n"
            f"    storage.open_read('gs://{EMULATOR_BUCKET}/missing')\n"
            "except Exception as e:\n"
            "    print(type(e).__name__, e)\n")
    env = {**os.environ, "STORAGE_EMULATOR_HOST": f"http://127.0.0.1:{free_port()}",
           storage.RETRY_DEADLINE_ENV: RETRY_DEADLINE_S}
    done = subprocess.run([sys.executable, "-c", code], env=env, cwd=REPO, capture_output=True,
                          text=True, timeout=100)
    assert f"Timeout of {float(RETRY_DEADLINE_S)}s exceeded" in done.stdout, \
        done.stdout + done.stderr[-2000:]


@pytest.mark.slow
def test_storage_dies_mid_job_then_rerun_completes(tmp_path):
    """The GCS server stops partway: a clear failure, nothing published, rerun whole.

    Beam's GCS client would retry for 120 s before giving up; the job's
    retry deadline setting cuts that to a second per failing call.
    """
    emulator = GcsEmulator(free_port(), data_dir=str(tmp_path / "gcs"))
    emulator.start()
    env = {"STORAGE_EMULATOR_HOST": emulator.host,
           storage.RETRY_DEADLINE_ENV: RETRY_DEADLINE_S}
    prefix = "outage"
    output = f"gs://{EMULATOR_BUCKET}/{prefix}"
    try:
        client = emulator.client()
        names = lambda: [b.name[len(prefix) + 1:]  # noqa: E731
                         for b in client.list_blobs(EMULATOR_BUCKET, prefix=prefix + "/")]
        process = start_job(output, env=env, count=GCS_SYNTHETIC)
        wait_for(lambda: any("/spill/" in n for n in names()), process)
        emulator.stop()
        _, stderr = process.communicate(timeout=400)
        assert process.returncode == 1, stderr[-2000:]  # storage failed: at run time
        last = stderr.strip().splitlines()[-1]
        assert last.startswith(f"error: {output}: storage failed during the run"), last
        assert f"Timeout of {float(RETRY_DEADLINE_S)}s exceeded" in last, \
            "the retry deadline setting was ignored"

        emulator.start()
        assert final_files(names()) == [], "a failed run published files"
        rerun = start_job(output, env=env, count=GCS_SYNTHETIC)
        _, stderr = rerun.communicate(timeout=300)
        assert rerun.returncode == 0, stderr[-2000:]
        verified = subprocess.run(
            [sys.executable, "-m", "pipeline.verify", output], cwd=REPO,
            capture_output=True, text=True, env={**os.environ, **env}, timeout=300)
        assert verified.returncode == 0, verified.stderr[-2000:]
        assert f"train: {GCS_SYNTHETIC} examples" in verified.stdout
        assert contract.MANIFEST_FILE in names()
    finally:
        emulator.stop()


@pytest.mark.parametrize("failing", ["mnist-train.tfrecord", "dataset_info.json",
                                     contract.MANIFEST_FILE])
def test_crash_while_finalizing_never_publishes_a_manifest(tmp_path, idx_dir,
                                                           monkeypatch, failing):
    """Finalize dies at any of its moves: readers must see no dataset."""
    from pipeline.publish import output
    out = tmp_path / "out"
    run_job([f"--source={idx_dir}", f"--output={out}", "--min_shards=2",
             "--allow_extreme_sharding"])
    real_rename = output.storage.rename

    def rename(sources, destinations):
        if any(failing in d for d in destinations):
            raise OSError("disk went away")
        real_rename(sources, destinations)

    monkeypatch.setattr(output.storage, "rename", rename)
    with pytest.raises(StorageError, match="disk went away.*no complete dataset"):
        run_job([f"--source={idx_dir}", f"--output={out}", "--overwrite"])
    assert not (out / contract.MANIFEST_FILE).exists()
    assert verify_main([str(out)]) == 2  # "manifest.json: missing"
    monkeypatch.setattr(output.storage, "rename", real_rename)
    # The rerun completes the publish, which is the dataset its options describe.
    done = job_result([f"--source={idx_dir}", f"--output={out}", "--overwrite"])
    assert done.manifest is None and "nothing left to do" in done.nothing_left
    manifest = run_job([f"--source={idx_dir}", f"--output={tmp_path / 'clean'}"])
    assert verify(str(out)) == manifest
