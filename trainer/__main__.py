"""``python -m trainer --data=DIR_OR_GS_URI --model_dir=DIR_OR_GS_URI [...]``.

A thin entry point: flags → `TrainConfig` (`trainer.config.parse_flags`,
whose default ``--preset=auto`` is settled once TensorFlow has started
quietly), `trainer.train.train_and_evaluate`, one line of final metrics. Expected
failures (`TrainerError`) end with one line on stderr and exit status 1,
no traceback. A stop on SIGTERM or SIGINT (`trainer.run.preemption`) ends with
one line and exit status 143 or 130; so does Ctrl-C outside training.

TensorFlow's C++ start-up lines are hidden (`trainer.quiet`); the level
``TF_CPP_MIN_LOG_LEVEL`` (default 2, errors only) decides what TensorFlow
logs after that. The default must be set before TensorFlow is imported,
hence here, first.
"""

from __future__ import annotations

import os

from trainer import quiet

quiet.default_log_level()

import logging  # noqa: E402
import signal  # noqa: E402
import sys  # noqa: E402
from typing import Optional, Sequence  # noqa: E402

import trainer  # noqa: E402,F401  (sets TF_USE_LEGACY_KERAS before TF loads)
from trainer.config import TrainConfig, parse_flags, strategy_is_tpu  # noqa: E402
from trainer.errors import TrainerError  # noqa: E402
from trainer.run.preemption import EXIT_STATUS, Stopped  # noqa: E402


def _quiet_tensorflow_start(config: TrainConfig) -> None:
    """Imports TensorFlow (and, for a local run, finds its devices) with fd 2 muted.

    Finding the devices starts TensorFlow's runtime, after which a CPU split
    (``--cpu_replicas``, made here first), a multi-worker strategy or a TPU
    connection can no longer be set up; so runs that may need one of those
    only import TensorFlow here.
    """
    if "tensorflow" in sys.modules:
        return
    local = config.strategy in ("mirrored", "default") or (
        config.strategy == "auto" and not config.tpu and not os.environ.get("TPU_NAME")
        and not os.environ.get("TF_CONFIG"))
    with quiet.muted_stderr():
        import tensorflow as tf
        from trainer import strategy as strategy_lib
        if config.cpu_replicas:
            strategy_lib.split_cpu(config.cpu_replicas)
        elif local and not strategy_lib.tpu_hinted(None):
            tf.config.list_physical_devices()


def _on_tpu(flags: TrainConfig) -> bool:
    """`trainer.config.strategy_is_tpu`, with TensorFlow started quietly first."""
    _quiet_tensorflow_start(flags)
    return strategy_is_tpu(flags)


def main(argv: Optional[Sequence[str]] = None) -> int:
    # The trainer's own INFO lines; only warnings from TensorFlow and absl.
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger("trainer").setLevel(logging.INFO)
    try:
        config = parse_flags(argv, on_tpu=_on_tpu)
        _quiet_tensorflow_start(config)
        from trainer.train import train_and_evaluate  # imports TensorFlow
        metrics = train_and_evaluate(config)
    except TrainerError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    except Stopped as e:
        print(e, file=sys.stderr)
        return e.exit_status
    except KeyboardInterrupt:  # Ctrl-C before or after the steps: nothing to save
        print("interrupted (SIGINT) outside the training steps; a rerun resumes from "
              "the last checkpoint, if any", file=sys.stderr)
        return EXIT_STATUS[signal.SIGINT]
    print(f"test_loss={metrics['test_loss']:.4f} "
          f"test_accuracy={metrics['test_accuracy']:.4f} "
          f"test_examples={metrics['test_examples']} "
          f"train_examples={metrics['train_examples']} "
          f"train_steps={metrics['train_steps']} "
          f"preset={metrics['preset']} "
          f"({metrics['loop']} loop, {metrics['strategy']}, "
          f"{metrics['replicas']} replica(s))")
    return 0


if __name__ == "__main__":
    sys.exit(main())
