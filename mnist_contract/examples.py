"""Encoding and decoding records, derived from `mnist_contract.spec.FEATURES`.

`encode_example` (the tests' fixtures), `decode_example` (the trainer's
checks) and `parse_spec` (the trainer's ``tf.io.parse_example``) all walk the
same feature list, so they cannot disagree about names, kinds or how the image
is stored. The Example's structure is read by `mnist_contract.wire`, which
``pipeline.verify`` uses without TensorFlow.
"""

from __future__ import annotations

from typing import Mapping

import numpy as np
import tensorflow as tf

from mnist_contract import wire
from mnist_contract.spec import FEATURES, IMAGE_FORMATS, IMAGE_HEIGHT, IMAGE_WIDTH
from mnist_contract.wire import encode_image  # noqa: F401 (one image encoder, no TF needed)


def decode_image(data: bytes, image_format: str) -> np.ndarray:
    """Inverse of `encode_image`: a (28, 28) uint8 array, PNG through TensorFlow
    (the trainer's extra has no Pillow)."""
    if image_format != "png":
        return wire.decode_image(data, image_format)
    image = tf.io.decode_png(data, channels=1).numpy()
    if image.shape != (IMAGE_HEIGHT, IMAGE_WIDTH, 1):
        raise ValueError(f"png image has shape {image.shape}, expected 28x28")
    return image[:, :, 0]


def encode_example(values: Mapping[str, object], image_format: str) -> bytes:
    """One serialized ``tf.train.Example`` holding every feature of the spec.

    ``values`` maps each feature name to its value: the image as a uint8
    array (encoded here per ``image_format``), the rest as integers.
    """
    if image_format not in IMAGE_FORMATS:
        raise ValueError(f"unknown image format {image_format!r}")
    feature = {}
    for f in FEATURES:
        value = values[f.name]
        if f.image:
            feature[f.name] = tf.train.Feature(bytes_list=tf.train.BytesList(
                value=[encode_image(value, image_format)]))
        elif f.kind == "bytes":
            feature[f.name] = tf.train.Feature(bytes_list=tf.train.BytesList(value=[value]))
        else:
            feature[f.name] = tf.train.Feature(int64_list=tf.train.Int64List(
                value=[int(value)]))
    return tf.train.Example(features=tf.train.Features(
        feature=feature)).SerializeToString(deterministic=True)


def decode_example(serialized: bytes, image_format: str) -> dict[str, object]:
    """`wire.decode_example`, with PNG images decoded by TensorFlow (`decode_image`)."""
    return wire.decode_example(serialized, image_format, decode_image)


def parse_spec() -> dict[str, tf.io.FixedLenFeature]:
    """The ``tf.io.parse_example`` spec: one scalar per feature, bytes or int64."""
    dtypes = {"bytes": tf.string, "int64": tf.int64}
    return {f.name: tf.io.FixedLenFeature([], dtypes[f.kind]) for f in FEATURES}
