"""Every check a run makes before it writes anything: `preflight(config) -> Run`.

In order: ``--model_dir`` is not a file nor the data's folder; the manifest reads and each
split's files exist with their sizes; the strategy comes up (a CPU split or
a multi-worker strategy must be set up before any other TensorFlow work)
and answers once what the run asks of it (`trainer.strategy.Distribution`);
the records' format matches the manifest; the batch divides among the
replicas; XLA is available if asked for; the run is long enough (its numbers,
derived once: `trainer.run.plan.Plan`); Keras callbacks come with the Keras
loop. Only then is ``--model_dir`` created (`trainer.run.outputs.make_model_dir`).
The answer, `Run`, says once whether this process is the chief
(`trainer.run.outputs.Role`); nothing after it asks again.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from typing import Sequence

import tensorflow as tf

import mnist_contract as contract
from trainer import strategy as strategy_lib
from trainer.config import TrainConfig
from trainer.data import checks
from trainer.data.input_pipeline import InputSettings
from trainer.data.splits import SplitFiles, read_manifest, split_files
from trainer.errors import TrainerError, TrainerInputError, summarize_error
from trainer.run import outputs
from trainer.run.dataset_pin import DatasetPin
from trainer.run.plan import ModelSpec, Plan, plan_run, settings_of

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class Run:
    """What the parts of one run share, settled before it writes anything."""

    config: TrainConfig
    distribution: strategy_lib.Distribution  # the strategy and its answers
    role: outputs.Role
    train_files: SplitFiles
    test_files: SplitFiles
    plan: Plan  # the run's numbers, derived once
    model_spec: ModelSpec  # the flags of the model and its optimizer
    reading: InputSettings  # the flags of the input pipelines
    pin: DatasetPin


def preflight(config: TrainConfig, callbacks: Sequence = ()) -> Run:
    """Checks the run once, in the module docstring's order; makes ``--model_dir``."""
    check_model_dir(config.model_dir, config.data)
    manifest, raw = read_manifest(config.data)
    pin = DatasetPin.of(config.data, manifest, raw)
    train_files = split_files(config.data, manifest, "train")
    test_files = split_files(config.data, manifest, "test")
    strategy = strategy_lib.make_strategy(config.strategy, config.tpu, config.cpu_replicas,
                                          config.cluster_timeout)
    distribution = strategy_lib.Distribution.of(strategy, jit_compile=config.jit_compile)
    manifest_path = contract.join_path(config.data, contract.MANIFEST_FILE)
    for split in (train_files, test_files):
        checks.check_image_format(split.files[0], split.image_format,
                                  split.compression_type, manifest_path)
    plan = plan_run(config, distribution, train_files)
    log.info("%s; %d train / %d test examples; %d steps per epoch; global batch %d "
             "= %d per replica, %d per host (%d host(s))",
             distribution.describe(), train_files.num_examples, test_files.num_examples,
             plan.steps_per_epoch, plan.global_batch_size, plan.per_replica_batch,
             plan.global_batch_size // distribution.hosts, distribution.hosts)
    if plan.ghost_batch_size:
        log.info("batch normalization in training: ghost batches of %d",
                 plan.ghost_batch_size)
    if config.loop == "custom" and callbacks:
        raise TrainerInputError("Keras callbacks need --loop=keras")
    outputs.make_model_dir(config.model_dir)
    return Run(config, distribution, outputs.Role.of(distribution), train_files, test_files,
               plan, settings_of(ModelSpec, config), settings_of(InputSettings, config), pin)


def check_model_dir(model_dir: str, data: str = "") -> None:
    """``model_dir`` is a folder or does not exist yet (a file, or a symbolic link
    to nothing, is refused), apart from ``data`` (the run's files would mix
    with the dataset's), and what it holds under the layout's folder names
    are folders (found before training, not at the first save)."""
    overlap = _overlap(model_dir, data) if data else ""
    if overlap:
        raise TrainerInputError(f"{model_dir}: --model_dir {overlap} --data ({data}); the "
                                "run's files would mix with the dataset's")
    if "://" not in model_dir and os.path.islink(model_dir) and not os.path.exists(model_dir):
        raise TrainerInputError(f"{model_dir}: --model_dir is a symbolic link to "
                                f"{os.readlink(model_dir)}, which does not exist")
    try:
        if tf.io.gfile.exists(model_dir) and not tf.io.gfile.isdir(model_dir):
            raise TrainerInputError(f"{model_dir}: --model_dir is a file, not a folder")
        for sub in (outputs.CHECKPOINTS, outputs.LOGS):
            path = contract.join_path(model_dir, sub)
            if tf.io.gfile.exists(path) and not tf.io.gfile.isdir(path):
                raise TrainerInputError(f"{path}: a file where the run keeps its {sub} "
                                        "folder")
    except tf.errors.OpError as e:
        raise TrainerError(f"{model_dir}: cannot create --model_dir "
                           f"({summarize_error(e)})") from None


def _overlap(model_dir: str, data: str) -> str:
    """How ``model_dir`` and ``data`` overlap ("is", "is inside", "holds"), or ""."""
    def norm(path: str) -> str:
        return path.rstrip("/") if "://" in path else os.path.realpath(path)
    a, b = norm(model_dir), norm(data)
    if a == b:
        return "is"
    if a.startswith(b + "/"):
        return "is inside"
    return "holds" if b.startswith(a + "/") else ""
