"""Encoding and decoding records, derived from `mnist_contract.spec.FEATURES`.

`encode_example` (the pipeline's writer and the tests' fixtures),
`decode_example` (``pipeline.verify``) and `parse_spec` (the trainer's
``tf.io.parse_example``) all walk the same feature list, so they cannot
disagree about names, kinds or how the image is stored.
"""

from __future__ import annotations

from typing import Mapping

import numpy as np
import tensorflow as tf

from mnist_contract.spec import (FEATURES, IMAGE_BYTES, IMAGE_FORMATS, IMAGE_HEIGHT,
                                 IMAGE_WIDTH)
from mnist_contract.wire import encode_image  # noqa: F401 (one image encoder, no TF needed)


def decode_image(data: bytes, image_format: str) -> np.ndarray:
    """Inverse of `encode_image`: a (28, 28) uint8 array."""
    if image_format == "raw":
        if len(data) != IMAGE_BYTES:
            raise ValueError(f"raw image has {len(data)} bytes, expected {IMAGE_BYTES}")
        return np.frombuffer(data, dtype=np.uint8).reshape(IMAGE_HEIGHT, IMAGE_WIDTH)
    if image_format == "png":
        image = tf.io.decode_png(data, channels=1).numpy()
        if image.shape != (IMAGE_HEIGHT, IMAGE_WIDTH, 1):
            raise ValueError(f"png image has shape {image.shape}, expected 28x28")
        return image[:, :, 0]
    raise ValueError(f"unknown image format {image_format!r}")


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
    """Inverse of `encode_example`: feature name -> value (image (28, 28) uint8).

    Raises ValueError for a record that lacks a feature, holds the wrong kind
    or count of values, or has a label outside its classes.
    """
    example = tf.train.Example.FromString(serialized)
    feature = example.features.feature
    out: dict[str, object] = {}
    for f in FEATURES:
        if f.name not in feature:
            raise ValueError(f"example lacks feature {f.name!r}")
        values = (feature[f.name].bytes_list.value if f.kind == "bytes"
                  else feature[f.name].int64_list.value)
        if len(values) != 1:
            raise ValueError(f"feature {f.name!r} holds {len(values)} {f.kind} "
                             "values, expected 1")
        value = values[0]
        if f.image:
            value = decode_image(value, image_format)
        elif f.kind == "int64":
            value = int(value)
        if f.num_classes is not None and not 0 <= value < f.num_classes:
            raise ValueError(f"{f.name} {value} outside 0..{f.num_classes - 1}")
        out[f.name] = value
    return out


def parse_spec() -> dict[str, tf.io.FixedLenFeature]:
    """The ``tf.io.parse_example`` spec: one scalar per feature, bytes or int64."""
    dtypes = {"bytes": tf.string, "int64": tf.int64}
    return {f.name: tf.io.FixedLenFeature([], dtypes[f.kind]) for f in FEATURES}
