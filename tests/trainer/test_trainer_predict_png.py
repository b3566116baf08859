"""predict's PNG check names an image's size as height x width, both ways round."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from trainer import predict
from trainer.errors import TrainerError


@pytest.mark.parametrize("height, width", [(27, 28), (28, 27), (28, 32)])
def test_a_wrong_size_names_height_then_width(tmp_path, height, width):
    path = tmp_path / "digit.png"
    path.write_bytes(tf.io.encode_png(np.zeros([height, width, 1], np.uint8)).numpy())
    with pytest.raises(TrainerError) as error:
        predict.read_png(str(path))
    assert str(error.value) == (f"{path}: image is {height}x{width} (height x width), "
                                "expected 28x28")


def test_a_28x28_png_is_read():
    image = np.arange(28 * 28, dtype=np.uint8).reshape(28, 28, 1)
    blob = tf.io.encode_png(image).numpy()
    path = "ram://predict_png/digit.png"
    with tf.io.gfile.GFile(path, "wb") as f:
        f.write(blob)
    np.testing.assert_array_equal(predict.read_png(path), image)
