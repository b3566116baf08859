"""The output folder: refusing to clobber, a temp folder, and an atomic-as-possible finalize.

While the job runs, everything it writes is under ``OUTPUT/.incomplete-RUNID/``.
Readers look only at top-level files named by the contract, and a dataset
counts as present only when ``manifest.json`` exists, which is written last.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from typing import Callable

import mnist_contract as contract

from pipeline import storage
from pipeline.errors import PipelineInputError

TEMP_PREFIX = ".incomplete-"
SHARD_LIST = "shards.json"


@dataclasses.dataclass(frozen=True)
class OutputLayout:
    output: str
    temp_dir: str

    @property
    def shard_list_path(self) -> str:
        return contract.join_path(self.temp_dir, SHARD_LIST)


def _top_level_names(output: str) -> dict[str, str]:
    """Base name -> full path for every file under ``output`` (top level only)."""
    prefix = output.rstrip("/") + "/"
    names = {}
    for path in storage.list_dir(output):
        relative = path[len(prefix):] if path.startswith(prefix) else path
        names[relative] = path
    return names


def _is_dataset_file(name: str) -> bool:
    if name in (contract.MANIFEST_FILE,) + contract.TFDS_METADATA_FILES:
        return True
    try:
        contract.parse_shard_filename(name)
    except contract.ContractError:
        return False
    return True


def prepare_output(output: str, run_id: str, overwrite: bool) -> OutputLayout:
    """Checks the output can be written and holds no dataset (unless overwriting).

    Temp folders left by runs that were killed are removed, with a warning.
    """
    try:
        storage.make_dirs(output)
        names = _top_level_names(output)
    except OSError as e:
        raise PipelineInputError(f"{output}: output is not writable ({e})") from None
    existing = sorted(n for n in names if _is_dataset_file(n))
    if existing and not overwrite:
        raise PipelineInputError(
            f"{output}: already holds a dataset ({existing[0]}, ...); "
            "pass --overwrite to replace it")
    stale = sorted({n.split("/", 1)[0] for n in names if n.startswith(TEMP_PREFIX)})
    for folder in stale:
        logging.warning("Removing %s, left by an earlier run that did not finish",
                        contract.join_path(output, folder))
        storage.delete_tree(contract.join_path(output, folder))
    layout = OutputLayout(output, contract.join_path(output, TEMP_PREFIX + run_id))
    probe = contract.join_path(layout.temp_dir, ".probe")
    try:
        storage.make_dirs(layout.temp_dir)
        storage.write_bytes(probe, b"")
        storage.delete([probe])
    except OSError as e:
        raise PipelineInputError(f"{output}: output is not writable ({e})") from None
    return layout


def _read_shard_list(layout: OutputLayout) -> list[dict]:
    return json.loads(storage.read_bytes(layout.shard_list_path))


def build_manifest(shard_infos: list[dict], conv, source_description: str
                   ) -> contract.Manifest:
    per_split: dict[str, list[dict]] = {}
    for info in shard_infos:
        per_split.setdefault(info["split"], []).append(info)
    splits = {}
    for split, infos in per_split.items():
        infos.sort(key=lambda i: i["file"])
        splits[split] = contract.SplitInfo(split, tuple(
            contract.ShardInfo(i["file"], i["num_examples"], i["num_bytes"],
                               i["sha256"]) for i in infos))
    manifest = contract.Manifest(
        dataset=contract.DATASET_NAME, image_format=conv.image_format,
        compression=conv.compression, splits=splits, source=source_description,
        shuffle_salt=conv.shuffle_salt)
    # Round-trips through the validating parser: a gap in shard numbering fails here.
    return contract.Manifest.from_json(manifest.to_json(), "new manifest")


def finalize(layout: OutputLayout, conv, source_description: str,
             tfds_files: Callable[[contract.Manifest], dict[str, bytes]]
             ) -> contract.Manifest:
    """Moves the shards into place and writes metadata, the manifest last."""
    manifest = build_manifest(_read_shard_list(layout), conv, source_description)
    shards = [s for split in manifest.splits.values() for s in split.shards]
    new_shards = [s.file for s in shards]
    for shard in shards:
        size = storage.size_of(contract.join_path(layout.temp_dir, shard.file))
        if size != shard.num_bytes:
            raise RuntimeError(f"{shard.file}: temp file has {size} bytes, "
                               f"expected {shard.num_bytes}")
    metadata = {contract.MANIFEST_FILE: manifest.to_json().encode()}
    if conv.compression == "none":
        metadata.update(tfds_files(manifest))
    else:
        logging.info("Compressed output: no TFDS metadata (TFDS reads only "
                     "uncompressed TFRecords); manifest.json describes the files.")
    for name, data in metadata.items():
        storage.write_bytes(contract.join_path(layout.temp_dir, name), data)

    old = _top_level_names(layout.output)
    # Old metadata goes first, so a reader never pairs it with new shards.
    storage.delete([old[n] for n in (contract.MANIFEST_FILE,) + contract.TFDS_METADATA_FILES
                    if n in old])
    storage.rename([contract.join_path(layout.temp_dir, n) for n in new_shards],
                   [contract.join_path(layout.output, n) for n in new_shards])
    storage.delete([path for name, path in old.items()
                    if _is_dataset_file(name) and name not in new_shards
                    and name not in metadata])
    for group in ([n for n in metadata if n != contract.MANIFEST_FILE],
                  [contract.MANIFEST_FILE]):
        storage.rename([contract.join_path(layout.temp_dir, n) for n in group],
                       [contract.join_path(layout.output, n) for n in group])
    storage.delete_tree(layout.temp_dir)
    for split, info in sorted(manifest.splits.items()):
        logging.debug("%s: %d examples in %d shard(s) of %s bytes -> %s", split,
                     info.num_examples, len(info.shards),
                     "/".join(str(s.num_bytes) for s in info.shards[:4]) +
                     ("/..." if len(info.shards) > 4 else ""), layout.output)
    return manifest
