"""The feature spec and file naming: what every record and file looks like.

`FEATURES` is the one statement of the record schema. The encoder and
decoder (`mnist_contract.examples`), the trainer's ``tf.io.parse_example``
spec, TFDS's ``features.json`` (`pipeline.publish.metadata`) and the manifest's
human-readable ``features`` entry are all derived from it, so a change here
reaches every reader and writer at once. Standard library only.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any, Optional

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
# Present while a run publishes (moves shards into place, manifest last). A
# reader that finds it must not read the folder: its files may be a mix of two
# datasets. The next run of the job completes the publish and removes it.
PUBLISH_JOURNAL_FILE = ".publish-journal.json"
# Version written into dataset_info.json; matches TFDS's own mnist builder.
TFDS_VERSION = "3.0.1"


@dataclasses.dataclass(frozen=True)
class Feature:
    """One feature of the serialized ``tf.train.Example``.

    ``kind`` is the Example's list type (``bytes`` or ``int64``), each
    feature holding exactly one value. ``shape`` and ``dtype`` describe the
    decoded value: for the image, the pixels after decoding its bytes.
    """

    name: str
    kind: str
    shape: tuple[int, ...]
    dtype: str
    doc: str
    num_classes: Optional[int] = None  # a class label in [0, num_classes)
    image: bool = False  # bytes holding an encoded image (raw or png)


FEATURES: tuple[Feature, ...] = (
    Feature(IMAGE_KEY, "bytes", IMAGE_SHAPE, "uint8", image=True,
            doc="raw: 784 bytes, uint8, row-major 28x28; png: a grayscale PNG"),
    Feature(LABEL_KEY, "int64", (), "int64", num_classes=NUM_CLASSES,
            doc="the digit, 0..9"),
    Feature(INDEX_KEY, "int64", (), "int64",
            doc="the example's position in its source split (stable key)"),
)
FEATURE_NAMES = tuple(f.name for f in FEATURES)

_SHARD_RE = re.compile(
    r"(?P<dataset>[a-z0-9_]+)-(?P<split>[a-z0-9_]+)\.tfrecord-"
    r"(?P<index>\d{5})-of-(?P<count>\d{5})")


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
    match = _SHARD_RE.fullmatch(name) if isinstance(name, str) else None
    if not match:
        raise ContractError(f"{name!r}: not a shard file name")
    return (match["dataset"], match["split"], int(match["index"]),
            int(match["count"]))


def feature_spec_description(image_format: str) -> dict[str, dict[str, Any]]:
    """`FEATURES` as JSON for humans and tools (the manifest's ``features``)."""
    if image_format not in IMAGE_FORMATS:
        raise ValueError(f"unknown image format {image_format!r}")
    out = {}
    for f in FEATURES:
        entry: dict[str, Any] = {"kind": f.kind, "shape": list(f.shape),
                                 "dtype": f.dtype}
        if f.image:
            entry["encoding"] = image_format
        if f.num_classes is not None:
            entry["num_classes"] = f.num_classes
        out[f.name] = entry
    return out


def interrupted_publish_message(journal_path: str, journal: bytes) -> str:
    """The one line readers print when they find a publish journal."""
    match = re.search(rb'"run_id"\s*:\s*"([0-9A-Za-z_-]{1,64})"', journal)
    run = f"of run {match.group(1).decode()} " if match else ""
    return (f"{journal_path}: interrupted publish {run}(or one still in progress); "
            "rerun the job to complete it")


def join_path(directory: str, name: str) -> str:
    """Joins for local paths and URIs alike (``gs://``, ``ram://``)."""
    return directory.rstrip("/") + "/" + name
