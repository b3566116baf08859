"""predict's PNG check names an image's size as height x width, both ways round."""

from __future__ import annotations

import zlib

import numpy as np
import pytest
import tensorflow as tf

from trainer import serving
from trainer.errors import TrainerError


@pytest.mark.parametrize("height, width", [(27, 28), (28, 27), (28, 32)])
def test_a_wrong_size_names_height_then_width(tmp_path, height, width):
    path = tmp_path / "digit.png"
    path.write_bytes(tf.io.encode_png(np.zeros([height, width, 1], np.uint8)).numpy())
    with pytest.raises(TrainerError) as error:
        serving.read_png(str(path))
    assert str(error.value) == (f"{path}: image is {height}x{width} (height x width), "
                                "expected 28x28")


def test_a_28x28_png_is_read():
    image = np.arange(28 * 28, dtype=np.uint8).reshape(28, 28, 1)
    blob = tf.io.encode_png(image).numpy()
    path = "ram://predict_png/digit.png"
    with tf.io.gfile.GFile(path, "wb") as f:
        f.write(blob)
    np.testing.assert_array_equal(serving.read_png(path), image)


def _png(pixels: np.ndarray) -> bytes:
    return tf.io.encode_png(pixels).numpy()


@pytest.mark.parametrize("pixels, mode", [
    (np.zeros([28, 28, 4], np.uint8), "RGBA, 8 bits per sample"),
    (np.zeros([28, 28, 3], np.uint8), "RGB, 8 bits per sample"),
    (np.zeros([28, 28, 2], np.uint8), "grayscale+alpha, 8 bits per sample"),
    (np.zeros([28, 28, 1], np.uint16), "grayscale, 16 bits per sample"),
    (np.zeros([28, 28, 4], np.uint16), "RGBA, 16 bits per sample"),
], ids=["rgba", "rgb", "gray-alpha", "gray16", "rgba16"])
def test_a_png_that_is_not_8_bit_grayscale_is_refused_naming_its_mode(tmp_path, pixels, mode):
    """docs/trainer.md, Predict: grayscale PNGs; no mode is converted."""
    path = tmp_path / "digit.png"
    path.write_bytes(_png(pixels))
    with pytest.raises(TrainerError) as error:
        serving.read_png(str(path))
    assert str(error.value) == f"{path}: PNG mode {mode}; expected grayscale of at most 8 bits"
    assert error.value.exit_status == 2


def _chunk(kind: bytes, data: bytes) -> bytes:
    return (len(data).to_bytes(4, "big") + kind + data
            + zlib.crc32(kind + data).to_bytes(4, "big"))


def _raw_png(rows: list[bytes], depth: int, colour: int, extra: bytes = b"") -> bytes:
    """A 28x28 PNG of packed ``rows`` (each without its filter byte), as any
    encoder writes it; TensorFlow's encoder makes no palette or 1-bit ones."""
    header = (28).to_bytes(4, "big") * 2 + bytes([depth, colour, 0, 0, 0])
    data = zlib.compress(b"".join(b"\0" + row for row in rows))
    return (b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", header) + extra
            + _chunk(b"IDAT", data) + _chunk(b"IEND", b""))


def test_a_palette_png_is_refused(tmp_path):
    path = tmp_path / "digit.png"
    path.write_bytes(_raw_png([bytes(28)] * 28, 8, 3, _chunk(b"PLTE", bytes(3))))
    with pytest.raises(TrainerError, match=r"digit.png: PNG mode palette, 8 bits per sample"):
        serving.read_png(str(path))


def test_a_1_bit_grayscale_png_reads_as_0_and_255(tmp_path):
    bits = np.arange(28 * 28).reshape(28, 28) % 3 == 0
    path = tmp_path / "digit.png"
    path.write_bytes(_raw_png([np.packbits(row).tobytes() for row in bits], 1, 0))
    np.testing.assert_array_equal(serving.read_png(str(path))[..., 0], bits * np.uint8(255))
