"""What the trainer checks in what it reads, before it trusts it.

The manifest's own consistency (types, counts that fit the bytes, names) is
checked by `mnist_contract.Manifest.from_json`. Here the files are held to
the manifest:

* `check_sizes`: every shard the trainer will read has the manifest's byte
  size (a stat per file: shards swapped between splits, replaced or cut
  short are caught before any training);
* `verify_checksums` (``--verify_checksums``): the sha256 of each file an
  input pipeline reads, checked by that pipeline, so on several hosts each
  reads only its own files once more;
* `check_image_format`: the first record of each split decodes as the
  manifest's ``image_format`` says (raw bytes read as PNG, or the reverse,
  would otherwise fail deep inside a training step);
* `check_eval_count`: an evaluation counted exactly the manifest's number
  of test examples (a count edited to a plausible wrong value);
* `bad_record`: after the parse's own checks failed
  (`trainer.data.input_pipeline.decode_batch`), the record at fault and what
  is wrong with it (a label outside 0-9, an image of another size);

Each failure is a `TrainerError` whose one line names the file.
"""

from __future__ import annotations

import hashlib
from typing import Iterable

import tensorflow as tf

import mnist_contract as contract
from mnist_contract import examples
from trainer.errors import TrainerError, TrainerInputError, summarize_error

_CHUNK = 1 << 20


def check_sizes(paths: Iterable[str], sizes: Iterable[int]) -> None:
    """Each file's size against the manifest's ``num_bytes``."""
    for path, expected in zip(paths, sizes):
        try:
            actual = tf.io.gfile.stat(path).length
        except tf.errors.NotFoundError:
            raise TrainerInputError(f"{path}: listed in {contract.MANIFEST_FILE} but missing"
                               ) from None
        except tf.errors.OpError as e:
            raise TrainerError(f"{path}: cannot read ({summarize_error(e)})") from None
        if actual != expected:
            if tf.io.gfile.isdir(path):  # a folder's size is its directory entry's
                raise TrainerInputError(f"{path}: a directory, but {contract.MANIFEST_FILE} "
                                        "lists it as a shard file")
            raise TrainerInputError(
                f"{path}: {actual} bytes, but {contract.MANIFEST_FILE} lists {expected} "
                "(not the file the pipeline wrote; rerun it or restore the file)")


def file_sha256(path: str) -> str:
    digest = hashlib.sha256()
    with tf.io.gfile.GFile(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def verify_checksums(paths: Iterable[str], sha256s: Iterable[str]) -> None:
    """Each file's sha256 against the manifest's."""
    for path, expected in zip(paths, sha256s):
        try:
            actual = file_sha256(path)
        except tf.errors.OpError as e:
            raise TrainerError(f"{path}: cannot read ({summarize_error(e)})") from None
        if actual != expected:
            raise TrainerInputError(
                f"{path}: sha256 {actual[:16]}... differs from {contract.MANIFEST_FILE}'s "
                f"{expected[:16]}... (not the file the pipeline wrote)")


def check_image_format(path: str, image_format: str, compression_type: str,
                       manifest_path: str) -> None:
    """The first record of ``path`` decodes as ``image_format``."""
    try:
        first = next(iter(tf.data.TFRecordDataset(path, compression_type=compression_type)
                          .take(1)), None)
    except tf.errors.DataLossError as e:
        raise TrainerInputError(f"{path}: corrupt TFRecord data ({summarize_error(e)})"
                           ) from None
    except tf.errors.OpError as e:
        raise TrainerError(f"{path}: cannot read ({summarize_error(e)})") from None
    if first is None:
        raise TrainerInputError(f"{path}: holds no records")
    try:
        examples.decode_example(first.numpy(), image_format)
    except (ValueError, tf.errors.OpError) as e:
        raise TrainerInputError(
            f"{path}: its first record does not decode as {manifest_path}'s "
            f"image_format {image_format!r} ({summarize_error(e)})") from None


def check_eval_count(counted: int, expected: int, manifest_path: str) -> None:
    if counted != expected:
        raise TrainerInputError(
            f"{manifest_path}: lists {expected} test examples, but evaluation read "
            f"{counted} from the test shards")


def bad_record(serialized, image_format: str):
    """``(index, what is wrong)`` of the first record in ``serialized`` (a batch
    of serialized Examples) that is no MNIST example, else None."""
    feats = tf.io.parse_example(serialized, examples.parse_spec())
    labels = feats[contract.LABEL_KEY].numpy()
    images = feats[contract.IMAGE_KEY].numpy()
    pixels = contract.IMAGE_HEIGHT * contract.IMAGE_WIDTH * contract.IMAGE_CHANNELS
    for index, (label, image) in enumerate(zip(labels, images)):
        if not 0 <= label < contract.NUM_CLASSES:
            return index, f"label {label} is not a class (0-{contract.NUM_CLASSES - 1})"
        if image_format == "raw" and len(image) != pixels:
            return index, f"an image of {len(image)} bytes, not {pixels} (28x28)"
        if image_format != "raw":
            try:
                shape = tuple(tf.io.decode_png(image, channels=1).shape)
            except tf.errors.OpError as e:
                return index, f"an image that does not decode ({summarize_error(e)})"
            if shape != contract.IMAGE_SHAPE:
                return index, f"an image of {shape[0]}x{shape[1]}, not 28x28"
    return None
