"""Where things are written in ``model_dir``, and who writes them.

Under multi-worker training every worker runs the same program and every
worker must take part in saving (saving runs collective ops), but only the
chief's files should land in ``model_dir``. As in the TF multi-worker guide,
the other workers write to a private temporary directory under
``model_dir`` and delete it afterwards.

Layout::

    model_dir/checkpoints/   ckpt-<step>: model, optimizer, history (both loops)
    model_dir/logs/          TensorBoard event files (train/, validation/,
                             plugins/profile/ with --profile_steps)
    model_dir/export/        the trained model (SavedModel)
    model_dir/metrics.json   the final metrics returned by train_and_evaluate
"""

from __future__ import annotations

import json
import logging

import trainer  # noqa: F401  (sets TF_USE_LEGACY_KERAS before TF loads)
import tensorflow as tf

from mnist_contract import join_path
from trainer import strategy as strategy_lib

log = logging.getLogger(__name__)

CHECKPOINTS = "checkpoints"
LOGS = "logs"
EXPORT = "export"
METRICS = "metrics.json"


def write_dir(model_dir: str, sub: str, strategy: tf.distribute.Strategy) -> str:
    """``model_dir/sub`` on the chief, a per-worker scratch directory elsewhere."""
    if strategy_lib.is_chief(strategy):
        return join_path(model_dir, sub)
    resolver = strategy.cluster_resolver
    return join_path(model_dir, f"workertemp_{resolver.task_type}_{resolver.task_id}/{sub}")


def log_write_dirs(model_dir: str, strategy: tf.distribute.Strategy) -> None:
    """One INFO line saying where this worker's checkpoints and summaries go."""
    role = "chief" if strategy_lib.is_chief(strategy) else "non-chief worker"
    log.info("%s: checkpoints to %s, summaries to %s", role,
             write_dir(model_dir, CHECKPOINTS, strategy),
             write_dir(model_dir, LOGS, strategy))


def discard_scratch(model_dir: str, strategy: tf.distribute.Strategy) -> None:
    """Deletes a non-chief worker's scratch directory (no-op on the chief)."""
    if strategy_lib.is_chief(strategy):
        return
    resolver = strategy.cluster_resolver
    path = join_path(model_dir, f"workertemp_{resolver.task_type}_{resolver.task_id}")
    if tf.io.gfile.exists(path):
        tf.io.gfile.rmtree(path)


def write_metrics(model_dir: str, metrics: dict, strategy: tf.distribute.Strategy) -> None:
    if strategy_lib.is_chief(strategy):
        with tf.io.gfile.GFile(join_path(model_dir, METRICS), "w") as f:
            f.write(json.dumps(metrics, indent=2, sort_keys=True) + "\n")



def discard_partial(path: str) -> str:
    """Removes what a failed save left at ``path``; "" when gone, else the
    clause that names it (``; remove the partial PATH``) for the error line."""
    try:
        if tf.io.gfile.exists(path):
            tf.io.gfile.rmtree(path)
        return ""
    except tf.errors.OpError:
        return f"; remove the partial {path}"
