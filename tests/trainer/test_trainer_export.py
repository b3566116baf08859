"""The servable export, the predict CLI, the augmentation layer and the schedules.

Unit level, tiny models: the export loads with plain ``tf_keras.models.load_model``
(no custom objects), its signature takes raw uint8 pixels in both shapes and
agrees with the trained model on the pipeline's float input; augmentation is
a no-op at inference and a real warp while training; the learning-rate
schedules have their stated values. The real-digit check (export accuracy ==
the trainer's reported accuracy) is in tests/contract/test_roundtrip.py.
"""

from __future__ import annotations

import math
import uuid

import numpy as np
import pytest
import tensorflow as tf
import tf_keras as keras

import mnist_contract as contract
from tests import trainer_data
from tests.helpers import real_digits
from trainer import predict, serving
from trainer.config import TrainConfig
from trainer.errors import TrainerError
from trainer.model import export, layers, models as model_lib, optimizer as optimizer_lib
from trainer.run import outputs, plan as plan_lib


def _briefly_trained(examples: int, seed: int, **flags):
    """A model built and compiled as the trainer does from ``flags``, trained
    one epoch in batches of 8 on ``examples`` real digits; the model and the
    digits ([N,28,28,1] uint8) with their labels."""
    images, labels = real_digits(examples)
    images = images[..., None]
    keras.utils.set_random_seed(seed)
    config = TrainConfig(data="unused", model_dir="unused", steps_per_execution=1,
                         epochs=1, **flags)
    plan = plan_lib.Plan.of(config, 1, examples // 8)
    model, _ = model_lib.build(plan_lib.settings_of(plan_lib.ModelSpec, config),
                               tf.distribute.get_strategy(), plan.total_steps,
                               warmup_steps=plan.warmup_steps,
                               ghost_batch_size=plan.ghost_batch_size)
    model.fit(images.astype(np.float32) / 255.0, labels, batch_size=8, epochs=1, verbose=0)
    return model, images, labels


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """An augmented convnet, built and compiled as the trainer does, briefly
    trained on real digits, and its export."""
    model, images, labels = _briefly_trained(64, seed=0, model="convnet", augment=True,
                                             lr_schedule="cosine", warmup_steps=2)
    model_dir = tmp_path_factory.mktemp("export")
    staged = outputs.staging_dir(str(model_dir), "fixture")
    export.export_model(model, staged)  # committed as the trainer does: predict checks it
    outputs.commit_export(str(model_dir), staged, {"export_id": "fixture-step8"})
    return model, str(model_dir), images, labels


def test_export_loads_without_custom_objects(exported):
    model, model_dir, images, labels = exported
    loaded = keras.models.load_model(f"{model_dir}/export")  # compile=True, no custom_objects
    kinds = [type(l).__name__ for l in loaded.layers]
    assert "RandomAffine" not in kinds and kinds[:2] == ["InputLayer", "Normalization"]
    assert loaded.inputs[0].dtype == tf.uint8
    loss, accuracy = loaded.evaluate(images, labels, verbose=0)  # compiled, standard metrics
    logits = model.predict(images.astype(np.float32) / 255.0, verbose=0)
    assert accuracy == pytest.approx(float((logits.argmax(-1) == labels).mean()))


def test_a_ghost_batch_norm_model_exports_as_plain_batch_norm(tmp_path):
    """tf-keras cannot load a SavedModel of its ghost batch-norm layers; the
    export holds plain ones with the same values, which answer the same."""
    model, images, labels = _briefly_trained(32, seed=1, model="convnet_bn",
                                             bn_virtual_batch_size=4)
    assert {l.virtual_batch_size for l in model.layers
            if isinstance(l, keras.layers.BatchNormalization)} == {4}
    export.export_model(model, str(tmp_path / "export"))
    loaded = keras.models.load_model(str(tmp_path / "export"))
    bn = [l for l in loaded.layers if isinstance(l, keras.layers.BatchNormalization)]
    assert len(bn) == 4 and {l.virtual_batch_size for l in bn} == {None}
    expected = model.predict(images.astype(np.float32) / 255.0, verbose=0)
    np.testing.assert_allclose(loaded.predict(images, verbose=0), expected, atol=1e-5)
    served = loaded.signatures["serving_default"](images=tf.constant(images[:1, ..., 0]))
    assert served["class"].numpy().tolist() == [expected[0].argmax()]


def test_signature_takes_raw_pixels_in_both_shapes(exported):
    model, model_dir, images, labels = exported
    serve = tf.saved_model.load(f"{model_dir}/export").signatures["serving_default"]
    assert set(serve.structured_outputs) == {"probabilities", "class"}
    # The trained model on what the input pipeline feeds it (float32, /255).
    expected = model(tf.cast(images, tf.float32) / 255.0, training=False).numpy()
    for batch in (images, images[..., 0]):  # [N,28,28,1] and [N,28,28]
        out = serve(images=tf.constant(batch))
        assert out["class"].dtype == tf.int64
        np.testing.assert_array_equal(out["class"].numpy(), expected.argmax(-1))
        np.testing.assert_allclose(out["probabilities"].numpy(),
                                   tf.nn.softmax(expected).numpy(), atol=1e-6)
    for bad in (np.zeros([2, 28, 28, 3], np.uint8), np.zeros([2, 784], np.uint8),
                np.zeros([2, 14, 56], np.uint8)):
        with pytest.raises(tf.errors.InvalidArgumentError, match="images must be uint8"):
            serve(images=tf.constant(bad))


def test_served_normalization_is_the_pipelines_bit_for_bit(exported):
    """The export divides by 255 exactly as trainer.data.input_pipeline does (not * 1/255)."""
    model, _, _, _ = exported
    served = export.inference_model(model)
    pixels = np.arange(256, dtype=np.uint8).reshape(1, 16, 16, 1)
    scaled = served.get_layer("pixels_to_unit")(tf.constant(pixels)).numpy()
    np.testing.assert_array_equal(scaled, tf.cast(pixels, tf.float32).numpy() / np.float32(255))


def test_augmentation_is_inert_at_inference_and_warps_in_training():
    images, _ = real_digits(8)
    x = tf.constant(images[..., None].astype(np.float32) / 255.0)
    layer = layers.RandomAffine(seed=1)
    np.testing.assert_array_equal(layer(x, training=False).numpy(), x.numpy())
    warped = layer(x, training=True).numpy()
    assert warped.shape == x.shape
    changed = np.abs(warped - x.numpy()).reshape(8, -1).max(axis=1)
    assert (changed > 0.1).all()  # every image moved
    assert not np.array_equal(warped[0] - x.numpy()[0], warped[1] - x.numpy()[1])
    # The ink stays, roughly: small warps neither erase nor smear the digit.
    ratio = warped.sum(axis=(1, 2, 3)) / x.numpy().sum(axis=(1, 2, 3))
    assert ((ratio > 0.7) & (ratio < 1.4)).all(), ratio


def test_affine_warp_geometry():
    rng = np.random.default_rng(0)
    x = tf.constant(rng.random((2, 28, 28, 1)), tf.float32)
    zeros, ones = tf.zeros([2]), tf.ones([2])
    same = layers.affine_warp(x, zeros, ones, tf.zeros([2, 2])).numpy()
    np.testing.assert_array_equal(same, x.numpy())
    # Shift by (1, -2) pixels: content moves down 1, left 2; zeros come in.
    shifted = layers.affine_warp(x, zeros, ones, tf.constant([[1.0, -2.0]] * 2)).numpy()
    expected = np.zeros_like(x.numpy())
    expected[:, 1:, :-2] = x.numpy()[:, :-1, 2:]
    np.testing.assert_allclose(shifted, expected, atol=1e-6)
    # A quarter turn: clockwise as displayed (rows grow downwards).
    turned = layers.affine_warp(x, tf.fill([2], math.pi / 2), ones,
                                 tf.zeros([2, 2])).numpy()
    np.testing.assert_allclose(turned, np.rot90(x.numpy(), -1, axes=(1, 2)), atol=1e-5)


@pytest.mark.tf221  # the TPU build of TensorFlow has no XLA CPU backend
@pytest.mark.parametrize("name", ["small", "convnet_bn"])
def test_augmented_model_compiles_with_xla(name):
    """jit_compile keeps working with augmentation (and batch normalization)
    in the model (the TPU path)."""
    images, labels = real_digits(32)
    model = model_lib.build_model(name, augment=True)
    model.compile(optimizer=optimizer_lib.make_optimizer(1e-3, "cosine", 8, 2),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  steps_per_execution=2, jit_compile=True)
    history = model.fit(images[..., None].astype(np.float32) / 255.0, labels,
                        batch_size=8, epochs=2, verbose=0)
    assert np.isfinite(history.history["loss"]).all()
    assert int(model.optimizer.iterations.numpy()) == 8


def test_learning_rate_schedules():
    def lrs(schedule, warmup, total=100):
        lr = optimizer_lib.learning_rate_schedule(0.01, schedule, total, warmup)
        return [float(lr(s)) if callable(lr) else float(lr) for s in (0, 5, 10, 55, 100)]

    cosine = lrs("cosine", 10)
    assert cosine[0] == 0 and cosine[1] == pytest.approx(0.005)
    assert cosine[2] == pytest.approx(0.01) and cosine[3] == pytest.approx(0.005)
    assert cosine[4] == pytest.approx(0, abs=1e-9)
    assert lrs("cosine", 0)[0] == pytest.approx(0.01)
    assert lrs("constant", 10)[1:] == pytest.approx([0.005, 0.01, 0.01, 0.01])
    assert lrs("constant", 0) == pytest.approx([0.01] * 5)
    with pytest.raises(TrainerError, match="lr_schedule"):
        optimizer_lib.make_optimizer(0.01, "step", 100, 0)
    assert isinstance(optimizer_lib.make_optimizer(0.01, "cosine", 100, 10).learning_rate,
                      tf.Variable)  # Adam evaluates the schedule at its step


def test_models_and_their_inputs():
    convnet = model_lib.build_model("convnet", augment=True)
    assert type(convnet.layers[0]).__name__ == "RandomAffine"
    kinds = [type(l).__name__ for l in convnet.layers]
    assert kinds.count("MaxPooling2D") == 2 and kinds.count("StepDropout") == 2
    assert "RandomAffine" not in [type(l).__name__
                                  for l in model_lib.build_model("convnet").layers]
    assert convnet(tf.zeros([2, 28, 28, 1])).shape == (2, 10)
    bn = model_lib.build_model("convnet_bn")
    kinds = [type(l).__name__ for l in bn.layers]
    assert kinds.count("BatchNormalization") == 4 and kinds.count("StepDropout") == 2
    assert bn(tf.zeros([2, 28, 28, 1])).shape == (2, 10)


def test_predict_pngs_and_errors(exported, tmp_path, capsys):
    model, model_dir, images, labels = exported
    paths = []
    for i in range(3):
        path = tmp_path / f"digit{i}.png"
        path.write_bytes(tf.io.encode_png(images[i]).numpy())
        paths.append(str(path))
    assert predict.main([f"--model_dir={model_dir}", *paths]) == 0
    lines = capsys.readouterr().out.splitlines()
    expected = model.predict(images[:3].astype(np.float32) / 255.0, verbose=0).argmax(-1)
    assert [l.split()[0] for l in lines] == paths
    assert [int(l.split()[1].split("=")[1]) for l in lines] == list(expected)

    (tmp_path / "big.png").write_bytes(tf.io.encode_png(np.zeros([32, 28, 1], np.uint8)).numpy())
    (tmp_path / "text.png").write_text("not an image")
    (tmp_path / "rgba.png").write_bytes(tf.io.encode_png(np.zeros([28, 28, 4], np.uint8)).numpy())
    for args, message in [  # --raw: the exact 28x28 path, which refuses other sizes and modes
        (["--raw", paths[0], str(tmp_path / "rgba.png")],
         f"error: {tmp_path}/rgba.png: PNG mode RGBA, 8 bits per sample; expected grayscale "
         "of at most 8 bits"),
        (["--raw", str(tmp_path / "big.png")],
         f"error: {tmp_path}/big.png: image is 32x28 (height x width), expected 28x28"),
        (["--raw", str(tmp_path / "text.png")], f"error: {tmp_path}/text.png: not a PNG file"),
        ([str(tmp_path / "text.png")], f"error: {tmp_path}/text.png: not a PNG or JPEG file"),
        ([str(tmp_path / "missing.png")], f"error: {tmp_path}/missing.png: cannot read"),
    ]:
        assert predict.main([f"--model_dir={model_dir}", *args]) == 2  # bad input
        captured = capsys.readouterr()
        assert captured.out == "" and captured.err.startswith(message), captured.err
    assert predict.main([f"--model_dir={tmp_path}", paths[0]]) == 2
    assert capsys.readouterr().err.startswith(f"error: {tmp_path}/export: no SavedModel")
    assert predict.main([f"--model_dir={model_dir}", f"--data={tmp_path}"]) == 2
    assert capsys.readouterr().err.startswith(
        f"error: {tmp_path}/manifest.json: no manifest.json (not a complete pipeline output")


def test_predict_reads_a_split_through_gfile(exported, capsys):
    """--data on TF's ram:// filesystem (as gs://): every example once, in file order."""
    model, model_dir, _, _ = exported
    images, labels = real_digits(23, offset=5)
    out = f"ram://predict-{uuid.uuid4().hex}"
    trainer_data.write_dataset(out, arrays={"train": (images, labels),
                                            "test": (images, labels)},
                               train_shards=1, test_shards=3)
    assert predict.main([f"--model_dir={model_dir}", f"--data={out}", "--split=test"]) == 0
    lines = capsys.readouterr().out.splitlines()
    expected = model.predict(images[..., None].astype(np.float32) / 255.0,
                             verbose=0).argmax(-1)
    rows = [dict(kv.split("=") for kv in line.split()) for line in lines[:-1]]
    assert sorted(int(r["index"]) for r in rows) == list(range(23))
    for r in rows:
        i = int(r["index"])
        assert int(r["label"]) == labels[i] and int(r["class"]) == expected[i]
    correct = int((expected == labels).sum())
    assert lines[-1] == f"accuracy={correct / 23:.4f} ({correct}/23) on split test"
    assert predict.main([f"--model_dir={model_dir}", f"--data={out}", "--split=valid"]) == 2
    assert capsys.readouterr().err.startswith(f"error: {out}/manifest.json: ")
    journal = f"{out}/{contract.PUBLISH_JOURNAL_FILE}"
    with tf.io.gfile.GFile(journal, "w") as f:
        f.write("{}")
    assert predict.main([f"--model_dir={model_dir}", f"--data={out}"]) == 2
    assert capsys.readouterr().err.startswith(f"error: {journal}: interrupted publish")


def test_predict_refuses_an_export_the_trainer_did_not_commit(exported, tmp_path, capsys):
    """An export without its trainer_export.json names no run: refused, exit 2."""
    import shutil
    _, model_dir, images, _ = exported
    copy = str(tmp_path / "m")
    shutil.copytree(model_dir, copy)
    tf.io.gfile.remove(f"{copy}/export/{outputs.EXPORT_ID_FILE}")
    png = tmp_path / "digit.png"
    png.write_bytes(tf.io.encode_png(images[0]).numpy())
    capsys.readouterr()
    assert predict.main([f"--model_dir={copy}", str(png)]) == 2
    assert capsys.readouterr().err == (
        f"error: {copy}/export: not committed (no readable {outputs.EXPORT_ID_FILE} in "
        f"it: not an export the trainer committed); run the trainer with "
        f"--model_dir={copy} again to finish it\n")


def test_predict_reads_a_pngs_size_before_decoding_it(tmp_path, monkeypatch):
    """A 20000x20000 PNG is refused from its header, never decoded."""
    header = (b"\x89PNG\r\n\x1a\n" + (13).to_bytes(4, "big") + b"IHDR"
              + (20000).to_bytes(4, "big") + (20000).to_bytes(4, "big") + b"\x08\x00\x00\x00\x00")
    path = tmp_path / "huge.png"
    path.write_bytes(header + b"\x00" * 64)

    def no_decoding(*args, **kwargs):
        raise AssertionError("the PNG was decoded")
    monkeypatch.setattr(tf.io, "decode_png", no_decoding)
    with pytest.raises(TrainerError) as error:
        serving.read_png(str(path))
    assert str(error.value) == (f"{path}: image is 20000x20000 (height x width), "
                                "expected 28x28")


def test_predict_takes_no_abbreviated_flags(capsys):
    """--dat is not --data: a usage error (2), as every unknown flag."""
    with pytest.raises(SystemExit) as exit_info:
        predict.main(["--model_dir=m", "--dat=d"])
    assert exit_info.value.code == 2
    assert capsys.readouterr().err.splitlines() == [
        "error: unrecognized arguments: --dat=d; did you mean --data, not --dat? (see --help)"]


def test_the_optimizer_warms_up_over_the_configs_warmup_in_steps(monkeypatch):
    """`models.build` hands the optimizer the run's warmup (``--warmup_epochs``
    as steps of this run: `trainer.run.plan.warmup_steps`), ``--optimizer``
    and ``--weight_decay``."""
    seen = []

    def spy(learning_rate, schedule, total_steps, warmup_steps, name, weight_decay):
        seen.append((total_steps, warmup_steps, name, weight_decay))
        return optimizer_lib.make_optimizer(learning_rate, schedule, total_steps,
                                            warmup_steps, name, weight_decay)
    monkeypatch.setattr(model_lib, "make_optimizer", spy)
    strategy = tf.distribute.get_strategy()
    built = [model_lib.build(plan_lib.settings_of(plan_lib.ModelSpec, config), strategy, 40,
                             warmup_steps=plan_lib.warmup_steps(config, 40))[1]
             for config in (
        TrainConfig(data="d", model_dir="m", epochs=4, warmup_epochs=1.5),
        TrainConfig(data="d", model_dir="m", warmup_steps=3, optimizer="lamb"),
        TrainConfig(data="d", model_dir="m", weight_decay=0.1))]
    assert seen == [(40, 15, "adam", 0.0), (40, 3, "lamb", 0.0), (40, 0, "adam", 0.1)]
    assert [type(o).__name__ for o in built] == ["Adam", "Lamb", "AdamW"]
