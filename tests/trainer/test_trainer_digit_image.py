"""`trainer.digit_image`: a picture of a digit, drawn either way round and at any
size, made MNIST's form; numpy only, tested without TensorFlow on real digits."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
from PIL import Image

from tests.helpers import REPO, real_digits
from trainer import digit_image


@pytest.fixture(scope="module")
def digits() -> np.ndarray:
    images, _ = real_digits(5000)  # all of the sample, the classes mixed
    return images[:40]


def _correlation(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.corrcoef(a.astype(float).ravel(), b.astype(float).ravel())[0, 1])


def _full_range(digit: np.ndarray) -> np.ndarray:
    return np.round(digit * (255.0 / digit.max()))


def _scaled(digit: np.ndarray, height: int, width: int) -> np.ndarray:
    return np.asarray(Image.fromarray(digit).resize((width, height), Image.BILINEAR),
                      np.float32) / 255.0


def test_an_mnist_digit_drawn_black_on_white_comes_back_exactly(digits):
    """Inverting a 28x28 MNIST digit and preparing it gives the digit back (its
    brightest pixel made 255), each pixel within 1: the crop, the 20x20 fit
    and the centring by mass are MNIST's own."""
    for digit in digits:
        prepared = digit_image.to_mnist(255 - digit)
        np.testing.assert_allclose(prepared.image[..., 0], _full_range(digit), rtol=0, atol=1)
        assert prepared.note.startswith("inverted (dark digit on a light background), "
                                        "cropped to ")


def test_a_noisy_colour_photo_off_the_centre_comes_close_to_the_digit(digits):
    """300x200 RGB, the digit black and 5x MNIST's size, on grey paper lit
    unevenly, with noise, off the centre: within a correlation of 0.6 of the
    original digit each, 0.9 on average."""
    rng = np.random.default_rng(0)
    scores = []
    for i, digit in enumerate(digits):
        paper = np.linspace(185.0, 230.0, 300)[:, None] + np.zeros((1, 200))
        top, left = 20 + 7 * i % 120, 5 + 11 * i % 50
        paper[top:top + 140, left:left + 140] *= 1.0 - 0.8 * _scaled(digit, 140, 140)
        paper += rng.normal(0.0, 10.0, paper.shape)
        photo = np.clip(paper[..., None] * [1.0, 0.96, 0.88], 0, 255).astype(np.uint8)
        prepared = digit_image.to_mnist(photo)
        assert prepared.image.shape == (28, 28, 1) and prepared.image.dtype == np.uint8
        assert prepared.note.startswith("grayscale, inverted")
        scores.append(_correlation(prepared.image[..., 0], digit))
    assert min(scores) > 0.6 and np.mean(scores) > 0.9, scores


@pytest.mark.parametrize("height, width", [(200, 80), (60, 300), (14, 14), (1000, 700)])
def test_any_size_fits_the_20x20_box_centred_by_mass(digits, height, width):
    """White on black at other sizes and aspect ratios: the longer side is 20
    pixels, the centre of mass within a pixel of MNIST's (14, 14)."""
    canvas = np.zeros((height + 40, width + 60), np.float32)
    canvas[10:10 + height, 50:50 + width] = _scaled(digits[3], height, width)
    prepared = digit_image.to_mnist((canvas * 255).astype(np.uint8))
    image = prepared.image[..., 0].astype(float)
    rows, cols = np.nonzero(image.sum(axis=1))[0], np.nonzero(image.sum(axis=0))[0]
    assert max(rows[-1] - rows[0], cols[-1] - cols[0]) + 1 in (20, 21)
    centre = [(image.sum(axis=a) * np.arange(28)).sum() / image.sum() for a in (1, 0)]
    assert np.abs(np.array(centre) - 14).max() <= 1.0, centre
    assert prepared.note.startswith("background made black, cropped to ")


def test_a_transparent_canvas_is_laid_on_white(digits):
    """RGBA: black strokes whose opacity is the digit, transparent elsewhere."""
    rgba = np.zeros((28, 28, 4), np.uint8)
    rgba[..., 3] = digits[5]
    np.testing.assert_allclose(digit_image.to_mnist(rgba).image[..., 0],
                               _full_range(digits[5]), rtol=0, atol=1)


def test_a_speck_far_from_the_digit_does_not_stretch_the_box(digits):
    canvas = np.full((200, 200), 255, np.uint8)
    canvas[40:180, 30:170] = 255 - (_scaled(digits[7], 140, 140) * 255).astype(np.uint8)
    canvas[2, 197] = 0
    prepared = digit_image.to_mnist(canvas)
    assert _correlation(prepared.image[..., 0], digits[7]) > 0.9


@pytest.mark.parametrize("level", [0, 128, 255])
def test_a_blank_picture_has_no_digit(level):
    noisy = np.random.default_rng(1).normal(level, 4.0, (60, 80)).clip(0, 255)
    with pytest.raises(digit_image.NoDigit, match="no digit found"):
        digit_image.to_mnist(noisy.astype(np.uint8))


def test_mnist_form_is_28x28_grayscale_on_a_dark_background(digits):
    assert digit_image.is_mnist_form(digits[0])
    assert digit_image.is_mnist_form(digits[0][..., None])
    assert not digit_image.is_mnist_form(255 - digits[0])
    assert not digit_image.is_mnist_form(np.stack([digits[0]] * 3, axis=-1))
    assert not digit_image.is_mnist_form(np.zeros((28, 29), np.uint8))


def test_the_module_imports_no_tensorflow():
    code = ("import sys, trainer.digit_image; "
            "sys.exit('tensorflow' in sys.modules)")
    assert subprocess.run([sys.executable, "-c", code], cwd=REPO, timeout=120).returncode == 0
