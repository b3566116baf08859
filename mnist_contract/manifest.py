"""``manifest.json``: what a conversion run wrote, per split and per shard.

Readers take example counts (steps per epoch, eval size), file sizes and
checksums from it without scanning the files, so parsing is strict: the top
level is an object, counts are positive integers (not booleans, floats or
strings), names follow the contract, and each shard's byte size must be able
to hold its count of records. A hand-edited or damaged manifest is refused
with one line naming the file. Standard library only.
"""

from __future__ import annotations

import dataclasses
import json
import re
from typing import Any, Mapping

from mnist_contract.spec import (COMPRESSIONS, DATASET_NAME, IMAGE_FORMATS,
                                 MANIFEST_FILE, MANIFEST_VERSION, ContractError,
                                 feature_spec_description, parse_shard_filename)
from mnist_contract.sizes import max_plausible_examples

_SHA256_RE = re.compile(r"[0-9a-f]{64}")


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
    """Per split, per shard counts, sizes and checksums, plus how records are stored."""

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
    def from_json(cls, text: str | bytes, origin: str = MANIFEST_FILE) -> "Manifest":
        """Parses and validates a manifest; every error is one line naming ``origin``."""
        try:
            if isinstance(text, bytes):
                text = text.decode("utf-8")
            raw = json.loads(text)
        except UnicodeDecodeError:
            raise ContractError(f"{origin}: not UTF-8 text") from None
        except json.JSONDecodeError as e:
            raise ContractError(f"{origin}: not valid JSON ({e})") from None
        except RecursionError:
            raise ContractError(f"{origin}: JSON nested too deeply") from None
        return _parse(raw, origin)


def _get(obj: Mapping, key: str, kind, where: str, origin: str):
    if key not in obj:
        raise ContractError(f"{origin}: {where}lacks {key!r}")
    value = obj[key]
    if kind is int:
        ok = type(value) is int  # bool is an int subclass; floats and strings are not
    else:
        ok = isinstance(value, kind)
    if not ok:
        raise ContractError(f"{origin}: {where}{key!r} must be "
                            f"{_KIND_NAMES.get(kind, kind)}, not {json.dumps(value)[:40]}")
    return value


_KIND_NAMES = {int: "an integer", str: "a string", dict: "an object", list: "a list"}


def _parse(raw: Any, origin: str) -> Manifest:
    if not isinstance(raw, dict):
        raise ContractError(f"{origin}: top level must be a JSON object, "
                            f"not {type(raw).__name__}")
    version = raw.get("format_version")
    if type(version) is not int or version != MANIFEST_VERSION:
        raise ContractError(f"{origin}: unsupported format_version "
                            f"{version!r} (expected {MANIFEST_VERSION})")
    dataset = _get(raw, "dataset", str, "", origin)
    if dataset != DATASET_NAME:
        raise ContractError(f"{origin}: dataset {dataset!r}, expected {DATASET_NAME!r}")
    image_format = _get(raw, "image_format", str, "", origin)
    if image_format not in IMAGE_FORMATS:
        raise ContractError(f"{origin}: unknown image_format {image_format!r}")
    compression = _get(raw, "compression", str, "", origin)
    if compression not in COMPRESSIONS:
        raise ContractError(f"{origin}: unknown compression {compression!r}")
    splits = {name: _parse_split(name, split, image_format, compression, origin)
              for name, split in _get(raw, "splits", dict, "", origin).items()}
    if not splits:
        raise ContractError(f"{origin}: lists no splits")
    return Manifest(dataset=dataset, image_format=image_format, compression=compression,
                    splits=splits, source=str(raw.get("source", "")),
                    shuffle_salt=str(raw.get("shuffle_salt", "")))


def _parse_split(name: str, split: Any, image_format: str, compression: str,
                 origin: str) -> SplitInfo:
    where = f"split {name!r}: "
    if not isinstance(split, dict):
        raise ContractError(f"{origin}: {where}must be an object")
    shards = []
    listed = _get(split, "shards", list, where, origin)
    if not listed:
        raise ContractError(f"{origin}: {where}lists no shards")
    for i, s in enumerate(listed):
        if not isinstance(s, dict):
            raise ContractError(f"{origin}: {where}shard {i} must be an object")
        file = _get(s, "file", str, where, origin)
        shard_where = f"{where}{file}: "
        shard = ShardInfo(file=file,
                          num_examples=_get(s, "num_examples", int, shard_where, origin),
                          num_bytes=_get(s, "num_bytes", int, shard_where, origin),
                          sha256=_get(s, "sha256", str, shard_where, origin))
        _check_shard(shard, name, i, len(listed), image_format, compression, origin)
        shards.append(shard)
    info = SplitInfo(name=name, shards=tuple(shards))
    total = _get(split, "num_examples", int, where, origin)
    if info.num_examples != total:
        raise ContractError(
            f"{origin}: split {name!r} says {total} examples but its shards "
            f"add up to {info.num_examples}")
    return info


def _check_shard(shard: ShardInfo, split: str, position: int, count: int,
                 image_format: str, compression: str, origin: str) -> None:
    try:
        _, shard_split, index, of = parse_shard_filename(shard.file)
    except ContractError as e:
        raise ContractError(f"{origin}: split {split!r}: {e}") from None
    if (shard_split, index, of) != (split, position, count):
        raise ContractError(f"{origin}: split {split!r} lists {shard.file} at "
                            f"position {position} of {count}")
    if shard.num_examples < 1:
        raise ContractError(f"{origin}: {shard.file}: num_examples must be >= 1, "
                            f"not {shard.num_examples}")
    if shard.num_bytes < 1:
        raise ContractError(f"{origin}: {shard.file}: num_bytes must be >= 1, "
                            f"not {shard.num_bytes}")
    most = max_plausible_examples(shard.num_bytes, image_format, compression)
    if shard.num_examples > most:
        raise ContractError(
            f"{origin}: {shard.file}: {shard.num_examples} examples cannot fit in "
            f"{shard.num_bytes} bytes (at most {most} {image_format} records)")
    if not _SHA256_RE.fullmatch(shard.sha256):
        raise ContractError(f"{origin}: {shard.file}: sha256 is not 64 hex digits")
