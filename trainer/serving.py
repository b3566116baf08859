"""The trainer's export run the way a server runs it, for `trainer.predict`:
its ``serving_default`` signature (`load_signature`) on uint8 pixels
(`predict`), image files read into MNIST's form (`read_image`; `read_png`
for ``--raw``), and a split of the conversion job's output read by the
trainer's own input code (`split_batches`, `evaluate_split`).

Imports TensorFlow: `trainer.predict` checks the command line and local
paths first, then imports it quietly, then this module.
"""

from __future__ import annotations

import sys
from typing import Iterator, Optional, Sequence

import numpy as np
import tensorflow as tf
from google.protobuf.message import DecodeError

import mnist_contract as contract
from trainer import digit_image, path_checks
from trainer.data import input_pipeline, splits
from trainer.errors import TrainerError, TrainerInputError, summarize_error
from trainer.model.export import SIGNATURE_INPUT
from trainer.run import outputs

BATCH = 256


def load_signature(model_dir: str):
    """The export's ``serving_default`` function."""
    path = contract.join_path(model_dir, outputs.EXPORT)
    if not tf.io.gfile.exists(contract.join_path(path, "saved_model.pb")):
        raise TrainerInputError(f"{path}: no SavedModel (train with --model_dir={model_dir} "
                                "first)")
    problem = outputs.uncommitted(model_dir)
    if problem:  # the pair export + metrics.json is not one run's (`trainer.run.outputs`)
        raise TrainerInputError(f"{path}: not committed ({problem}); run the trainer with "
                                f"--model_dir={model_dir} again to finish it")
    try:
        loaded = tf.saved_model.load(path)
    except (tf.errors.OpError, ValueError) as e:
        raise TrainerInputError(f"{path}: cannot load the SavedModel "
                                f"({summarize_error(e)})") from None
    except (OSError, DecodeError) as e:  # TensorFlow's word for a protobuf it cannot parse
        why = str(e).rsplit(": ", 1)[-1].rstrip(".")
        raise TrainerInputError(f"{contract.join_path(path, 'saved_model.pb')}: not a "
                                f"SavedModel ({why})") from None
    if "serving_default" not in loaded.signatures:
        raise TrainerInputError(f"{path}: no serving_default signature")
    return loaded.signatures["serving_default"]


def predict(signature, images: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(class [N], probability of that class [N])`` for uint8 images."""
    out = signature(**{SIGNATURE_INPUT: tf.constant(images, tf.uint8)})
    classes = out["class"].numpy()
    probabilities = out["probabilities"].numpy()
    return classes, probabilities[np.arange(len(classes)), classes]


def read_png(path: str) -> np.ndarray:
    """A 28x28x1 uint8 image from a PNG file, its pixels as they are (``--raw``).

    A file that is missing or is not such a PNG is bad input; one the storage
    fails to read is a failure at run time.
    """
    blob = _read_bytes(path)
    _check_png_header(path, blob)
    try:
        image = tf.io.decode_png(blob, channels=contract.IMAGE_CHANNELS).numpy()
    except tf.errors.OpError as e:
        raise TrainerInputError(f"{path}: cannot decode the PNG "
                                f"({summarize_error(e)})") from None
    if image.shape != contract.IMAGE_SHAPE:
        _refuse_size(path, image.shape[0], image.shape[1])
    return image


# A larger picture is refused before decoding: 40 megapixels decode to 160 MB
# of RGBA, and a phone's photo has 12 to 24.
MAX_PIXELS = 40_000_000


def read_image(path: str) -> tuple[np.ndarray, str]:
    """A 28x28x1 uint8 image from a PNG or JPEG of one digit, and what was done
    to make it MNIST's form (`trainer.digit_image`); "" for a picture already
    in that form, taken as it is."""
    blob = _read_bytes(path)
    height, width, kind = _image_size(path, blob)
    if height * width > MAX_PIXELS:
        raise TrainerInputError(f"{path}: image is {height}x{width} (height x width), over "
                                f"{MAX_PIXELS // 1_000_000} megapixels; scale it down first")
    try:
        pixels = tf.io.decode_image(blob, channels=0, dtype=tf.uint8,
                                    expand_animations=False).numpy()
    except tf.errors.OpError as e:
        raise TrainerInputError(f"{path}: cannot decode the {kind} "
                                f"({summarize_error(e)})") from None
    if digit_image.is_mnist_form(pixels):
        return pixels.reshape(contract.IMAGE_SHAPE), ""
    try:
        prepared = digit_image.to_mnist(pixels)
    except digit_image.NoDigit as e:
        raise TrainerInputError(f"{path}: {e}") from None
    return prepared.image, f"{path}: {height}x{width} {kind}: {prepared.note}"


def _image_size(path: str, blob: bytes) -> tuple[int, int, str]:
    """``(height, width, "PNG" or "JPEG")`` from the file's header, not decoded."""
    if blob.startswith(b"\x89PNG\r\n\x1a\n"):
        if len(blob) < 26 or blob[12:16] != b"IHDR":
            raise TrainerInputError(f"{path}: not a PNG file (no IHDR header)")
        return int.from_bytes(blob[20:24], "big"), int.from_bytes(blob[16:20], "big"), "PNG"
    if blob.startswith(b"\xff\xd8\xff"):
        try:
            height, width, _ = (int(n) for n in tf.io.extract_jpeg_shape(blob).numpy())
        except tf.errors.OpError as e:
            raise TrainerInputError(f"{path}: cannot decode the JPEG "
                                    f"({summarize_error(e)})") from None
        return height, width, "JPEG"
    raise TrainerInputError(f"{path}: not a PNG or JPEG file")


def _read_bytes(path: str) -> bytes:
    """The file's bytes: missing is bad input, a storage failure is not."""
    path_checks.check_image(path)  # a FIFO would block the read for ever
    try:
        if tf.io.gfile.isdir(path):
            raise TrainerInputError(f"{path}: a directory, not a PNG file")
        with tf.io.gfile.GFile(path, "rb") as f:
            return f.read()
    except tf.errors.NotFoundError as e:
        raise TrainerInputError(f"{path}: cannot read ({summarize_error(e)})") from None
    except tf.errors.OpError as e:
        raise TrainerError(f"{path}: cannot read ({summarize_error(e)})") from None


# PNG colour types (the IHDR header's byte after the bit depth) and their names.
_PNG_COLOUR_TYPES = {0: "grayscale", 2: "RGB", 3: "palette", 4: "grayscale+alpha",
                     6: "RGBA"}


def _check_png_header(path: str, blob: bytes) -> None:
    """The PNG signature, and the size and mode its IHDR header gives, before
    decoding: a 20000x20000 image would take gigabytes to decode only to be
    refused. Only grayscale of 1 to 8 bits per pixel is taken, as documented:
    it decodes to MNIST's uint8 pixels exactly."""
    if not blob.startswith(b"\x89PNG\r\n\x1a\n"):
        raise TrainerInputError(f"{path}: not a PNG file")
    if len(blob) < 26 or blob[12:16] != b"IHDR":
        raise TrainerInputError(f"{path}: not a PNG file (no IHDR header)")
    width, height = int.from_bytes(blob[16:20], "big"), int.from_bytes(blob[20:24], "big")
    if (height, width) != (contract.IMAGE_HEIGHT, contract.IMAGE_WIDTH):
        _refuse_size(path, height, width)
    depth, colour = blob[24], blob[25]
    if colour != 0 or depth > 8:
        mode = _PNG_COLOUR_TYPES.get(colour, f"colour type {colour}")
        raise TrainerInputError(f"{path}: PNG mode {mode}, {depth} bits per sample; "
                                "expected grayscale of at most 8 bits")


def _refuse_size(path: str, height: int, width: int) -> None:
    raise TrainerInputError(f"{path}: image is {height}x{width} (height x width), "
                            f"expected {contract.IMAGE_HEIGHT}x{contract.IMAGE_WIDTH}")


def split_batches(data_dir: str, split: str, limit: Optional[int]) -> Iterator[dict]:
    """Batches of ``{image uint8 [n,28,28,1], label, index}`` of one split, in file order.

    The manifest, the split's files and the decoding are the trainer's own
    (`trainer.data.input_pipeline`), so predictions see exactly the pixels training saw.
    """
    files = splits.split_files(data_dir, splits.load_manifest(data_dir), split)
    ds = tf.data.TFRecordDataset(list(files.files), compression_type=files.compression_type)
    if limit is not None:
        ds = ds.take(limit)
    ds = ds.batch(BATCH).map(
        lambda s: input_pipeline.decode_batch(s, files.image_format)).prefetch(1)
    try:
        for batch in ds:
            yield {k: v.numpy() for k, v in batch.items()}
    except tf.errors.OpError as e:  # corrupt records are bad input, an I/O error is not
        corrupt = isinstance(e, (tf.errors.DataLossError, tf.errors.InvalidArgumentError))
        found = input_pipeline.find_bad_file(files) if corrupt else None
        if found:
            raise TrainerInputError(f"{found[0]}: {found[1]}") from None
        raise (TrainerInputError if corrupt else TrainerError)(
            f"{data_dir}: cannot read split {split!r} ({summarize_error(e)})") from None


def evaluate_split(signature, data_dir: str, split: str, limit: Optional[int],
                   out=None) -> tuple[int, int]:
    """Prints a line per example (to ``out``, default stdout); ``(correct, total)``."""
    out = out or sys.stdout
    correct = total = 0
    for batch in split_batches(data_dir, split, limit):
        classes, probs = predict(signature, batch[contract.IMAGE_KEY])
        for index, label, cls, p in zip(batch[contract.INDEX_KEY], batch[contract.LABEL_KEY],
                                        classes, probs):
            print(f"index={index} label={label} class={cls} probability={p:.4f}", file=out)
        correct += int((classes == batch[contract.LABEL_KEY]).sum())
        total += len(classes)
    return correct, total


def predict_images(signature, paths: Sequence[str], raw: bool) -> None:
    """A line per file on stdout, after a line on stderr for each file made MNIST's form."""
    images = []
    for path in paths:
        image, note = (read_png(path), "") if raw else read_image(path)
        if note:
            print(f"note: {note}", file=sys.stderr)
        images.append(image)
    classes, probs = predict(signature, np.stack(images))
    for path, cls, p in zip(paths, classes, probs):
        print(f"{path} class={cls} probability={p:.4f}")
