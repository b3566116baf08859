"""Serialized ``tf.train.Example`` bytes, built and read straight in the protobuf wire format.

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
``tf.train.Example.SerializeToString(deterministic=True)``.

`decode_example` reads any serialized Example (`parse_example`) and checks it
against `spec.FEATURES`; the contract tests compare it with
``tf.io.parse_single_example``. Standard library and numpy only (PNG images
need Pillow), so the conversion job and ``pipeline.verify`` run without
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


def varint_columns(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """`varint` of each int64 value as (uint8 [n, 10] with each varint's bytes
    first, byte counts [n]), computed for the whole array at once."""
    v = np.asarray(values, dtype=np.int64).reshape(-1).astype(np.uint64)
    shifts = np.arange(10, dtype=np.uint64) * np.uint64(7)
    groups = ((v[:, None] >> shifts) & np.uint64(0x7F)).astype(np.uint8)
    lengths = 1 + ((v[:, None] >> shifts[1:]) != 0).sum(axis=1)
    groups[np.arange(10) < (lengths - 1)[:, None]] |= 0x80
    return groups, lengths


def varints(values: np.ndarray) -> list[bytes]:
    """`varint` of each int64 value, computed for the whole array at once."""
    groups, lengths = varint_columns(values)
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


def _column_parts(feature, value, image_format: str):
    """One feature of a batch as fixed-width parts, or None if an entry's length
    depends on more than a varint's length.

    (kind [n], {kind: (entry head, uint8 [n, w])}): the records of one kind
    share an entry head, and their entry is that head then their row of the
    array (a raw image, or the first ``w`` bytes of a varint).
    """
    if feature.image and image_format == "raw":
        flat = np.ascontiguousarray(value, dtype=np.uint8).reshape(len(value), -1)
        if flat.shape[1] != IMAGE_BYTES:
            raise ValueError(f"images of {flat.shape[1]} bytes, expected {IMAGE_BYTES}")
        head = bytes_entry(feature.name, bytes(IMAGE_BYTES))[:-IMAGE_BYTES]
        return np.zeros(len(flat), np.int64), {0: (head, flat)}
    if feature.kind != "int64":
        return None
    ints = np.asarray(value, dtype=np.int64).reshape(-1)
    groups, lengths = varint_columns(ints)
    parts = {}
    for k in np.unique(lengths).tolist():
        first = int(ints[np.argmax(lengths == k)])
        entry = int64_entry(feature.name, first)
        parts[k] = (entry[:len(entry) - k], groups[:, :k])
    return lengths, parts


def encode_example_rows(values: dict[str, Sequence], image_format: str
                        ) -> list[tuple[np.ndarray, np.ndarray]] | None:
    """The serialized Examples of a batch as fixed-width rows, for numpy to move.

    [(record positions [m], uint8 [m, length])], one block per record length;
    each row equals `encode_examples`'s bytes of that record. None when the
    image format (PNG) makes every record's length its own.
    """
    columns = []
    for f in sorted(FEATURES, key=lambda f: f.name.encode()):
        column = _column_parts(f, values[f.name], image_format)
        if column is None:
            return None
        columns.append(column)
    signature = np.zeros(len(columns[0][0]), np.int64)
    for widths, _ in columns:  # a width is at most 10: one digit base 16 per column
        signature = signature * 16 + widths
    kinds = np.unique(signature)
    blocks = []
    for kind in kinds.tolist():
        rows = np.flatnonzero(signature == kind)
        widths = [(kind >> (4 * (len(columns) - 1 - c))) & 15 for c in range(len(columns))]
        pieces = []
        for (_, parts), width in zip(columns, widths):
            head, data = parts[width]
            pieces += [_repeated(head, len(rows)),
                       data if len(kinds) == 1 else data[rows]]  # one kind: no copy
        features_len = sum(p.shape[1] for p in pieces)
        pieces.insert(0, _repeated(b"\x0a" + varint(features_len), len(rows)))
        blocks.append((rows, np.concatenate(pieces, axis=1)))
    return blocks


def _repeated(part: bytes, count: int) -> np.ndarray:
    """``part`` as ``count`` identical uint8 rows (a view, no copy)."""
    return np.broadcast_to(np.frombuffer(part, np.uint8), (count, len(part)))


# --- Decoding ------------------------------------------------------------------
#
# The reader accepts any valid serialization, not only the fixed layout above:
# fields in any order, a message field given more than once (merged), map
# entries repeated (the last wins), int64 and float lists packed or not.

_BYTES, _FLOAT, _INT64 = 1, 2, 3  # Feature's oneof fields
_KINDS = {_BYTES: "bytes", _FLOAT: "float", _INT64: "int64"}


def _read_varint(data: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if pos >= len(data) or shift > 63:
            raise ValueError("truncated or overlong varint")
        byte = data[pos]
        value |= (byte & 0x7F) << shift
        pos, shift = pos + 1, shift + 7
        if byte < 0x80:
            return value & _UINT64, pos


def _fields(data: bytes):
    """Yields ``(field number, wire type, value)`` of a message: ints, or bytes for
    length-delimited fields (packed lists, strings, messages)."""
    pos = 0
    while pos < len(data):
        key, pos = _read_varint(data, pos)
        number, wire_type = key >> 3, key & 7
        if number == 0:
            raise ValueError("field number 0")
        if wire_type == 0:
            value, pos = _read_varint(data, pos)
        elif wire_type in (1, 5):
            size = 8 if wire_type == 1 else 4
            if pos + size > len(data):
                raise ValueError("truncated fixed-size field")
            value, pos = int.from_bytes(data[pos:pos + size], "little"), pos + size
        elif wire_type == 2:
            size, pos = _read_varint(data, pos)
            if pos + size > len(data):
                raise ValueError("length-delimited field runs past the end")
            value, pos = data[pos:pos + size], pos + size
        else:
            raise ValueError(f"unsupported wire type {wire_type}")
        yield number, wire_type, value


def _list_values(kind: int, data: bytes) -> list:
    """The values of a BytesList, FloatList or Int64List message."""
    values: list = []
    for number, wire_type, value in _fields(data):
        if number != 1:
            continue  # an unknown field, skipped as protobuf does
        if kind == _BYTES and wire_type == 2:
            values.append(bytes(value))
        elif kind == _INT64 and wire_type in (0, 2):
            unsigned = [value] if wire_type == 0 else _packed_varints(value)
            values.extend(v - (1 << 64) if v >> 63 else v for v in unsigned)
        elif kind == _FLOAT and wire_type in (2, 5):
            packed = value if wire_type == 2 else value.to_bytes(4, "little")
            if len(packed) % 4:
                raise ValueError("packed float list of a length not a multiple of 4")
            values.extend(np.frombuffer(packed, "<f4").tolist())
        else:
            raise ValueError(f"{_KINDS[kind]} list value of wire type {wire_type}")
    return values


def _packed_varints(data: bytes) -> list[int]:
    values, pos = [], 0
    while pos < len(data):
        value, pos = _read_varint(data, pos)
        values.append(value)
    return values


def _feature(data: bytes) -> tuple[str, list]:
    """A Feature message as ``(kind, values)``; kind "" when none is set."""
    kind, values = 0, []
    for number, wire_type, value in _fields(data):
        if number not in _KINDS:
            continue
        if wire_type != 2:
            raise ValueError(f"Feature field {number} of wire type {wire_type}")
        if number != kind:  # another member of the oneof replaces the earlier one
            kind, values = number, []
        values.extend(_list_values(number, value))
    return _KINDS.get(kind, ""), values


def _message_field(data: bytes, wanted: int, what: str) -> list[bytes]:
    """Every occurrence of message field ``wanted`` (merged, they are their concatenation)."""
    parts = []
    for number, wire_type, value in _fields(data):
        if number == wanted:
            if wire_type != 2:
                raise ValueError(f"{what} of wire type {wire_type}")
            parts.append(value)
    return parts


def parse_example(serialized: bytes) -> dict[str, tuple[str, list]]:
    """Any serialized ``tf.train.Example`` as ``{name: (kind, values)}``.

    ``kind`` is ``bytes``, ``float`` or ``int64`` (``""`` for a Feature with
    no list set), ``values`` that list's values (int64 as signed integers).
    Raises ValueError for bytes that are not a well-formed Example.
    """
    serialized = bytes(serialized)
    features = b"".join(_message_field(serialized, 1, "Example.features"))
    out: dict[str, tuple[str, list]] = {}
    for entry in _message_field(features, 1, "Features.feature entry"):
        name, value = b"", b""
        for number, wire_type, field in _fields(entry):
            if number in (1, 2) and wire_type != 2:
                raise ValueError(f"map entry field {number} of wire type {wire_type}")
            if number == 1:
                name = field
            elif number == 2:
                value += field
        try:
            key = name.decode("utf-8")
        except UnicodeDecodeError:
            raise ValueError("feature name is not UTF-8") from None
        out[key] = _feature(value)
    return out


def decode_image(data: bytes, image_format: str) -> np.ndarray:
    """Inverse of `encode_image`: a (28, 28) uint8 array (PNG through Pillow)."""
    if image_format == "raw":
        if len(data) != IMAGE_BYTES:
            raise ValueError(f"raw image has {len(data)} bytes, expected {IMAGE_BYTES}")
        return np.frombuffer(data, dtype=np.uint8).reshape(IMAGE_HEIGHT, IMAGE_WIDTH)
    if image_format == "png":
        from PIL import Image
        try:
            with Image.open(io.BytesIO(data), formats=["PNG"]) as png:
                png.load()
                mode, pixels = png.mode, np.asarray(png)
        except (OSError, SyntaxError) as e:  # Pillow's errors for bad or cut PNG data
            raise ValueError(f"png image does not decode ({e})") from None
        if mode != "L":
            raise ValueError(f"png image has mode {mode}, expected 8-bit grayscale (L)")
        if pixels.shape != (IMAGE_HEIGHT, IMAGE_WIDTH):
            raise ValueError(f"png image has shape {pixels.shape}, expected 28x28")
        return pixels
    raise ValueError(f"unknown image format {image_format!r}")


def decode_example(serialized: bytes, image_format: str,
                   image_decoder=decode_image) -> dict[str, object]:
    """Inverse of `encode_examples` for one record: feature name -> value.

    The image is decoded by ``image_decoder(bytes, image_format)`` into a
    (28, 28) uint8 array. Raises ValueError for a record that lacks a
    feature, holds the wrong kind or count of values, or has a label
    outside its classes.
    """
    parsed = parse_example(serialized)
    out: dict[str, object] = {}
    for f in FEATURES:
        if f.name not in parsed:
            raise ValueError(f"example lacks feature {f.name!r}")
        kind, values = parsed[f.name]
        count = len(values) if kind == f.kind else 0
        if count != 1:
            raise ValueError(f"feature {f.name!r} holds {count} {f.kind} "
                             "values, expected 1")
        value = values[0]
        if f.image:
            value = image_decoder(value, image_format)
        if f.num_classes is not None and not 0 <= value < f.num_classes:
            raise ValueError(f"{f.name} {value} outside 0..{f.num_classes - 1}")
        out[f.name] = value
    return out
