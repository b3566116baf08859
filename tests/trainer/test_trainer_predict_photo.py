"""predict on a digit as a person makes one: drawn black on white, photographed
in colour at another size, on a transparent canvas. Each is made MNIST's form
(`trainer.digit_image`) and gets the class the model gives the original 28x28
digit; ``--raw`` keeps the exact 28x28 path.

The model is trained here on real digits; the pictures are rendered here
from real test digits it classifies confidently in their MNIST form.
"""

from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image

from tests import trainer_data
from tests.helpers import real_digits
from tests.trainer import trainer_runs
from trainer import predict, serving

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    """(model_dir, digits [20,28,28] uint8, labels): a small model trained
    on 2,000 real digits, and 20 other digits it classifies right, each with
    a probability over 0.9."""
    root = tmp_path_factory.mktemp("photo")
    images, labels = real_digits(5000)  # all of the sample, the classes mixed
    train = images[:2000], labels[:2000]
    test_images, test_labels = images[4000:4100], labels[4000:4100]
    data = str(root / "data")
    trainer_data.write_dataset(data, arrays={"train": train,
                                             "test": (test_images, test_labels)},
                               train_shards=2, test_shards=1)
    model_dir = str(root / "m")
    assert trainer_runs.run(data, model_dir, "--epochs=4", "--global_batch_size=32",
                            "--steps_per_execution=1", "--seed=1") == 0
    signature = serving.load_signature(model_dir)
    classes, probs = serving.predict(signature, test_images[..., None])
    sure = (classes == test_labels) & (probs > 0.9)
    assert sure.sum() >= 20, (classes, test_labels, probs)
    return model_dir, test_images[sure][:20], test_labels[sure][:20]


def _photo(digit: np.ndarray, seed: int) -> np.ndarray:
    """RGB uint8 [300,200,3]: the digit black on a grey-ish, noisy, uneven
    background, 5x MNIST's size, off the centre."""
    rng = np.random.default_rng(seed)
    ink = np.asarray(Image.fromarray(digit).resize((140, 140), Image.BILINEAR),
                     np.float32) / 255.0
    paper = np.linspace(190.0, 225.0, 200)[None, :] + np.zeros((300, 1))
    top, left = 40 + seed % 50, 15 + seed % 40
    paper[top:top + 140, left:left + 140] *= 1.0 - 0.8 * ink
    paper = paper + rng.normal(0.0, 10.0, paper.shape)
    tint = np.array([1.0, 0.97, 0.9])
    return np.clip(paper[..., None] * tint, 0, 255).astype(np.uint8)


def _write(tmp_path, name: str, pixels: np.ndarray, fmt: str) -> str:
    path = tmp_path / name
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format=fmt, quality=92)
    path.write_bytes(buffer.getvalue())
    return str(path)


def _classes(capsys, model_dir: str, *args: str) -> tuple[list[int], list[str]]:
    """predict's classes and its stderr lines."""
    assert predict.main([f"--model_dir={model_dir}", *args]) == 0
    captured = capsys.readouterr()
    return ([int(line.split()[1].split("=")[1]) for line in captured.out.splitlines()],
            captured.err.splitlines())


def test_a_photo_of_a_digit_gets_the_class_of_its_mnist_form(model, tmp_path, capsys):
    """docs/trainer.md, Predict: a 300x200 RGB JPEG and PNG of a digit drawn black on
    a noisy grey page, off the centre, get the class its 28x28 original gets."""
    model_dir, digits, labels = model
    paths = []
    for i, digit in enumerate(digits):
        photo = _photo(digit, seed=i)
        paths.append(_write(tmp_path, f"photo{i}.jpg", photo, "JPEG"))
        paths.append(_write(tmp_path, f"photo{i}.png", photo, "PNG"))
    classes, notes = _classes(capsys, model_dir, *paths)
    assert classes == list(np.repeat(labels, 2))
    assert len(notes) == len(paths)
    assert notes[0] == (f"note: {paths[0]}: 300x200 JPEG: grayscale, inverted (dark digit on "
                        "a light background), cropped to " + notes[0].split("cropped to ")[1])
    assert notes[0].endswith("and centred by mass in 28x28")


def test_a_28x28_digit_drawn_black_on_white_gets_its_class(model, tmp_path, capsys):
    """The 7 drawn black on white at 28x28, as people draw: inverted, not read as is."""
    model_dir, digits, labels = model
    paths = [_write(tmp_path, f"drawn{i}.png", 255 - digit, "PNG")
             for i, digit in enumerate(digits)]
    classes, notes = _classes(capsys, model_dir, *paths)
    assert classes == list(labels)
    assert all("inverted (dark digit on a light background)" in note for note in notes)


def test_a_digit_on_a_transparent_canvas_and_a_large_white_on_black_one(model, tmp_path,
                                                                         capsys):
    """An RGBA drawing (black strokes, transparent elsewhere) and a 280x280 white-on-black
    grayscale picture: both made MNIST's form."""
    model_dir, digits, labels = model
    paths = []
    for i, digit in enumerate(digits[:10]):
        rgba = np.zeros((28, 28, 4), np.uint8)
        rgba[..., 3] = digit  # black ink, its opacity the digit's intensity
        paths.append(_write(tmp_path, f"canvas{i}.png", rgba, "PNG"))
        big = np.asarray(Image.fromarray(digit).resize((280, 280), Image.BILINEAR))
        paths.append(_write(tmp_path, f"big{i}.png", big, "PNG"))
    classes, notes = _classes(capsys, model_dir, *paths)
    assert classes == list(np.repeat(labels[:10], 2))
    assert "background made black" in notes[1]


def test_an_mnist_digit_is_taken_as_it_is_and_raw_keeps_the_exact_path(model, tmp_path,
                                                                       capsys):
    """A 28x28 grayscale digit on black: no note, the class `--raw` gives; `--raw`
    still refuses a picture of another size or mode, as before."""
    model_dir, digits, labels = model
    path = _write(tmp_path, "mnist.png", digits[0], "PNG")
    assert _classes(capsys, model_dir, path) == ([labels[0]], [])
    assert _classes(capsys, model_dir, "--raw", path) == ([labels[0]], [])
    photo = _write(tmp_path, "photo.png", _photo(digits[0], seed=0), "PNG")
    assert predict.main([f"--model_dir={model_dir}", "--raw", photo]) == 2
    assert capsys.readouterr().err == (f"error: {photo}: image is 300x200 (height x width), "
                                       "expected 28x28\n")


def test_a_blank_picture_is_one_line(model, tmp_path, capsys):
    model_dir = model[0]
    path = _write(tmp_path, "blank.jpg", np.full((50, 80, 3), 240, np.uint8), "JPEG")
    assert predict.main([f"--model_dir={model_dir}", path]) == 2
    assert capsys.readouterr().err == (f"error: {path}: no digit found: nothing stands out "
                                       "from the background\n")


def test_a_picture_over_the_pixel_limit_is_refused_undecoded(model, tmp_path, capsys,
                                                            monkeypatch):
    """9000x9000 (81 megapixels) is refused from the PNG's header."""
    header = (b"\x89PNG\r\n\x1a\n" + (13).to_bytes(4, "big") + b"IHDR"
              + (9000).to_bytes(4, "big") + (9000).to_bytes(4, "big")
              + b"\x08\x02\x00\x00\x00")
    path = tmp_path / "huge.png"
    path.write_bytes(header + b"\x00" * 64)
    monkeypatch.setattr(serving.tf.io, "decode_image",
                        lambda *a, **k: pytest.fail("the PNG was decoded"))
    assert predict.main([f"--model_dir={model[0]}", str(path)]) == 2
    assert capsys.readouterr().err == (f"error: {path}: image is 9000x9000 (height x width), "
                                       "over 40 megapixels; scale it down first\n")
