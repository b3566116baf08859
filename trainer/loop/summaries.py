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

The pictures are drawn by `trainer.loop.images`.
"""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Callable, Iterator, Mapping, Optional

import numpy as np

import tensorflow as tf
import tf_keras as keras
from tensorboard.plugins.hparams import api as hp

import mnist_contract as contract
from trainer.config import TrainConfig
from trainer.errors import TrainerError, os_reason
from trainer.data import input_pipeline, splits
from trainer.loop import images as drawing
from trainer.loop.eval_metrics import EvalDetails
from trainer.model.layers import RandomAffine

PREVIEW_IMAGES = 64
PREVIEW_SEED = 1
MISCLASSIFIED_COLUMNS = 5
TEST_METRICS = ("test_accuracy", "test_loss")

def _png_summary(tag: str, image: np.ndarray, description: str) -> None:
    tf.summary.image(tag, image[None], max_outputs=1, description=description)


def write_evaluation(details: EvalDetails) -> None:
    """The confusion matrix (image and counts) and the misclassified digits
    (when there are any), to the default writer and step."""
    _png_summary("confusion_matrix", drawing.confusion_image(details.confusion),
                 "Test examples by true class (rows, green) and predicted class "
                 "(columns, red); cells shaded by their share of the row.")
    tf.summary.write("confusion_counts", tf.constant(details.confusion, tf.int64),
                     metadata=tf.compat.v1.SummaryMetadata(summary_description=(
                         "The confusion matrix's counts: [true class, predicted class].")))
    if len(details.indices):
        tiles = drawing.captioned(details.images, details.predicted, details.labels)
        _png_summary("misclassified", drawing.image_grid(tiles, MISCLASSIFIED_COLUMNS),
                     "The pass's first misclassified test digits, each captioned "
                     "P<predicted> (red) T<true> (green).")


def write_inputs(images: np.ndarray, augmented: bool) -> None:
    """The training digits of `train_preview`, to the default writer and step."""
    how = ("after a copy of the model's augmentation layer (training mode)" if augmented
           else "as read (no --augment)")
    _png_summary("inputs", drawing.image_grid(drawing.to_rgb(images)),
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


def train_preview(seed: Optional[int], model: keras.Model,
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
                            shuffle_buffer=PREVIEW_IMAGES, seed=seed)
    with tf.device("CPU:0"):
        images = next(iter(ds))[contract.IMAGE_KEY]
        for layer in model.layers:
            if isinstance(layer, RandomAffine):
                copy = RandomAffine.from_config({**layer.get_config(), "dtype": "float32",
                                                 "seed": PREVIEW_SEED})
                images = copy(images, training=True)
        return images.numpy()


class Summaries:
    """The run's three TensorBoard writers and what goes to each.

    ``logs/train`` (scalars every ``--log_every`` steps, the input digits),
    ``logs/validation`` (each evaluation) and ``logs`` itself (the settings
    at start, the test metrics at the end); ``logs_dir`` is this worker's
    (a scratch folder off the chief, `trainer.run.outputs.Role`). The event
    files are made by the first write, once the run is accepted; each write is
    preceded by ``before_write`` (`trainer.run.claim.Claim.check`) and
    flushed, so nothing of a run that lost its lock is left to land later.
    """

    def __init__(self, logs_dir: str, config: TrainConfig, steps_per_epoch: int,
                 preview: Callable[[], np.ndarray],
                 before_write: Callable[[], None] = lambda: None):
        self.logs_dir, self.config, self.steps_per_epoch = logs_dir, config, steps_per_epoch
        self.preview = preview  # the input digits, read when the run starts
        self.before_write = before_write
        self.writers: dict = {}  # train, validation, run: made by the first write

    def start(self, step: int) -> None:
        """The run's settings (HParams) and a batch of its input digits (`train_preview`)."""
        inputs = self.preview()
        with self._writing("run", step):
            write_hparams(hparams_values(self.config, self.steps_per_epoch))
        with self._writing("train", step):
            write_inputs(inputs, augmented=self.config.augment)

    def train(self, step: int, loss: float, accuracy: float, rate: float) -> None:
        with self._writing("train", step):
            tf.summary.scalar("loss", loss)
            tf.summary.scalar("accuracy", accuracy)
            tf.summary.scalar("examples_per_second", rate)

    def evaluation(self, step: int, result: Mapping, details: EvalDetails) -> None:
        with self._writing("validation", step):
            tf.summary.scalar("loss", result["test_loss"])
            tf.summary.scalar("accuracy", result["test_accuracy"])
            write_evaluation(details)

    def finish(self, step: int, result: Mapping) -> None:
        """The final test metrics at the run's root."""
        with self._writing("run", step):
            write_test_metrics(result)

    @contextlib.contextmanager
    def _writing(self, name: str, step: int) -> Iterator[None]:
        """Writer ``name`` as the default at ``step``, after ``before_write``
        (which the first write makes the event files after); flushed after."""
        self.before_write()
        if not self.writers:
            self.writers = self._open()
        writer = self.writers[name]
        with writer.as_default(step=step):
            yield
        writer.flush()

    def _open(self) -> dict:
        try:
            return {name: tf.summary.create_file_writer(
                        contract.join_path(self.logs_dir, name) if name != "run"
                        else self.logs_dir) for name in ("train", "validation", "run")}
        except tf.errors.OpError as e:
            raise TrainerError(f"{self.logs_dir}: cannot write the TensorBoard logs of "
                               f"--model_dir ({os_reason(e)})") from None
