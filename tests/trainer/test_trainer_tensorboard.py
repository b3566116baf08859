"""TensorBoard beyond scalars, read back with TensorBoard's own reader: the input
digits, the confusion matrix, the misclassified digits and the config (HParams),
in both loops; and the evaluator's cross-replica sums on two replicas."""

from __future__ import annotations

import textwrap

import numpy as np
import pytest
import tensorflow as tf
from tensorboard.backend.event_processing import event_accumulator
from tensorboard.plugins.hparams import metadata as hparams_metadata

import mnist_contract as contract
from tests import trainer_data
from tests.helpers import run_results_script
from trainer import __main__ as cli, serving
from trainer.loop import images

pytestmark = pytest.mark.slow

NUM_TRAIN, NUM_TEST = 128, 21
# Each loop's run: Keras with augmentation, custom without; 2 epochs of 8 steps.
RUNS = {"keras": ["--augment"], "custom": []}


@pytest.fixture(scope="module")
def runs(trainer_dataset, tmp_path_factory):
    """{loop: (data dir, model_dir)} of one short run per loop."""
    dataset = trainer_dataset(num_train=NUM_TRAIN, num_test=NUM_TEST, train_shards=3)
    out = {}
    for loop, extra in RUNS.items():
        model_dir = str(tmp_path_factory.mktemp(f"tb-{loop}"))
        assert cli.main([f"--data={dataset}", f"--model_dir={model_dir}", "--preset=smoke",
                         f"--loop={loop}", "--epochs=2", "--global_batch_size=16",
                         "--steps_per_execution=4", "--verbose=0", "--seed=2", *extra]) == 0
        out[loop] = dataset, model_dir
    return out


def read_run(logs_dir: str) -> event_accumulator.EventAccumulator:
    acc = event_accumulator.EventAccumulator(
        logs_dir, size_guidance={event_accumulator.TENSORS: 0})
    acc.Reload()
    return acc


def image_at(acc, tag: str, step: int) -> tuple[np.ndarray, str]:
    """The PNG of image summary ``tag`` at ``step``, decoded, and its description."""
    meta = acc.SummaryMetadata(tag)
    assert meta.plugin_data.plugin_name == "images"
    (event,) = [e for e in acc.Tensors(tag) if e.step == step]
    width, height, png = tf.make_ndarray(event.tensor_proto)
    image = tf.io.decode_png(png).numpy()
    assert image.shape == (int(height), int(width), 3)
    return image, meta.summary_description


def tensor_at(acc, tag: str, step: int) -> np.ndarray:
    (event,) = [e for e in acc.Tensors(tag) if e.step == step]
    return tf.make_ndarray(event.tensor_proto)


def export_predictions(dataset: str, model_dir: str):
    """(indices, labels, classes) of the export on the test split, in file order."""
    signature = serving.load_signature(model_dir)
    batches = list(serving.split_batches(dataset, "test", None))
    indices, labels = (np.concatenate([b[k] for b in batches])
                       for k in (contract.INDEX_KEY, contract.LABEL_KEY))
    classes = np.concatenate([serving.predict(signature, b[contract.IMAGE_KEY])[0]
                              for b in batches])
    return indices, labels, classes


def tiles(image: np.ndarray, height: int, width: int, count: int, columns: int):
    gap = 2
    for i in range(count):
        top, left = gap + (i // columns) * (height + gap), gap + (i % columns) * (width + gap)
        yield image[top:top + height, left:left + width, 0]


@pytest.mark.parametrize("loop", RUNS)
def test_inputs_show_a_training_batch_after_augmentation(runs, loop):
    dataset, model_dir = runs[loop]
    image, description = image_at(read_run(f"{model_dir}/logs/train"), "inputs", 0)
    assert image.shape == (8 * 30 + 2, 8 * 30 + 2, 3)  # 64 digits, 8 a row
    train_images, _ = trainer_data.make_arrays(NUM_TRAIN, 0)
    known = {digit.tobytes() for digit in train_images[..., 0]}
    exact = [t.tobytes() in known for t in tiles(image, 28, 28, 64, 8)]
    if RUNS[loop]:  # --augment: warped digits, not the stored ones
        assert sum(exact) < 8 and "augmentation" in description
    else:
        assert all(exact) and "no --augment" in description


@pytest.mark.parametrize("loop", RUNS)
def test_confusion_matrix_after_each_evaluation(runs, loop):
    dataset, model_dir = runs[loop]
    acc = read_run(f"{model_dir}/logs/validation")
    for step in (8, 16):
        image, description = image_at(acc, "confusion_matrix", step)
        matrix = tensor_at(acc, "confusion_counts", step)
        assert matrix.shape == (10, 10) and matrix.sum() == NUM_TEST
        np.testing.assert_array_equal(image, images.confusion_image(matrix))
        assert "true class (rows" in description
    # The last evaluation's matrix is the exported (final) model's on the test split.
    _, labels, classes = export_predictions(dataset, model_dir)
    expected = np.zeros((10, 10), np.int64)
    np.add.at(expected, (labels, classes), 1)
    np.testing.assert_array_equal(matrix, expected)


@pytest.mark.parametrize("loop", RUNS)
def test_misclassified_digits_with_their_labels(runs, loop):
    dataset, model_dir = runs[loop]
    """The last pass's first misclassified digits (the exported model's, in
    file order), each twice its size over its P<predicted> T<true> caption."""
    image, description = image_at(read_run(f"{model_dir}/logs/validation"),
                                  "misclassified", 16)
    indices, labels, classes = export_predictions(dataset, model_dir)
    wrong = np.flatnonzero(classes != labels)[:25]
    assert 0 < len(wrong) < NUM_TEST
    assert image.shape == (-(-len(wrong) // 5) * 72 + 2, min(5, len(wrong)) * 58 + 2, 3)
    test_images, _ = trainer_data.eval_arrays(NUM_TEST)
    digits = test_images[indices[wrong]]
    for tile, digit in zip(tiles(image, 70, 56, len(wrong), 5), digits[..., 0]):
        np.testing.assert_array_equal(tile[:56], digit.repeat(2, axis=0).repeat(2, axis=1))
    expected = images.image_grid(images.captioned(
        digits.astype(np.float32) / 255.0, classes[wrong], labels[wrong]), 5)
    np.testing.assert_array_equal(image, expected)  # the captions too
    assert "P<predicted>" in description


@pytest.mark.parametrize("loop", RUNS)
def test_config_and_test_metrics_for_the_hparams_dashboard(runs, loop):
    dataset, model_dir = runs[loop]
    acc = read_run(f"{model_dir}/logs")
    contents = acc.PluginTagToContent(hparams_metadata.PLUGIN_NAME)
    start = hparams_metadata.parse_session_start_info_plugin_data(
        contents[hparams_metadata.SESSION_START_INFO_TAG])
    values = {name: value.WhichOneof("kind") and getattr(value, value.WhichOneof("kind"))
              for name, value in start.hparams.items()}
    assert values["loop"] == loop and values["model"] == "small"
    assert values["augment"] is bool(RUNS[loop]) and values["data"] == dataset
    assert values["epochs"] == 2 and values["global_batch_size"] == 16
    assert values["steps_per_epoch"] == 8 and values["seed"] == 2
    assert "tpu" not in values  # unset
    experiment = hparams_metadata.parse_experiment_plugin_data(
        contents[hparams_metadata.EXPERIMENT_TAG])
    assert sorted(m.name.tag for m in experiment.metric_infos) == ["test_accuracy",
                                                                   "test_loss"]
    assert {h.name for h in experiment.hparam_infos} == set(values)
    metrics = trainer_data.read_metrics(model_dir)
    for tag in ("test_accuracy", "test_loss"):
        (event,) = acc.Tensors(tag)
        assert event.step == 16
        assert float(tf.make_ndarray(event.tensor_proto)) == pytest.approx(metrics[tag])


def test_evaluator_sums_across_replicas(tmp_path):
    """Two replicas: the confusion matrix counts every example once, and each
    replica keeps its own first misclassified examples, side by side."""
    results, _ = run_results_script(textwrap.dedent(r'''
        import json
        import trainer
        from trainer import strategy as strategy_lib
        strategy_lib.split_cpu(2)
        import numpy as np
        import tensorflow as tf
        from trainer.loop import eval_metrics

        strategy = tf.distribute.MirroredStrategy(["CPU:0", "CPU:1"])
        with strategy.scope():
            confusion = eval_metrics.ConfusionMatrix()
            kept = eval_metrics.Misclassified(capacity=3, replicas=2)
        # Replica r, step s: labels 0..3; predictions wrong where marked;
        # index 100*r + 10*s + position; the last row is padding (weight 0).
        wrong = {(0, 0): [1, 0, 1, 1], (0, 1): [1, 1, 0, 1], (1, 0): [0, 0, 0, 1],
                 (1, 1): [1, 0, 0, 1]}

        def batch(ctx, step):
            r = ctx.replica_id_in_sync_group
            labels = tf.constant([0, 1, 2, 3], tf.int64)
            predictions = (labels + tf.constant(wrong[r, step], tf.int64)) % 10
            index = tf.constant([100 * r + 10 * step + i for i in range(4)], tf.int64)
            images = tf.cast(tf.reshape(index, [4, 1, 1, 1]), tf.float32) * tf.ones(
                [4, 28, 28, 1]) / 1000.0
            return images, labels, predictions, index, tf.constant([1.0, 1, 1, 0])

        def update(images, labels, predictions, index, weights):
            confusion.update_state(labels, predictions, sample_weight=weights)
            kept.update_state(images, labels, predictions, index, weights)

        for step in (0, 1):
            values = strategy.experimental_distribute_values_from_function(
                lambda ctx: batch(ctx, step))
            tf.function(lambda v: strategy.run(update, args=v))(values)
        read = kept.read(10)
        print("RESULTS " + json.dumps({
            "confusion": confusion.result().numpy().tolist(),
            "indices": read["indices"].tolist(), "predicted": read["predicted"].tolist(),
            "labels": read["labels"].tolist(),
            "pixels": [float(read["images"][i].mean()) for i in range(len(read["indices"]))],
            "capped": kept.read(2)["indices"].tolist()}))
    '''), tmp_path, timeout=300)
    confusion = np.array(results["confusion"])
    assert confusion.sum() == 12  # 2 replicas x 2 steps x 3 weighted rows
    assert confusion[0, 1] == 3 and confusion[1, 2] == 1 and confusion[2, 3] == 1
    assert np.trace(confusion) == 7
    # Replica 0's first three (its fourth, 11, is over capacity; its padding
    # rows never count), then replica 1's one.
    assert results["indices"] == [0, 2, 10, 110]
    assert results["labels"] == [0, 2, 0, 0]
    assert results["predicted"] == [1, 3, 1, 1]
    assert results["pixels"] == pytest.approx([i / 1000.0 for i in results["indices"]])
    assert results["capped"] == [0, 2]
