"""What a dataset folder holds, as its manifest lists it: the splits' files.

`read_manifest` reads ``manifest.json`` through ``tf.io.gfile`` (local,
``gs://``, ``ram://``) and refuses a folder that is missing, mid-publish or
incomplete, and a local manifest that is not a regular file (a FIFO);
`split_files` lists a split's files with their example counts, sizes and
sha256s, each checked to exist with its size
(`trainer.data.checks.check_sizes`).
"""

from __future__ import annotations

import dataclasses

import tensorflow as tf

import mnist_contract as contract
from mnist_common import local_paths
from trainer import path_checks
from trainer.data import checks
from trainer.errors import TrainerError, TrainerInputError, summarize_error


def load_manifest(data_dir: str) -> contract.Manifest:
    """Reads ``manifest.json`` from ``data_dir`` (any tf.io.gfile path)."""
    return read_manifest(data_dir)[0]


def read_manifest(data_dir: str) -> tuple[contract.Manifest, bytes]:
    """`load_manifest` and the bytes it parsed (their sha256 identifies the dataset)."""
    path = contract.join_path(data_dir, contract.MANIFEST_FILE)
    journal = contract.join_path(data_dir, contract.PUBLISH_JOURNAL_FILE)
    try:
        is_dir = tf.io.gfile.isdir(data_dir)
        has_manifest = is_dir and tf.io.gfile.exists(path)
        # Present during (or after an interrupted) publish: the files may mix two datasets.
        interrupted = is_dir and tf.io.gfile.exists(journal)
    except tf.errors.OpError as e:  # e.g. gs:// without credentials or network
        raise TrainerError(f"{data_dir}: cannot access ({summarize_error(e)})") from None
    if not is_dir:
        raise _not_a_folder(data_dir)
    if interrupted:
        raise TrainerInputError(contract.interrupted_publish_message(journal, b""))
    if not has_manifest:
        raise TrainerInputError(path_checks.not_converted(data_dir))
    try:
        local_paths.check_is_file(path)  # a FIFO would block the read forever
        with tf.io.gfile.GFile(path, "rb") as f:
            raw = f.read()
        return contract.Manifest.from_json(raw, origin=path), raw
    except local_paths.NotAFile as e:
        raise TrainerInputError(f"{path}: {e.strerror}") from None
    except contract.ContractError as e:
        raise TrainerInputError(str(e)) from None
    except tf.errors.OpError as e:
        raise TrainerError(f"{path}: cannot read ({summarize_error(e)})") from None


def _not_a_folder(data_dir: str) -> TrainerError:
    """Why ``data_dir`` is not a folder: a file, a bucket that does not exist,
    storage that cannot be reached (``isdir`` says False for all of them), or
    nothing there."""
    bucket = "gs://" + data_dir[len("gs://"):].split("/", 1)[0] if data_dir.startswith(
        "gs://") else ""
    try:
        if tf.io.gfile.exists(data_dir):
            return TrainerInputError(f"{data_dir}: --data is a file, not the pipeline's "
                                     "output folder")
        if bucket and not tf.io.gfile.exists(bucket):
            return TrainerInputError(f"{data_dir}: bucket {bucket} does not exist")
    except tf.errors.OpError as e:
        return TrainerError(f"{data_dir}: cannot reach it ({summarize_error(e)})")
    return TrainerInputError(f"{data_dir}: data directory not found")


@dataclasses.dataclass(frozen=True)
class SplitFiles:
    """One split's files (full paths) and per-file example counts."""

    name: str
    files: tuple[str, ...]
    counts: tuple[int, ...]
    image_format: str
    compression_type: str  # for TFRecordDataset: "" or "GZIP"
    sizes: tuple[int, ...] = ()  # the manifest's num_bytes per file
    sha256s: tuple[str, ...] = ()  # the manifest's sha256 per file

    @property
    def num_examples(self) -> int:
        return sum(self.counts)


def split_files(data_dir: str, manifest: contract.Manifest, split: str) -> SplitFiles:
    """The files of ``split`` as listed in the manifest, each checked to exist
    with the manifest's size (`trainer.data.checks.check_sizes`)."""
    try:
        info = manifest.split(split)
    except contract.ContractError as e:
        path = contract.join_path(data_dir, contract.MANIFEST_FILE)
        raise TrainerInputError(f"{path}: {e}") from None
    if not info.shards or info.num_examples == 0:
        raise TrainerInputError(f"{data_dir}: split {split!r} has no examples")
    paths = tuple(contract.join_path(data_dir, shard.file) for shard in info.shards)
    sizes = tuple(shard.num_bytes for shard in info.shards)
    checks.check_sizes(paths, sizes)
    return SplitFiles(name=split, files=paths,
                      counts=tuple(s.num_examples for s in info.shards),
                      image_format=manifest.image_format,
                      compression_type=manifest.tf_compression_type, sizes=sizes,
                      sha256s=tuple(shard.sha256 for shard in info.shards))
