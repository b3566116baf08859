"""The TPU VM's data path: dataset and ``model_dir`` on gs://, through
TensorFlow's own GCS client (`tests.gcs_tls`), command lines as on the VM.

The job writes the offline sample into the bucket (google-cloud-storage);
both training loops read it and write checkpoints, TensorBoard logs, the
export and ``metrics.json`` under gs://, resume from there, and
``trainer.predict`` evaluates the gs:// export. Object storage has no
directories, renames are copies plus deletes and listings are by prefix, so
each of these is its own check of the trainer's file handling.
"""

from __future__ import annotations

import json
import re
import sys
import uuid

import pytest

import mnist_contract as contract
from mnist_common import storage_lock
from tests.helpers import EMULATOR_BUCKET, REPO, RefusingGcsServer

# Hang bounds, not speed bars: a test here took at most 29 s, and one
# command (a training) at most as long, measured with the machine's load at
# 2-3; the bounds are over 10x that.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

RUN_SECONDS = 300  # any one command; the server's handler errors stop it sooner
STEPS_PER_EPOCH = 10
# Small and quick: the data path is under test here, not learning.
TRAIN_FLAGS = ["--preset=smoke", f"--steps_per_epoch={STEPS_PER_EPOCH}", "--global_batch_size=32",
               "--steps_per_execution=5", "--log_every=5", "--verbose=0", "--seed=0"]
LOOPS = {"keras": [], "custom": ["--cpu_replicas=2"]}


@pytest.fixture(scope="module")
def root():
    return f"e2e-{uuid.uuid4().hex[:8]}"


def _run(server, *args: str):
    return server.run([sys.executable, *args], timeout=RUN_SECONDS, cwd=REPO)


def _succeed(server, *args: str) -> str:
    proc = _run(server, *args)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    return proc.stdout


def _bucket(server):
    return server.emulator.client().bucket(EMULATOR_BUCKET)


def _manifest(server, data: str) -> contract.Manifest:
    return contract.Manifest.from_json(server.emulator.download(f"{data}/manifest.json").decode())


def _names(server, prefix: str) -> set[str]:
    blobs = server.emulator.client().list_blobs(EMULATOR_BUCKET, prefix=prefix + "/",
                                                timeout=10)
    return {b.name[len(prefix) + 1:] for b in blobs}


@pytest.fixture(scope="module")
def dataset(gcs_tls_server, root) -> str:
    """gs:// path of the sample converted by ``python -m pipeline``."""
    data = f"{root}/mnist"
    refused = len(gcs_tls_server.proxy.refused)
    _succeed(gcs_tls_server, "-m", "pipeline", f"--output=gs://{EMULATOR_BUCKET}/{data}",
             "--source=sample", "--runner=DirectRunner")
    # Nothing leaves the machine (Beam's DirectRunner would try to download
    # its Prism runner from GitHub; the job skips that).
    hosts = {line.split()[1] for line in gcs_tls_server.proxy.refused[refused:]}
    assert not hosts, hosts
    return data


@pytest.fixture(scope="module")
def trained(gcs_tls_server, dataset, root):
    """loop -> (model_dir prefix, stdout of the 1-epoch run, of the 2-epoch rerun)."""
    runs = {}

    def get(loop):
        if loop not in runs:
            model_dir = f"{root}/run-{loop}"
            args = ["-m", "trainer", f"--data=gs://{EMULATOR_BUCKET}/{dataset}",
                    f"--model_dir=gs://{EMULATOR_BUCKET}/{model_dir}", f"--loop={loop}",
                    *TRAIN_FLAGS, *LOOPS[loop]]
            first = _succeed(gcs_tls_server, *args, "--epochs=1")
            # The rerun resumes from the epoch-1 checkpoint and, keeping one,
            # deletes it once the epoch-2 checkpoint is written.
            second = _succeed(gcs_tls_server, *args, "--epochs=2", "--keep_checkpoints=1")
            runs[loop] = model_dir, first, second
        return runs[loop]
    return get


def test_pipeline_writes_the_dataset_into_the_bucket(gcs_tls, dataset):
    names = _names(gcs_tls, dataset)
    manifest = _manifest(gcs_tls, dataset)
    shards = {*manifest.split("train").files, *manifest.split("test").files}
    assert shards and shards <= names and contract.PUBLISH_JOURNAL_FILE not in names


@pytest.mark.parametrize("loop", LOOPS)
def test_trainer_writes_its_outputs_to_gs(gcs_tls, trained, loop):
    model_dir, _, _ = trained(loop)
    names = _names(gcs_tls, model_dir)
    steps = 2 * STEPS_PER_EPOCH
    checkpoints = {n.split(".")[0] for n in names if n.startswith("checkpoints/ckpt-")}
    assert checkpoints == {f"checkpoints/ckpt-{steps}"}  # epoch 1's pruned
    assert {f"checkpoints/ckpt-{steps}.index", "checkpoints/checkpoint"} <= names
    for run in ("train", "validation"):
        assert [n for n in names if n.startswith(f"logs/{run}/events.out.tfevents.")], run
    assert {"export/saved_model.pb", "export/variables/variables.index"} <= names
    metrics = json.loads(gcs_tls.emulator.download(f"{model_dir}/metrics.json"))
    assert metrics["loop"] == loop and metrics["train_steps"] == steps
    assert metrics["replicas"] == (2 if "--cpu_replicas=2" in LOOPS[loop] else 1)
    assert len(metrics["history"]["test_accuracy"]) == 2
    # The export and metrics.json committed together; nothing of the commit
    # or the lock left behind.
    exported = json.loads(gcs_tls.emulator.download(f"{model_dir}/export/trainer_export.json"))
    assert exported["export_id"] == metrics["export_id"]
    assert metrics["dataset"]["data"].startswith(f"gs://{EMULATOR_BUCKET}/")
    assert not [n for n in names if n.startswith((".export.", ".lock"))], sorted(names)
    assert "dataset.json" in names


def _quoted(name: str) -> str:
    return name.replace("/", "%2F")


@pytest.mark.parametrize("loop", LOOPS)
def test_trainer_goes_through_tensorflows_gcs_client(gcs_tls, trained, dataset, loop):
    """The requests behind the files above: shards read by range from the
    download host, renames as a copy plus a delete, pruning as deletes."""
    model_dir, _, _ = trained(loop)
    seen = [(e.method, e.url) for e in gcs_tls.proxy.exchanges]
    checkpoints = _quoted(f"{model_dir}/checkpoints/")
    for shard in _manifest(gcs_tls, dataset).split("train").files:
        assert ("GET", f"https://storage.googleapis.com/{EMULATOR_BUCKET}/"
                       f"{_quoted(f'{dataset}/{shard}')}") in seen
    assert [u for m, u in seen if m == "POST" and checkpoints in u and "/rewriteTo/" in u]
    assert ("DELETE", f"https://www.googleapis.com/storage/v1/b/{EMULATOR_BUCKET}/o/"
                      f"{checkpoints}ckpt-{STEPS_PER_EPOCH}.index") in seen


@pytest.mark.parametrize("loop", LOOPS)
def test_trainer_resumes_from_its_gs_checkpoint(trained, loop):
    _, first, second = trained(loop)
    assert "resuming at step" not in first
    assert f"resuming at step {STEPS_PER_EPOCH}/{2 * STEPS_PER_EPOCH}" in second


def test_predict_on_the_gs_export_matches_metrics(gcs_tls, trained, dataset):
    model_dir, _, _ = trained("keras")
    metrics = json.loads(gcs_tls.emulator.download(f"{model_dir}/metrics.json"))
    out = _succeed(gcs_tls, "-m", "trainer.predict",
                   f"--model_dir=gs://{EMULATOR_BUCKET}/{model_dir}",
                   f"--data=gs://{EMULATOR_BUCKET}/{dataset}", "--split=test")
    correct, total = map(int, re.search(r"^accuracy=[\d.]+ \((\d+)/(\d+)\) on split test$",
                                        out, re.M).groups())
    assert total == metrics["test_examples"]
    assert correct == round(metrics["test_accuracy"] * total)


def _copy_dataset(server, source: str, target: str) -> None:
    bucket = _bucket(server)
    for name in _names(server, source):
        bucket.copy_blob(bucket.blob(f"{source}/{name}"), bucket, f"{target}/{name}",
                         timeout=10)


def _publish_journal(server, data: str) -> str:
    blob = _bucket(server).blob(f"{data}/{contract.PUBLISH_JOURNAL_FILE}")
    blob.upload_from_string(b'{"run_id": "r1"}', timeout=10)
    return "interrupted publish"


def _resize_shard(server, data: str) -> str:
    shard = _manifest(server, data).split("train").shards[0]
    name = f"{data}/{shard.file}"
    _bucket(server).blob(name).upload_from_string(server.emulator.download(name)[:-1],
                                                  timeout=10)
    return f"{shard.file}: {shard.num_bytes - 1} bytes, but"


def _drop_manifest(server, data: str) -> str:
    _bucket(server).blob(f"{data}/manifest.json").delete(timeout=10)
    return "manifest.json: no manifest.json"


@pytest.mark.parametrize("damage", [_publish_journal, _resize_shard, _drop_manifest],
                         ids=["publish-journal", "resized-shard", "no-manifest"])
def test_trainer_refuses_a_damaged_gs_dataset(gcs_tls, dataset, root, damage):
    data = f"{root}/damaged-{damage.__name__.strip('_')}"
    _copy_dataset(gcs_tls, dataset, data)
    expected = damage(gcs_tls, data)
    proc = _run(gcs_tls, "-m", "trainer", f"--data=gs://{EMULATOR_BUCKET}/{data}",
                f"--model_dir=gs://{EMULATOR_BUCKET}/{data}-model", *TRAIN_FLAGS, "--epochs=1")
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert proc.returncode == 2 and len(errors) == 1, proc.stderr[-3000:]
    assert f"gs://{EMULATOR_BUCKET}/{data}/" in errors[0] and expected in errors[0], errors
    assert not _names(gcs_tls, f"{data}-model")


def _error_lines(proc) -> list[str]:
    return [line for line in proc.stderr.splitlines() if line.startswith("error:")]


def test_a_gs_model_dir_in_use_is_refused(gcs_tls, dataset, root):
    """The model_dir lock on gs://: a live holder's lock (this test process)
    makes a second run refuse with one line naming it, writing nothing."""
    model_dir = f"{root}/locked-model"
    holder = storage_lock.LockInfo.for_this_process("other-run")
    _bucket(gcs_tls).blob(f"{model_dir}/{storage_lock.LOCK_FILE}").upload_from_string(
        holder.to_bytes(), timeout=10)
    proc = _run(gcs_tls, "-m", "trainer", f"--data=gs://{EMULATOR_BUCKET}/{dataset}",
                f"--model_dir=gs://{EMULATOR_BUCKET}/{model_dir}", *TRAIN_FLAGS, "--epochs=1")
    errors = _error_lines(proc)
    assert proc.returncode == 1 and len(errors) == 1, proc.stderr[-3000:]
    assert f"gs://{EMULATOR_BUCKET}/{model_dir}" in errors[0] and "other-run" in errors[0]
    assert _names(gcs_tls, model_dir) <= {storage_lock.LOCK_FILE}


def test_the_lock_is_not_written_through_tensorflows_client(gcs_tls, trained):
    """The model_dir lock goes through google-cloud-storage (straight to the
    server, with generation preconditions), so no request for it passed the
    proxy that TensorFlow's client goes through."""
    model_dir, _, _ = trained("keras")
    folder = _quoted(f"{model_dir}/")
    urls = [e.url for e in gcs_tls.proxy.exchanges if folder in e.url]
    assert urls  # the run's other files did pass it
    assert not [u for u in urls if storage_lock.LOCK_FILE in u], urls


def test_a_refused_gs_lock_is_one_line(gcs_tls, dataset, root):
    """TensorFlow's client may write model_dir, but GCS refuses the lock's
    client (HTTP 403): the run stops at the lock with one line, exit 1."""
    model_dir = f"gs://{EMULATOR_BUCKET}/{root}/refused-model"
    message = "runner@p.iam.gserviceaccount.com does not have storage.objects.create access"
    with RefusingGcsServer(403, message) as refusing:
        proc = gcs_tls.run([sys.executable, "-m", "trainer",
                            f"--data=gs://{EMULATOR_BUCKET}/{dataset}",
                            f"--model_dir={model_dir}", *TRAIN_FLAGS, "--epochs=1"],
                           timeout=RUN_SECONDS, cwd=REPO,
                           extra_env={"STORAGE_EMULATOR_HOST": refusing.host})
    errors = _error_lines(proc)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert errors == [f"error: {model_dir}/{storage_lock.LOCK_FILE}: cannot take the lock of "
                      f"--model_dir (403 Forbidden: {message})"], proc.stderr[-3000:]


def test_a_gs_model_dir_in_a_missing_bucket_is_one_line(gcs_tls, dataset):
    """TensorFlow's makedirs would ask for the missing bucket forever; the
    run ends at once with one line naming it."""
    model_dir = "gs://no-such-bucket/model"
    proc = _run(gcs_tls, "-m", "trainer", f"--data=gs://{EMULATOR_BUCKET}/{dataset}",
                f"--model_dir={model_dir}", *TRAIN_FLAGS, "--epochs=1")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert _error_lines(proc) == [f"error: {model_dir}: cannot create --model_dir (bucket "
                                  "gs://no-such-bucket does not exist)"], proc.stderr[-3000:]


def test_resuming_a_gs_model_dir_on_other_data_is_refused(gcs_tls, trained, dataset, root):
    """The pinned dataset on gs://: the same records under another manifest
    (other bytes, so another identity) are refused on resume."""
    model_dir, _, _ = trained("keras")
    other = f"{root}/other-mnist"
    _copy_dataset(gcs_tls, dataset, other)
    manifest = json.loads(gcs_tls.emulator.download(f"{other}/manifest.json"))
    _bucket(gcs_tls).blob(f"{other}/manifest.json").upload_from_string(
        json.dumps(manifest, indent=1).encode(), timeout=10)
    before = _names(gcs_tls, model_dir)
    proc = _run(gcs_tls, "-m", "trainer", f"--data=gs://{EMULATOR_BUCKET}/{other}",
                f"--model_dir=gs://{EMULATOR_BUCKET}/{model_dir}", *TRAIN_FLAGS, "--epochs=3")
    errors = _error_lines(proc)
    assert proc.returncode == 2 and len(errors) == 1, proc.stderr[-3000:]
    assert "--allow_new_dataset" in errors[0] and f"gs://{EMULATOR_BUCKET}/{other}" in errors[0]
    assert _names(gcs_tls, model_dir) == before


def test_sigkill_then_rerun_resumes_from_gs(gcs_tls, dataset, root):
    """A run killed once its first checkpoint is in the bucket leaves its
    lock there; the same command again takes the dead holder's lock over
    and resumes from the gs:// checkpoint."""
    import os
    import signal
    import subprocess
    import time
    model_dir = f"{root}/killed-model"
    args = [sys.executable, "-m", "trainer", f"--data=gs://{EMULATOR_BUCKET}/{dataset}",
            f"--model_dir=gs://{EMULATOR_BUCKET}/{model_dir}", *TRAIN_FLAGS,
            "--epochs=3", "--checkpoint_every=5"]
    proc = subprocess.Popen(args, env=gcs_tls.env(), cwd=REPO, start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + RUN_SECONDS
    try:
        # A whole checkpoint: its index merged out of ckpt-N_temp/.
        while not [n for n in _names(gcs_tls, model_dir)
                   if re.fullmatch(r"checkpoints/ckpt-\d+\.index", n)]:
            assert proc.poll() is None, "training ended before a checkpoint was seen"
            assert time.monotonic() < deadline, "no checkpoint in the bucket"
            time.sleep(0.2)
    finally:
        gcs_tls.expect_killed_clients()  # its request in flight ends in a broken pipe
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    assert ".lock" in _names(gcs_tls, model_dir)  # left by the killed run
    proc = _run(gcs_tls, *args[1:])
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    assert re.search(r"resuming at step \d+/30", proc.stdout), proc.stdout[-2000:]
    metrics = json.loads(gcs_tls.emulator.download(f"{model_dir}/metrics.json"))
    assert metrics["train_steps"] == 30 and metrics["resumed_from_step"] > 0
    assert ".lock" not in _names(gcs_tls, model_dir)
