"""What the trainer shows in TensorBoard besides its scalars: images and the run's settings.

Both loops write the same (`trainer.loop.controller` calls these at start, after
each evaluation and at the end):

* ``logs/train`` ``inputs``: at start, `PREVIEW_IMAGES` training digits as
  the model's first layer receives them: with ``--augment``, after a copy
  of the model's augmentation layer (its own seed, so the training stream of
  random numbers is untouched), else as read.
* ``logs/validation``, after each evaluation: ``confusion_matrix`` (rows:
  true class, columns: predicted; each cell shaded by its share of the row
  and labelled with its count), ``confusion_counts`` (the same counts as an
  int64 tensor, for programs reading the event files) and ``misclassified``
  (the pass's first misclassified test digits, each captioned
  ``P<predicted> T<true>``; left out when there are none). Descriptions
  are fixed text: TensorBoard shows a tag's first one at every step.
* ``logs`` (the run's root): the config through TensorBoard's HParams
  plugin at start, and ``test_accuracy`` and ``test_loss`` at the end, the
  metrics the HParams dashboard lists for each run, so runs in one
  ``--logdir`` compare by their settings.

Images are drawn with numpy alone: labels use a 3x5 pixel font, so the
trainer needs no imaging library.
"""

from __future__ import annotations

import dataclasses
from typing import Mapping, Sequence

import numpy as np

import trainer  # noqa: F401  (sets TF_USE_LEGACY_KERAS before TF loads)
import tensorflow as tf
import tf_keras as keras
from tensorboard.plugins.hparams import api as hp

import mnist_contract as contract
from trainer.config import TrainConfig
from trainer.data import input_pipeline, splits
from trainer.loop.eval_metrics import EvalDetails
from trainer.model.augment import RandomAffine

PREVIEW_IMAGES = 64
PREVIEW_SEED = 1
GRID_COLUMNS = 8
MISCLASSIFIED_COLUMNS = 5
TEST_METRICS = ("test_accuracy", "test_loss")

# 3x5 glyphs, one string per row ("#": ink).
_FONT = {
    "0": ("###", "#.#", "#.#", "#.#", "###"), "1": (".#.", "##.", ".#.", ".#.", "###"),
    "2": ("###", "..#", "###", "#..", "###"), "3": ("###", "..#", "###", "..#", "###"),
    "4": ("#.#", "#.#", "###", "..#", "..#"), "5": ("###", "#..", "###", "..#", "###"),
    "6": ("###", "#..", "###", "#.#", "###"), "7": ("###", "..#", "..#", "..#", "..#"),
    "8": ("###", "#.#", "###", "#.#", "###"), "9": ("###", "#.#", "###", "..#", "###"),
    "P": ("###", "#.#", "###", "#..", "#.."), "T": ("###", ".#.", ".#.", ".#.", ".#."),
}
_SCALE = 2  # font and digit pixels per image pixel in the labelled images
_GAP = 2
_BACKGROUND = (40, 40, 40)
_PREDICTED_INK, _TRUE_INK = (255, 110, 110), (120, 230, 120)


def text_mask(text: str, scale: int = _SCALE) -> np.ndarray:
    """bool [5*scale, (4*len-1)*scale]: ``text`` in the 3x5 font, one column between glyphs."""
    rows = [np.array([[c == "#" for c in row] for row in _FONT[ch]]) for ch in text]
    spaced = [np.pad(glyph, ((0, 0), (0, 1))) for glyph in rows]
    mask = np.concatenate(spaced, axis=1)[:, :-1] if spaced else np.zeros((5, 0), bool)
    return mask.repeat(scale, axis=0).repeat(scale, axis=1)


def _stamp(canvas: np.ndarray, mask: np.ndarray, top: int, left: int, ink) -> None:
    """Paints ``mask`` onto ``canvas`` (RGB, in place) at (top, left) in ``ink``."""
    region = canvas[top:top + mask.shape[0], left:left + mask.shape[1]]
    region[mask] = ink


def to_rgb(images: np.ndarray, scale: int = 1) -> np.ndarray:
    """uint8 RGB [N, H*scale, W*scale, 3] from float [N, H, W, 1] images in [0, 1]."""
    gray = np.clip(np.rint(np.asarray(images, np.float32)[..., 0] * 255), 0, 255)
    gray = gray.astype(np.uint8).repeat(scale, axis=1).repeat(scale, axis=2)
    return np.repeat(gray[..., None], 3, axis=-1)


def image_grid(tiles: np.ndarray, columns: int = GRID_COLUMNS) -> np.ndarray:
    """uint8 [H, W, 3]: RGB ``tiles`` [N, h, w, 3] in rows of ``columns``, ``_GAP`` apart."""
    n, h, w = tiles.shape[:3]
    columns = max(1, min(columns, n))
    rows = max(1, -(-n // columns))
    grid = np.empty((rows * (h + _GAP) + _GAP, columns * (w + _GAP) + _GAP, 3), np.uint8)
    grid[:] = _BACKGROUND
    for i, tile in enumerate(tiles):
        top, left = _GAP + (i // columns) * (h + _GAP), _GAP + (i % columns) * (w + _GAP)
        grid[top:top + h, left:left + w] = tile
    return grid


def captioned(images: np.ndarray, predicted: Sequence[int],
              labels: Sequence[int]) -> np.ndarray:
    """RGB tiles: each digit ``_SCALE`` times its size over ``P<predicted> T<true>``."""
    digits = to_rgb(images, _SCALE)
    n, h, w = digits.shape[:3]
    strip = 5 * _SCALE + 2 * _GAP
    tiles = np.zeros((n, h + strip, w, 3), np.uint8)
    tiles[:, :h] = digits
    for tile, p, t in zip(tiles, predicted, labels):
        _stamp(tile, text_mask(f"P{p}"), h + _GAP, 0, _PREDICTED_INK)
        _stamp(tile, text_mask(f"T{t}"), h + _GAP, w // 2, _TRUE_INK)
    return tiles


def confusion_image(matrix: np.ndarray) -> np.ndarray:
    """uint8 [H, W, 3]: the count matrix, a class label before each row and
    above each column; cells shaded by their share of the row."""
    k = matrix.shape[0]
    char = 4 * _SCALE
    width = (len(str(max(int(matrix.max()), 0))) + 1) * char
    height = 5 * _SCALE + char  # the text, half a character above and below
    image = np.zeros(((k + 1) * height, (k + 1) * width, 3), np.uint8)
    image[:] = _BACKGROUND
    totals = np.maximum(matrix.sum(axis=1, keepdims=True), 1)
    shade = np.rint(255 * matrix / totals).astype(np.uint8)
    text_top, text_left = (height - 5 * _SCALE) // 2, char // 2
    for c in range(k):
        label = text_mask(str(c))
        _stamp(image, label, (c + 1) * height + text_top, text_left, _TRUE_INK)
        _stamp(image, label, text_top, (c + 1) * width + text_left, _PREDICTED_INK)
    for (row, col), count in np.ndenumerate(matrix):
        top, left = (row + 1) * height, (col + 1) * width
        image[top + 1:top + height - 1, left + 1:left + width - 1] = shade[row, col]
        ink = (0, 0, 0) if shade[row, col] > 127 else (255, 255, 255)
        _stamp(image, text_mask(str(count)), top + text_top, left + text_left, ink)
    return image


def _png_summary(tag: str, image: np.ndarray, description: str) -> None:
    tf.summary.image(tag, image[None], max_outputs=1, description=description)


def write_evaluation(details: EvalDetails) -> None:
    """The confusion matrix (image and counts) and the misclassified digits
    (when there are any), to the default writer and step."""
    _png_summary("confusion_matrix", confusion_image(details.confusion),
                 "Test examples by true class (rows, green) and predicted class "
                 "(columns, red); cells shaded by their share of the row.")
    tf.summary.write("confusion_counts", tf.constant(details.confusion, tf.int64),
                     metadata=tf.compat.v1.SummaryMetadata(summary_description=(
                         "The confusion matrix's counts: [true class, predicted class].")))
    if len(details.indices):
        tiles = captioned(details.images, details.predicted, details.labels)
        _png_summary("misclassified", image_grid(tiles, MISCLASSIFIED_COLUMNS),
                     "The pass's first misclassified test digits, each captioned "
                     "P<predicted> (red) T<true> (green).")


def write_inputs(images: np.ndarray, augmented: bool) -> None:
    """The training digits of `train_preview`, to the default writer and step."""
    how = ("after a copy of the model's augmentation layer (training mode)" if augmented
           else "as read (no --augment)")
    _png_summary("inputs", image_grid(to_rgb(images)),
                 f"{len(images)} training digits as the model receives them, {how}.")


def hparams_values(config: TrainConfig, steps_per_epoch: int) -> dict:
    """The config as HParams values (str, int, float, bool): unset fields left
    out, ``profile_steps`` as ``START,END``, ``steps_per_epoch`` as used."""
    values = {}
    for f in dataclasses.fields(config):
        value = getattr(config, f.name)
        if isinstance(value, tuple):
            value = ",".join(map(str, value))
        if value is not None:
            values[f.name] = value
    return {**values, "steps_per_epoch": steps_per_epoch}


def write_hparams(values: Mapping) -> None:
    """The HParams plugin's experiment (these settings, `TEST_METRICS`) and
    this run's values, to the default writer."""
    hp.hparams_config(hparams=[hp.HParam(name) for name in values],
                      metrics=[hp.Metric(tag) for tag in TEST_METRICS])
    hp.hparams(dict(values))


def write_test_metrics(result: Mapping) -> None:
    for tag in TEST_METRICS:
        tf.summary.scalar(tag, result[tag])


def train_preview(config: TrainConfig, model: keras.Model,
                  split: splits.SplitFiles) -> np.ndarray:
    """float32 [PREVIEW_IMAGES, 28, 28, 1]: one batch of the training split, as the
    model's first layer receives it.

    A separate small input (shuffled within one batch's worth of records), so
    the training stream is not consumed; with ``--augment`` the batch goes
    through a copy of the model's `RandomAffine` (same settings, its own
    `PREVIEW_SEED`), so the training layer's random numbers are not either.
    It reads the split's first file only, one that the chief's own input
    pipeline reads too (`trainer.data.input_pipeline.pipeline_files`): the preview the chief
    writes shows its own data, and each worker opens one file for it, not
    the whole split.
    """
    first = dataclasses.replace(split, files=split.files[:1], counts=split.counts[:1],
                                sizes=split.sizes[:1], sha256s=split.sha256s[:1])
    ds = input_pipeline.train_dataset(first, PREVIEW_IMAGES, tf.distribute.InputContext(),
                            shuffle_buffer=PREVIEW_IMAGES, seed=config.seed)
    with tf.device("CPU:0"):
        images = next(iter(ds))[contract.IMAGE_KEY]
        for layer in model.layers:
            if isinstance(layer, RandomAffine):
                copy = RandomAffine.from_config({**layer.get_config(), "dtype": "float32",
                                                 "seed": PREVIEW_SEED})
                images = copy(images, training=True)
        return images.numpy()
