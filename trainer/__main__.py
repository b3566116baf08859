"""``python -m trainer --data=DIR_OR_GS_URI --model_dir=DIR_OR_GS_URI [...]``.

Parses flags into a `TrainConfig`, calls `trainer.train.train_and_evaluate`
and prints the final test metrics. Expected failures (`TrainerError`) end
with one line on stderr and exit status 1, no traceback.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import sys
from typing import Optional, Sequence

import trainer  # noqa: F401  (sets TF_USE_LEGACY_KERAS before TF loads)
from trainer import config as config_lib
from trainer.config import TrainConfig, TrainerError


def _bool(text: str) -> bool:
    if text.lower() in ("1", "true", "yes"):
        return True
    if text.lower() in ("0", "false", "no"):
        return False
    raise argparse.ArgumentTypeError(f"expected true/false, not {text!r}")


def parse_args(argv: Optional[Sequence[str]] = None) -> TrainConfig:
    defaults = {f.name: f.default for f in dataclasses.fields(TrainConfig)}
    p = argparse.ArgumentParser(
        prog="python -m trainer",
        description="Train the MNIST CNN on the pipeline's TFRecords "
                    "(local path or gs://), on CPU, GPUs or a TPU.")
    p.add_argument("--data", required=True, help="pipeline output directory")
    p.add_argument("--model_dir", required=True,
                   help="checkpoints, TensorBoard logs, export, metrics.json")
    p.add_argument("--loop", choices=config_lib.LOOPS, default=defaults["loop"])
    p.add_argument("--model", choices=config_lib.MODELS, default=defaults["model"],
                   help="guide: the TPU guide's CNN; small: a narrow one for tests; "
                        "convnet: the CPU recipe (with --augment, --lr_schedule=cosine)")
    p.add_argument("--augment", type=_bool, nargs="?", const=True, default=defaults["augment"],
                   help="random rotations, zooms and shifts while training")
    p.add_argument("--epochs", type=int, default=defaults["epochs"])
    p.add_argument("--global_batch_size", type=int, default=defaults["global_batch_size"])
    p.add_argument("--steps_per_epoch", type=int, default=None,
                   help="default: train examples // global batch size")
    p.add_argument("--steps_per_execution", type=int,
                   default=defaults["steps_per_execution"],
                   help="training steps per tf.function call (both loops)")
    p.add_argument("--learning_rate", type=float, default=defaults["learning_rate"],
                   help="Adam's (peak) learning rate")
    p.add_argument("--lr_schedule", choices=config_lib.LR_SCHEDULES,
                   default=defaults["lr_schedule"],
                   help="after the warmup: constant, or a cosine decay to 0")
    p.add_argument("--warmup_steps", type=int, default=defaults["warmup_steps"],
                   help="linear learning-rate warmup from 0")
    p.add_argument("--strategy", choices=config_lib.STRATEGIES, default=defaults["strategy"])
    p.add_argument("--tpu", default=None, help="'local' on a TPU VM, else the TPU name")
    p.add_argument("--cpu_replicas", type=int, default=defaults["cpu_replicas"],
                   help="split the CPU into N logical devices (MirroredStrategy)")
    p.add_argument("--mixed_precision", choices=config_lib.PRECISIONS,
                   default=defaults["mixed_precision"])
    p.add_argument("--jit_compile", type=_bool, nargs="?", const=True,
                   default=defaults["jit_compile"], help="XLA-compile the train step")
    p.add_argument("--cache", type=_bool, nargs="?", const=True, default=defaults["cache"],
                   help="cache the records in memory after the first epoch")
    p.add_argument("--shuffle_buffer", type=int, default=defaults["shuffle_buffer"])
    p.add_argument("--seed", type=int, default=None,
                   help="seed the weights and the input order; a resumed run "
                        "then continues the same stream of batches")
    p.add_argument("--checkpoint_every", type=int, default=defaults["checkpoint_every"],
                   help="also checkpoint every N steps within an epoch (0: epoch ends only)")
    p.add_argument("--log_every", type=int, default=defaults["log_every"],
                   help="custom loop: progress line every N steps")
    p.add_argument("--verbose", type=int, choices=(0, 1, 2), default=defaults["verbose"],
                   help="Keras progress: 0 silent, 1 bar, 2 a line per epoch")
    args = p.parse_args(argv)
    return TrainConfig(**vars(args))


def main(argv: Optional[Sequence[str]] = None) -> int:
    # The trainer's own INFO lines; only warnings from TensorFlow and absl.
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger("trainer").setLevel(logging.INFO)
    try:
        config = parse_args(argv)
        from trainer.train import train_and_evaluate  # imports TensorFlow
        metrics = train_and_evaluate(config)
    except TrainerError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(f"test_loss={metrics['test_loss']:.4f} "
          f"test_accuracy={metrics['test_accuracy']:.4f} "
          f"test_examples={metrics['test_examples']} "
          f"train_examples={metrics['train_examples']} "
          f"train_steps={metrics['train_steps']} "
          f"({metrics['loop']} loop, {metrics['strategy']}, "
          f"{metrics['replicas']} replica(s))")
    return 0


if __name__ == "__main__":
    sys.exit(main())
