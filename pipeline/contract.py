"""The data contract between the conversion job and the trainer.

Everything a reader needs to know about the files the pipeline writes lives
here: feature names, dtypes and shapes, how files are named, and the manifest
that describes them. The trainer imports this module (it pulls in nothing but
the standard library), so the two sides cannot drift apart.

Layout of an output directory (local path or ``gs://bucket/prefix``)::

    mnist-train.tfrecord-00000-of-00002      TFRecord files, records in a
    mnist-train.tfrecord-00001-of-00002      deterministic shuffled order
    mnist-test.tfrecord-00000-of-00001
    manifest.json                            this module's Manifest (written last)
    dataset_info.json, features.json         TFDS metadata (uncompressed output)

Each record is a serialized ``tf.train.Example`` with:

    image  bytes   raw: 784 bytes, uint8, row-major 28x28 (shape 28x28x1)
                   png: a grayscale PNG of 28x28
    label  int64   the digit, 0..9
    index  int64   the example's position in its source split (stable key)
"""

from __future__ import annotations

import dataclasses
import json
import re
from typing import Any, Mapping

DATASET_NAME = "mnist"
SPLITS = ("train", "test")

IMAGE_KEY = "image"
LABEL_KEY = "label"
INDEX_KEY = "index"

IMAGE_HEIGHT = 28
IMAGE_WIDTH = 28
IMAGE_CHANNELS = 1
IMAGE_SHAPE = (IMAGE_HEIGHT, IMAGE_WIDTH, IMAGE_CHANNELS)
IMAGE_BYTES = IMAGE_HEIGHT * IMAGE_WIDTH * IMAGE_CHANNELS
NUM_CLASSES = 10

IMAGE_FORMATS = ("raw", "png")
COMPRESSIONS = ("none", "gzip")

MANIFEST_FILE = "manifest.json"
MANIFEST_VERSION = 1
TFDS_METADATA_FILES = ("dataset_info.json", "features.json")
# Version written into dataset_info.json; matches TFDS's own mnist builder.
TFDS_VERSION = "3.0.1"

_SHARD_RE = re.compile(
    r"^(?P<dataset>[a-z0-9_]+)-(?P<split>[a-z0-9_]+)\.tfrecord-"
    r"(?P<index>\d{5})-of-(?P<count>\d{5})$"
)


class ContractError(ValueError):
    """The output does not follow this contract (bad manifest, bad name...)."""


def shard_filename(split: str, shard_index: int, num_shards: int,
                   dataset: str = DATASET_NAME) -> str:
    """TFDS-style file name, e.g. ``mnist-train.tfrecord-00000-of-00004``."""
    if not 0 <= shard_index < num_shards:
        raise ValueError(f"shard index {shard_index} not in [0, {num_shards})")
    return f"{dataset}-{split}.tfrecord-{shard_index:05d}-of-{num_shards:05d}"


def parse_shard_filename(name: str) -> tuple[str, str, int, int]:
    """Inverse of `shard_filename`: ``(dataset, split, index, count)``."""
    match = _SHARD_RE.match(name)
    if not match:
        raise ContractError(f"{name}: not a shard file name")
    return (match["dataset"], match["split"], int(match["index"]),
            int(match["count"]))


@dataclasses.dataclass(frozen=True)
class ShardInfo:
    file: str  # base name, relative to the output directory
    num_examples: int
    num_bytes: int
    sha256: str


@dataclasses.dataclass(frozen=True)
class SplitInfo:
    name: str
    shards: tuple[ShardInfo, ...]

    @property
    def num_examples(self) -> int:
        return sum(s.num_examples for s in self.shards)

    @property
    def num_bytes(self) -> int:
        return sum(s.num_bytes for s in self.shards)

    @property
    def files(self) -> list[str]:
        return [s.file for s in self.shards]


@dataclasses.dataclass(frozen=True)
class Manifest:
    """What was written: per split, per shard counts, sizes and checksums.

    Readers use it to know example counts (steps per epoch, eval size)
    without scanning the files.
    """

    dataset: str
    image_format: str
    compression: str
    splits: Mapping[str, SplitInfo]
    source: str = ""
    shuffle_salt: str = ""

    @property
    def tf_compression_type(self) -> str:
        """The value for ``tf.data.TFRecordDataset(compression_type=...)``."""
        return "GZIP" if self.compression == "gzip" else ""

    def split(self, name: str) -> SplitInfo:
        if name not in self.splits:
            raise ContractError(
                f"split {name!r} not in manifest (has {sorted(self.splits)})")
        return self.splits[name]

    def to_json(self) -> str:
        return json.dumps({
            "format_version": MANIFEST_VERSION,
            "dataset": self.dataset,
            "image_format": self.image_format,
            "compression": self.compression,
            "source": self.source,
            "shuffle_salt": self.shuffle_salt,
            "features": feature_spec_description(self.image_format),
            "splits": {
                name: {
                    "num_examples": split.num_examples,
                    "num_bytes": split.num_bytes,
                    "shards": [dataclasses.asdict(s) for s in split.shards],
                }
                for name, split in sorted(self.splits.items())
            },
        }, indent=2, sort_keys=True) + "\n"

    @classmethod
    def from_json(cls, text: str, origin: str = MANIFEST_FILE) -> "Manifest":
        """Parses and validates a manifest; errors name ``origin``."""
        try:
            raw = json.loads(text)
        except json.JSONDecodeError as e:
            raise ContractError(f"{origin}: not valid JSON ({e})") from None
        try:
            return cls._from_dict(raw, origin)
        except (KeyError, TypeError, ValueError) as e:
            if isinstance(e, ContractError):
                raise
            raise ContractError(f"{origin}: malformed manifest ({e!r})") from None

    @classmethod
    def _from_dict(cls, raw: Any, origin: str) -> "Manifest":
        if raw.get("format_version") != MANIFEST_VERSION:
            raise ContractError(
                f"{origin}: unsupported format_version "
                f"{raw.get('format_version')!r} (expected {MANIFEST_VERSION})")
        if raw["image_format"] not in IMAGE_FORMATS:
            raise ContractError(
                f"{origin}: unknown image_format {raw['image_format']!r}")
        if raw["compression"] not in COMPRESSIONS:
            raise ContractError(
                f"{origin}: unknown compression {raw['compression']!r}")
        splits = {}
        for name, split in raw["splits"].items():
            shards = tuple(ShardInfo(file=str(s["file"]),
                                     num_examples=int(s["num_examples"]),
                                     num_bytes=int(s["num_bytes"]),
                                     sha256=str(s["sha256"]))
                           for s in split["shards"])
            info = SplitInfo(name=name, shards=shards)
            for i, shard in enumerate(shards):
                _, shard_split, index, count = parse_shard_filename(shard.file)
                if (shard_split, index, count) != (name, i, len(shards)):
                    raise ContractError(
                        f"{origin}: split {name!r} lists {shard.file} at "
                        f"position {i} of {len(shards)}")
            if info.num_examples != int(split["num_examples"]):
                raise ContractError(
                    f"{origin}: split {name!r} says {split['num_examples']} "
                    f"examples but its shards add up to {info.num_examples}")
            splits[name] = info
        return cls(dataset=raw["dataset"], image_format=raw["image_format"],
                   compression=raw["compression"], splits=splits,
                   source=raw.get("source", ""),
                   shuffle_salt=raw.get("shuffle_salt", ""))


def feature_spec_description(image_format: str) -> dict[str, dict[str, Any]]:
    """A JSON-able description of the Example features, for humans and tools."""
    if image_format not in IMAGE_FORMATS:
        raise ValueError(f"unknown image format {image_format!r}")
    return {
        IMAGE_KEY: {"kind": "bytes", "encoding": image_format,
                    "shape": list(IMAGE_SHAPE), "dtype": "uint8"},
        LABEL_KEY: {"kind": "int64", "shape": [], "num_classes": NUM_CLASSES},
        INDEX_KEY: {"kind": "int64", "shape": []},
    }


def join_path(directory: str, name: str) -> str:
    """Joins for local paths and URIs alike (``gs://``, ``ram://``)."""
    return directory.rstrip("/") + "/" + name
