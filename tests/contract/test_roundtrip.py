"""Pipeline → trainer: the Beam job writes real digits, the trainer reads and learns them.

The job runs on the DirectRunner in this process; the trainer reads its
output through the same contract (manifest.json, shard names, features).
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import tensorflow as tf


from tests.helpers import REPO, run_job
from trainer import predict
from trainer.config import TrainConfig
from trainer.data import input_pipeline, splits
from trainer.train import train_and_evaluate

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def converted(tmp_path_factory, digits):
    from tests.helpers import write_idx_split
    root = tmp_path_factory.mktemp("roundtrip")
    for split, (images, labels) in digits.items():
        write_idx_split(root / "idx", split, images, labels)
    out = str(root / "out")
    manifest = run_job([f"--source={root / 'idx'}", f"--output={out}", "--min_shards=4",
                        "--allow_extreme_sharding", "--runner=DirectRunner"])
    return out, manifest


def test_trainer_reads_the_manifest(converted, digits):
    out, manifest = converted
    read = splits.load_manifest(out)
    assert read.to_json() == manifest.to_json()
    train = splits.split_files(out, read, "train")
    assert len(train.files) >= 4
    assert train.num_examples == len(digits["train"][1])


def test_every_example_once_per_epoch_and_disjoint_pipelines(converted, digits):
    out, manifest = converted
    train = splits.split_files(out, manifest, "train")
    n = train.num_examples
    ds = input_pipeline.train_dataset(train, 1, tf.distribute.InputContext())
    seen = [int(b["index"][0]) for b in ds.take(2 * n)]
    assert sorted(seen[:n]) == list(range(n)) and sorted(seen[n:]) == list(range(n))
    counts = input_pipeline.pipeline_example_counts(train.counts, 2)
    union = []
    for i in range(2):
        ctx = tf.distribute.InputContext(num_input_pipelines=2, input_pipeline_id=i,
                                         num_replicas_in_sync=2)
        ds = input_pipeline.train_dataset(train, 2, ctx)
        got = [int(b["index"][0]) for b in ds.take(counts[i])]
        assert len(set(got)) == counts[i]
        union.extend(got)
    assert sorted(union) == list(range(n))


@pytest.fixture(scope="module")
def trained(converted, tmp_path_factory):
    """loop -> (model_dir, metrics) of a run on the converted digits, trained once."""
    out, _ = converted
    runs = {}

    def get(loop):
        if loop not in runs:
            model_dir = str(tmp_path_factory.mktemp(f"model-{loop}"))
            runs[loop] = model_dir, train_and_evaluate(TrainConfig(
                data=out, model_dir=model_dir, loop=loop, epochs=4, global_batch_size=16,
                steps_per_execution=5, verbose=0, seed=0, log_every=50))
        return runs[loop]
    return get


@pytest.mark.parametrize("loop", ["keras", "custom"])
def test_trainer_learns_the_pipeline_output(converted, digits, trained, loop, capsys):
    out, _ = converted
    model_dir, metrics = trained(loop)
    assert metrics["test_examples"] == len(digits["test"][1])  # 90: not a multiple of 16
    assert metrics["train_steps"] == 4 * (len(digits["train"][1]) // 16)
    h = metrics["history"]
    assert h["train_loss"][-1] < h["train_loss"][0]
    assert metrics["test_accuracy"] > 0.6  # real digits; chance is 0.1

    # The export, run by the predict CLI over the same split, counts exactly
    # as many correct answers as the trainer reported.
    capsys.readouterr()
    assert predict.main([f"--model_dir={model_dir}", f"--data={out}", "--split=test"]) == 0
    lines = capsys.readouterr().out.splitlines()
    n = metrics["test_examples"]
    correct = round(metrics["test_accuracy"] * n)
    assert lines[-1] == f"accuracy={correct / n:.4f} ({correct}/{n}) on split test"
    assert len(lines) == n + 1 and lines[0].startswith("index=")
    assert predict.main([f"--model_dir={model_dir}", f"--data={out}", "--limit=7"]) == 0
    assert capsys.readouterr().out.splitlines()[-1].endswith("/7) on split test")


def test_predict_command_on_png_files(trained, digits, tmp_path):
    """``python -m trainer.predict`` on PNG files of real digits, as a user runs it."""
    model_dir, _ = trained("keras")  # the export of the Keras run above
    images, _ = digits["test"]
    paths = []
    for i in range(4):
        path = tmp_path / f"digit-{i}.png"
        path.write_bytes(tf.io.encode_png(images[i][..., None]).numpy())
        paths.append(str(path))
    proc = subprocess.run([sys.executable, "-m", "trainer.predict", f"--model_dir={model_dir}",
                           *paths], cwd=REPO, capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    serve = tf.saved_model.load(f"{model_dir}/export").signatures["serving_default"]
    expected = serve(images=tf.constant(images[:4]))
    lines = proc.stdout.splitlines()
    assert len(lines) == 4
    for line, path, cls, probs in zip(lines, paths, expected["class"].numpy(),
                                      expected["probabilities"].numpy()):
        assert line == f"{path} class={cls} probability={probs[cls]:.4f}"
