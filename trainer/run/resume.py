"""What a resumed run must share with the run whose checkpoints it continues.

The settings that define a run travel in each checkpoint (`saved_settings`)
and a resume with other values is refused with one line naming the flag
(`check_settings`), so ``metrics.json`` stays true: its step counts, example
counts and epoch history all assume one batch size and one epoch length.

* Fixed for the run: ``--model``, ``--global_batch_size``, the steps per
  epoch (``--steps_per_epoch``, or the split's size ÷ the batch),
  ``--augment``, ``--optimizer``, ``--learning_rate``, ``--lr_schedule``,
  ``--warmup_steps``, ``--warmup_epochs``, ``--weight_decay``,
  ``--label_smoothing``, ``--dropout``, ``--bn_virtual_batch_size`` and
  ``--mixed_precision``.
* ``--epochs`` may grow ("train longer"), or shrink to no fewer epochs than
  the checkpoint has begun; with ``--lr_schedule=cosine`` it is fixed too
  (the decay spans every epoch).
* Anything else (seed, logging, checkpointing, input tuning) may change.

A checkpoint without saved settings (written before they were saved) is
checked only for its model.
"""

from __future__ import annotations

import math
from typing import Any, Mapping

from trainer.config import TrainConfig
from trainer.errors import TrainerError, TrainerInputError

FIXED = ("model", "global_batch_size", "steps_per_epoch", "augment", "optimizer",
         "learning_rate", "lr_schedule", "warmup_steps", "warmup_epochs", "weight_decay",
         "label_smoothing", "dropout", "bn_virtual_batch_size", "mixed_precision")


def saved_settings(config: TrainConfig, steps_per_epoch: int) -> dict:
    """The settings a checkpoint records."""
    values = {name: getattr(config, name) for name in FIXED}
    return {**values, "steps_per_epoch": steps_per_epoch, "epochs": config.epochs}


def _flag(value: Any) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def _refuse(name: str, value: Any, saved: Any, model_dir: str) -> TrainerError:
    return TrainerInputError(
        f"--{name}={_flag(value)}: {model_dir} was trained with {_flag(saved)}; resume "
        f"with --{name}={_flag(saved)} or use another --model_dir")


def check_settings(saved: Mapping, current: Mapping, step: int, directory: str,
                   model_dir: str) -> None:
    """Raises `TrainerError` naming the first flag that cannot change on resume.

    ``saved``: the checkpoint's state; ``current``: this run's `saved_settings`;
    ``step``: the checkpoint's global step; ``directory``: the checkpoints
    folder (for the model line); ``model_dir``: the run's (for the others).
    """
    settings = dict(saved.get("settings") or {})
    model = settings.get("model", saved.get("model", current["model"]))
    if model != current["model"]:
        raise TrainerInputError(
            f"{directory}: holds checkpoints of --model={model}, not "
            f"--model={current['model']}; resume with --model={model} or use another "
            "--model_dir")
    for name in FIXED:
        if name in settings and settings[name] != current[name]:
            raise _refuse(name, current[name], settings[name], model_dir)
    epochs, steps_per_epoch = current["epochs"], current["steps_per_epoch"]
    if "epochs" in settings and current["lr_schedule"] == "cosine" \
            and settings["epochs"] != epochs:
        raise _refuse("epochs", epochs, settings["epochs"], model_dir)
    begun = math.ceil(step / steps_per_epoch)
    if begun > epochs:
        raise TrainerInputError(
            f"--epochs={epochs}: {model_dir} has trained {step} steps "
            f"({begun} epochs of {steps_per_epoch}); resume with --epochs={begun} or "
            "more, or use another --model_dir")
