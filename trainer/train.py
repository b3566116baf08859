"""The one entry point: `train_and_evaluate(config)` → final metrics.

It reads the pipeline's manifest, checks the shards, picks the strategy and
runs the shared skeleton (`trainer.loop.controller`): model and optimizer,
restore, evaluation input and controller, then the Keras or the custom inner
loop, then the export. Both loops return the same dict (see
`train_and_evaluate`) and write the same layout under ``model_dir`` (see
`trainer.run.outputs`).

Expected failures surface as `TrainerError` with one line naming the file or
setting: among them a corrupt record, which TensorFlow reports as
``DataLossError: corrupted record at <offset>`` with no file name; the file
is then found by reading the shards one at a time. Under multi-worker
training the worker that read the bad shard says so and exits; the others'
collectives then abort (the peer closed its connection) and they exit with
a line pointing at the other worker, rather than waiting for it.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Sequence

import trainer  # noqa: F401  (sets TF_USE_LEGACY_KERAS before TF loads)
import tensorflow as tf
import tf_keras

import mnist_contract as contract
from mnist_contract import join_path
from trainer import strategy as strategy_lib
from trainer.config import TrainConfig
from trainer.data import checks, input_pipeline
from trainer.data.splits import SplitFiles, read_manifest, split_files
from trainer.data.splits import steps_per_epoch as split_steps_per_epoch
from trainer.errors import TrainerError, os_reason, summarize_error
from trainer.loop import controller as controller_lib, custom_loop, keras_loop, summaries
from trainer.loop.evaluator import Evaluator
from trainer.model import export, models as model_lib
from trainer.run import checkpoints, dataset_pin, lock as run_lock, outputs, preemption

log = logging.getLogger(__name__)


def train_and_evaluate(config: TrainConfig, *, callbacks: Sequence = ()) -> dict:
    """Trains per ``config`` and evaluates on the whole test split.

    Returns (and writes to ``model_dir/metrics.json``)::

        preset             the preset the config started from (None: none)
        loop, strategy, replicas, global_batch_size, epochs, steps_per_epoch,
        train_steps        optimizer steps taken in total (including before a resume)
        resumed_from_step  the step this run started from (0 for a fresh start)
        train_examples     train_steps * global_batch_size
        test_loss          mean cross-entropy over every test example (no L2 term)
        test_accuracy      accuracy over every test example
        test_examples      test examples evaluated (== the split's size)
        history            per epoch: train_loss, train_accuracy, test_loss, test_accuracy
                           (every epoch of the run, including those before a resume)

    ``callbacks`` are extra Keras callbacks (Keras loop only).

    Also ``dataset`` (the data's path and manifest sha256, `trainer.run.dataset_pin`)
    and ``export_id`` (the id ``model_dir/export`` carries, `trainer.run.outputs`).
    The chief holds ``model_dir``'s lock (`trainer.run.lock`) for the run.
    """
    outputs.check_model_dir(config.model_dir)
    splits, pin = _read_splits(config)
    # Before any tf.data work: a CPU split or a multi-worker strategy must be
    # set up before TensorFlow's runtime starts.
    strategy = strategy_lib.make_strategy(config.strategy, config.tpu, config.cpu_replicas)
    steps_per_epoch = _check_inputs(config, strategy, splits)
    if config.loop == "custom" and callbacks:
        raise TrainerError("Keras callbacks need --loop=keras")
    if config.seed is not None:
        # Initial weights (and Python/NumPy randomness); the input order is
        # seeded in `trainer.data.input_pipeline`.
        tf_keras.utils.set_random_seed(config.seed)
    outputs.check_model_dir(config.model_dir, create=True)
    chief = strategy_lib.is_chief(strategy)
    lock = run_lock.acquire(config.model_dir) if chief else None
    try:
        if chief:
            _prepare_model_dir(config, pin)
        run = _Run(config, strategy, splits, steps_per_epoch, pin,
                   lock.run_id if lock else "worker")
        result = _run_with_errors(run, callbacks)
        metrics = _metrics(run, result)
        if lock is not None:
            pin.check()
            lock.check_held(config.model_dir)
            _commit(config.model_dir, result.pop("staged"), metrics)
    finally:
        if lock is not None:
            lock.release()
    return metrics


def _commit(model_dir: str, staged: str, metrics: dict) -> None:
    """`trainer.run.outputs.commit_export`, a storage failure as one line.

    Until ``metrics.json`` is written nothing is committed (predict refuses
    an export it does not name), and the checkpoints are complete, so a rerun
    of the same command evaluates and exports again.
    """
    try:
        outputs.commit_export(model_dir, staged, metrics)
    except (tf.errors.OpError, OSError) as e:
        raise TrainerError(f"{join_path(model_dir, outputs.METRICS)}: cannot commit the "
                           f"export and metrics ({os_reason(e)}); training is complete "
                           "and checkpointed, a rerun exports again") from None


@dataclasses.dataclass(frozen=True)
class _Run:
    """What the parts of one run share."""

    config: TrainConfig
    strategy: tf.distribute.Strategy
    splits: tuple[SplitFiles, SplitFiles]
    steps_per_epoch: int
    pin: dataset_pin.DatasetPin
    run_id: str


def _metrics(run: _Run, result: dict) -> dict:
    config, strategy = run.config, run.strategy
    return {
        "preset": config.preset,
        "loop": config.loop,
        "strategy": strategy_lib.public_name(strategy),
        "replicas": strategy.num_replicas_in_sync,
        "global_batch_size": config.global_batch_size,
        "epochs": config.epochs,
        "steps_per_epoch": run.steps_per_epoch,
        "train_examples": result["train_steps"] * config.global_batch_size,
        "dataset": run.pin.summary(),
        "export_id": f"{run.run_id}-step{result['train_steps']}",
        **{k: v for k, v in result.items() if k != "staged"},
    }


def _prepare_model_dir(config: TrainConfig, pin: dataset_pin.DatasetPin) -> None:
    """The chief, holding the lock: clears what interrupted runs left, applies
    ``--restart``, and pins the dataset (refusing another one on resume)."""
    directory = join_path(config.model_dir, outputs.CHECKPOINTS)
    outputs.discard_stale_exports(config.model_dir)
    if config.restart:
        checkpoints.discard(directory)
    dataset_pin.pin_run(config.model_dir, pin,
                        resuming=bool(checkpoints.list_checkpoints(directory)),
                        allow_new=config.allow_new_dataset)


def _read_splits(config: TrainConfig):
    """The manifest's train and test files, each checked to exist with its size,
    and the dataset's identity."""
    manifest, raw = read_manifest(config.data)
    pin = dataset_pin.DatasetPin.of(config.data, manifest, raw)
    return (split_files(config.data, manifest, "train"),
            split_files(config.data, manifest, "test")), pin


def _check_inputs(config: TrainConfig, strategy: tf.distribute.Strategy,
                  splits: Sequence[SplitFiles]) -> int:
    """Checks the records' format and the batch split; logs the run's shape.

    Returns the steps per epoch.
    """
    train_files, test_files = splits
    manifest_path = join_path(config.data, contract.MANIFEST_FILE)
    for split in splits:
        checks.check_image_format(split.files[0], split.image_format,
                                  split.compression_type, manifest_path)
    replicas = strategy.num_replicas_in_sync
    config.check_replicas(replicas)
    if config.jit_compile:
        strategy_lib.check_jit_compile(strategy)
    steps_per_epoch = split_steps_per_epoch(train_files, config)
    config.check_total_steps(config.epochs * steps_per_epoch)
    hosts = strategy_lib.num_hosts(strategy)
    log.info("%s; %d train / %d test examples; %d steps per epoch; global batch %d "
             "= %d per replica, %d per host (%d host(s))",
             strategy_lib.describe(strategy), train_files.num_examples,
             test_files.num_examples, steps_per_epoch, config.global_batch_size,
             config.global_batch_size // replicas, config.global_batch_size // hosts,
             hosts)
    return steps_per_epoch


def _run_with_errors(run: _Run, callbacks: Sequence) -> dict:
    """`_run` under the precision policy, its failures as `TrainerError` lines."""
    model_lib.set_precision(run.config.mixed_precision)
    try:
        return _run(run, callbacks)
    except (tf.errors.NotFoundError, tf.errors.DataLossError,
            tf.errors.InvalidArgumentError) as e:
        # A shard replaced under the reader: gone, cut short, or another format.
        changed = run.pin.changed()
        if changed:
            raise dataset_pin.changed_error(run.config.data, changed) from None
        if isinstance(e, tf.errors.DataLossError):
            raise _corrupt_data_error(e, run.splits) from None
        raise
    except (tf.errors.UnavailableError, tf.errors.AbortedError,
            tf.errors.CancelledError) as e:
        if not strategy_lib.is_multi_worker(run.strategy):
            raise
        # A peer that failed (e.g. on a corrupt shard of its own) closes its
        # end; the collectives here abort instead of waiting for it forever.
        raise TrainerError(
            f"another worker left during training ({_collective_reason(e)}); "
            "its own log names the cause") from None
    finally:
        model_lib.set_precision("none")


def _run(run: _Run, callbacks: Sequence) -> dict:
    """The skeleton: build, restore, train (inner loop), evaluate, export.

    The chief's export goes to a staging folder (``staged`` in the result)
    for `trainer.run.outputs.commit_export`.
    """
    config, strategy, (train_files, test_files) = run.config, run.strategy, run.splits
    model, optimizer = model_lib.build(config, strategy, config.epochs * run.steps_per_epoch)
    test_ds, eval_steps = input_pipeline.eval_input(strategy, test_files, config)
    evaluator = Evaluator(
        strategy, model, test_ds, eval_steps, expected_examples=test_files.num_examples,
        origin=join_path(config.data, contract.MANIFEST_FILE))
    signals = preemption.StopSignals()
    controller = controller_lib.Controller(
        config, strategy, model, optimizer, run.steps_per_epoch, evaluator,
        print_steps=config.loop == "custom",  # Keras prints its own progress
        check_inputs=run.pin.check, signals=signals)
    outputs.log_write_dirs(config.model_dir, strategy)
    try:
        signals.watch()  # until controller.close()
        controller.restore()
        controller.log_start(summaries.train_preview(config, model, train_files))
        if config.loop == "keras":
            keras_loop.train(config, strategy, model, controller, train_files, callbacks)
        else:
            _train_custom(config, strategy, model, optimizer, controller, train_files)
        result = controller.finish()
    finally:
        controller.close()
    run.pin.check()
    if strategy_lib.is_chief(strategy):
        staged = outputs.staging_dir(config.model_dir, run.run_id)
    else:
        staged = outputs.write_dir(config.model_dir, outputs.EXPORT, strategy)
    export.export_model(model, staged)
    outputs.discard_scratch(config.model_dir, strategy)
    return {**result, "staged": staged}


def _train_custom(config: TrainConfig, strategy: tf.distribute.Strategy,
                  model: tf_keras.Model, optimizer, controller: controller_lib.Controller,
                  train_files: SplitFiles) -> None:
    """The custom inner loop on a train stream resumed at the controller's
    step, driven by the controller's outer loop."""
    loop = custom_loop.CustomLoop(config, strategy, model, optimizer)
    dataset = input_pipeline.train_input(strategy, train_files, config, start_step=controller.step)
    controller.train(loop, iter(dataset))


def _collective_reason(error: tf.errors.OpError) -> str:
    """The line of a collective-op error that says why it aborted."""
    for line in (getattr(error, "message", None) or str(error)).splitlines():
        if "aborted by" in line:
            return line.strip()[:160]
    return summarize_error(error)


def _corrupt_data_error(error: tf.errors.DataLossError,
                        splits: Sequence[SplitFiles]) -> TrainerError:
    for split in splits:
        found = input_pipeline.find_corrupt_file(split)
        if found:
            path, message = found
            return TrainerError(f"{path}: corrupt TFRecord data ({message})")
    return TrainerError(f"data loss while reading the shards: {summarize_error(error)}")
