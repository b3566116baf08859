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
from tests.helpers import EMULATOR_BUCKET, REPO

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

RUN_SECONDS = 120  # any one command; the server's handler errors stop it sooner
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
    # Beam's DirectRunner first tries to download its Prism runner from
    # GitHub, and runs the job itself when it cannot; nothing else may leave.
    hosts = {line.split()[1] for line in gcs_tls_server.proxy.refused[refused:]}
    assert hosts <= {"github.com:443"}, hosts
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
    assert proc.returncode == 1 and len(errors) == 1, proc.stderr[-3000:]
    assert f"gs://{EMULATOR_BUCKET}/{data}/" in errors[0] and expected in errors[0], errors
    assert not _names(gcs_tls, f"{data}-model")
