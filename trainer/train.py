"""The one entry point: `train_and_evaluate(config)` → final metrics.

It reads as the run goes: every check first (`trainer.run.preflight`), then,
holding ``model_dir``, the model, the loop (`trainer.loop.build`), the
export and the commit of the export with ``metrics.json``. Both loops
return the same dict and write the same layout under ``model_dir``
(`trainer.run.outputs`).

Expected failures surface as `TrainerError` with one line naming the file or
setting: among them a corrupt record, which TensorFlow reports as
``DataLossError: corrupted record at <offset>`` with no file name, and a
record that is no MNIST example (a label outside 0-9, an image of another
size: a failed check of the parse); the file and the record are then found
by reading the shards one at a time. Under multi-worker
training the worker that read the bad shard says so and exits; the others'
collectives then abort (the peer closed its connection) and they exit with
a line pointing at the other worker, rather than waiting for it.
"""

from __future__ import annotations

import contextlib
from typing import Iterator, Sequence

import tensorflow as tf
import tf_keras

from mnist_common.stop import deferred
from mnist_contract import join_path
from trainer import malloc
from trainer.config import TrainConfig
from trainer.data import input_pipeline
from trainer.errors import TrainerError, TrainerInputError, os_reason, summarize_error
from trainer.loop.build import build_controller
from trainer.model import export, models
from trainer.run.preflight import Run, preflight
from trainer.run import checkpoint_repair, dataset_pin, lock as run_lock, outputs, preemption
from trainer.run.claim import Claim


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
        dataset            the data's path and manifest sha256 (`trainer.run.dataset_pin`)
        export_id          the id ``model_dir/export`` carries (`trainer.run.outputs`)

    ``callbacks`` are extra Keras callbacks (Keras loop only).
    """
    run = preflight(config, callbacks)
    if not run.distribution.tpu:
        # Not on a TPU: connected to a TPU Node, eager ops run on its remote
        # worker, where the Python generator the restore runs cannot.
        malloc.restore_malloc_thresholds()
    if config.seed is not None:
        # Initial weights (and Python/NumPy randomness); the input order is
        # seeded in `trainer.data.input_pipeline`.
        tf_keras.utils.set_random_seed(config.seed)
    with _holding_model_dir(run) as claim:
        with (_marked_as_training(), _training_errors(run),
              models.precision(config.mixed_precision)):
            plan = run.plan
            model, optimizer = models.build(run.model_spec, run.distribution.strategy,
                                            plan.total_steps, warmup_steps=plan.warmup_steps,
                                            ghost_batch_size=plan.ghost_batch_size)
            result = build_controller(run, model, optimizer, claim, callbacks).run()
            staged = _export(run, model, claim)
        metrics = _metrics(run, result, claim.run_id)
        if run.role.chief:
            run.pin.check()
            claim.check(leftover=staged)
            _commit(config.model_dir, staged, metrics)
    return metrics


@contextlib.contextmanager
def _holding_model_dir(run: Run) -> Iterator[Claim]:
    """The chief holds ``model_dir``'s lock for the run (`trainer.run.lock`),
    clears what interrupted runs left, applies ``--restart`` and checks the
    dataset against the pin on resume; the claim records the pin once the
    restore has passed its checks too (`trainer.run.claim`). Other workers
    hold nothing."""
    if not run.role.chief:
        yield Claim()
        return
    config = run.config
    with deferred():  # a signal that ends the process releases it too
        lock = run_lock.acquire(config.model_dir)
        preemption.at_stop(lock.release)
    try:
        directory = join_path(config.model_dir, outputs.CHECKPOINTS)
        outputs.discard_stale_exports(config.model_dir)
        if config.restart:
            checkpoint_repair.discard(directory)
        dataset_pin.check_resume(config.model_dir, run.pin,
                                 resuming=bool(checkpoint_repair.list_checkpoints(directory)),
                                 allow_new=config.allow_new_dataset)
        yield Claim(config.model_dir, lock, run.pin)
    finally:
        lock.release()
        preemption.forget(lock.release)


def _export(run: Run, model: tf_keras.Model, claim: Claim) -> str:
    """Exports from the run's own data: the chief into a staging folder for
    `_commit`, other workers (who must take part) into their scratch folder."""
    run.pin.check()
    claim.check()
    model_dir = run.config.model_dir
    staged = (outputs.staging_dir(model_dir, claim.run_id) if run.role.chief
              else run.role.write_dir(model_dir, outputs.EXPORT))
    export.export_model(model, staged)
    run.role.discard_scratch(model_dir)
    return staged


def _metrics(run: Run, result: dict, run_id: str) -> dict:
    config, plan = run.config, run.plan
    return {
        "preset": config.preset,
        "loop": config.loop,
        "strategy": run.distribution.name,
        "replicas": plan.replicas,
        "global_batch_size": plan.global_batch_size,
        "epochs": plan.epochs,
        "steps_per_epoch": plan.steps_per_epoch,
        "train_examples": result["train_steps"] * plan.global_batch_size,
        "dataset": run.pin.summary(),
        "export_id": f"{run_id}-step{result['train_steps']}",
        **result,
    }


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


@contextlib.contextmanager
def _marked_as_training() -> Iterator[None]:
    """Marks a `TrainerError` raised while the model is built, trained or
    exported (``after_training_began``): the training's input iterators may
    be alive."""
    try:
        yield
    except TrainerError as e:
        e.after_training_began = True
        raise


@contextlib.contextmanager
def _training_errors(run: Run) -> Iterator[None]:
    """TensorFlow's errors while training and exporting, as `TrainerError` lines."""
    try:
        yield
    except (tf.errors.NotFoundError, tf.errors.DataLossError,
            tf.errors.InvalidArgumentError) as e:
        # A shard replaced under the reader: gone, cut short, or another format.
        changed = run.pin.changed()
        if changed:
            raise dataset_pin.changed_error(run.config.data, changed) from None
        if isinstance(e, tf.errors.NotFoundError):
            raise
        raise _bad_data_error(e, run) from None
    except (tf.errors.UnavailableError, tf.errors.AbortedError,
            tf.errors.CancelledError) as e:
        if not run.distribution.multi_worker:
            raise
        # A peer that failed (e.g. on a corrupt shard of its own) closes its
        # end; the collectives here abort instead of waiting for it forever.
        raise TrainerError(
            f"another worker left during training ({_collective_reason(e)}); "
            "its own log names the cause") from None


def _collective_reason(error: tf.errors.OpError) -> str:
    """The line of a collective-op error that says why it aborted."""
    for line in (getattr(error, "message", None) or str(error)).splitlines():
        if "aborted by" in line:
            return line.strip()[:160]
    return summarize_error(error)


def _bad_data_error(error: tf.errors.OpError, run: Run) -> TrainerError:
    """The file (and record) at fault for a read or parse error of an unchanged
    dataset (`trainer.data.input_pipeline.find_bad_file`), else the error's gist."""
    for split in (run.train_files, run.test_files):
        found = input_pipeline.find_bad_file(split)
        if found:
            path, message = found
            return TrainerInputError(f"{path}: {message}")
    if isinstance(error, tf.errors.DataLossError):
        return TrainerInputError(f"data loss while reading the shards: "
                                 f"{summarize_error(error)}")
    raise error
