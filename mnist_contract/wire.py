"""Serialized ``tf.train.Example`` bytes built straight from the protobuf wire format.

`examples.encode_example` builds a proto object per record, which costs tens
of microseconds each; converting 700,000 records spent most of its time
there. The Examples this contract writes are always the same shape -- one
value per feature of `spec.FEATURES` -- so their deterministic serialization
is a fixed layout:

    Example   { 1: Features }
    Features  { 1: map entry per feature, in key order (deterministic) }
    entry     { 1: name, 2: Feature }
    Feature   { 1: BytesList { 1: bytes } | 3: Int64List { 1: packed varint } }

Every length-delimited field is ``tag | varint length | payload``. Parts that
depend only on a length or a small value are cached, so a record costs a few
concatenations. The contract tests check the result byte for byte against
``tf.train.Example.SerializeToString(deterministic=True)``. Standard library
and numpy only (PNG images need Pillow), so the conversion job runs without
importing TensorFlow.
"""

from __future__ import annotations

import io
from typing import Sequence

import numpy as np

from mnist_contract.spec import FEATURES, IMAGE_BYTES, IMAGE_FORMATS, IMAGE_HEIGHT, IMAGE_WIDTH

_UINT64 = (1 << 64) - 1


def varint(value: int) -> bytes:
    """Protobuf base-128 varint; negative int64 values take 10 bytes, as in protobuf."""
    value &= _UINT64
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _field(tag: bytes, payload: bytes) -> bytes:
    return tag + varint(len(payload)) + payload


def _entry_head(name: str, feature_len: int) -> bytes:
    """A map entry up to its Feature's payload: entry tag, length, key, value tag, length."""
    key = _field(b"\x0a", name.encode())
    body_len = len(key) + 1 + len(varint(feature_len)) + feature_len
    return b"\x0a" + varint(body_len) + key + b"\x12" + varint(feature_len)


def bytes_entry(name: str, value: bytes) -> bytes:
    """The Features map entry of a bytes feature holding ``value``."""
    feature = _field(b"\x0a", _field(b"\x0a", value))  # Feature.bytes_list{value}
    return _entry_head(name, len(feature)) + feature


def int64_entry(name: str, value: int) -> bytes:
    """The Features map entry of an int64 feature holding ``value``."""
    feature = _field(b"\x1a", _field(b"\x0a", varint(value)))  # Feature.int64_list{packed}
    return _entry_head(name, len(feature)) + feature


class _BytesEntries:
    """bytes_entry(name, value) with its head cached per value length."""

    def __init__(self, name: str):
        self._name = name
        self._heads: dict[int, bytes] = {}

    def __call__(self, value: bytes) -> bytes:
        head = self._heads.get(len(value))
        if head is None:
            entry = bytes_entry(self._name, value)
            head = self._heads[len(value)] = entry[:len(entry) - len(value)]
        return head + value


def varints(values: np.ndarray) -> list[bytes]:
    """`varint` of each int64 value, computed for the whole array at once."""
    v = np.asarray(values, dtype=np.int64).astype(np.uint64)
    shifts = np.arange(10, dtype=np.uint64) * np.uint64(7)
    groups = ((v[:, None] >> shifts) & np.uint64(0x7F)).astype(np.uint8)
    lengths = 1 + ((v[:, None] >> shifts[1:]) != 0).sum(axis=1)
    groups[np.arange(10) < (lengths - 1)[:, None]] |= 0x80
    data = groups.tobytes()
    return [data[i * 10:i * 10 + n] for i, n in enumerate(lengths.tolist())]


def _int64_entries(name: str, values: np.ndarray) -> list[bytes]:
    """int64_entry(name, v) of each value, the head cached per varint length."""
    heads: dict[int, bytes] = {}
    out = []
    for value, packed in zip(values.tolist(), varints(values)):
        head = heads.get(len(packed))
        if head is None:
            entry = int64_entry(name, value)
            head = heads[len(packed)] = entry[:len(entry) - len(packed)]
        out.append(head + packed)
    return out


def encode_image(image: np.ndarray, image_format: str) -> bytes:
    """A 28x28 (or 28x28x1) uint8 image as raw bytes or a grayscale PNG."""
    image = np.asarray(image)
    if image.shape not in ((IMAGE_HEIGHT, IMAGE_WIDTH), (IMAGE_HEIGHT, IMAGE_WIDTH, 1)):
        raise ValueError(f"image shape {image.shape}, expected 28x28")
    image = image.reshape(IMAGE_HEIGHT, IMAGE_WIDTH)
    if image_format == "raw":
        return np.ascontiguousarray(image, dtype=np.uint8).tobytes()
    if image_format == "png":
        from PIL import Image  # only PNG output needs Pillow
        buffer = io.BytesIO()
        Image.fromarray(np.asarray(image, dtype=np.uint8), mode="L").save(
            buffer, format="PNG", optimize=False, compress_level=6)
        return buffer.getvalue()
    raise ValueError(f"unknown image format {image_format!r}")


def _image_bytes(images: np.ndarray, image_format: str) -> list[bytes]:
    n = len(images)
    if image_format == "raw":
        flat = np.ascontiguousarray(images, dtype=np.uint8).reshape(n, -1)
        if flat.shape[1] != IMAGE_BYTES:
            raise ValueError(f"images of {flat.shape[1]} bytes, expected {IMAGE_BYTES}")
        data = flat.tobytes()
        return [data[i * IMAGE_BYTES:(i + 1) * IMAGE_BYTES] for i in range(n)]
    return [encode_image(image, image_format) for image in images]


def encode_examples(values: dict[str, Sequence], image_format: str) -> list[bytes]:
    """Serialized Examples of a batch: ``values`` maps each feature to n values.

    The image feature takes uint8 images [n, 28, 28] (or [n, 28, 28, 1]), encoded
    per ``image_format``; the others integers. Equal, byte for byte, to
    `examples.encode_example` of each record.
    """
    if image_format not in IMAGE_FORMATS:
        raise ValueError(f"unknown image format {image_format!r}")
    columns = []
    for f in sorted(FEATURES, key=lambda f: f.name.encode()):
        value = values[f.name]
        if f.image:
            columns.append(list(map(_BytesEntries(f.name), _image_bytes(value, image_format))))
        elif f.kind == "bytes":
            columns.append(list(map(_BytesEntries(f.name), value)))
        else:
            columns.append(_int64_entries(f.name, np.asarray(value, dtype=np.int64)))
    heads: dict[int, bytes] = {}
    out = []
    for parts in zip(*columns):
        features = b"".join(parts)
        head = heads.get(len(features))
        if head is None:
            # Example{1: Features{...}}: tag and length of the Features message.
            head = heads[len(features)] = b"\x0a" + varint(len(features))
        out.append(head + features)
    return out
