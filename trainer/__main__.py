"""``python -m trainer --data=DIR_OR_GS_URI --model_dir=DIR_OR_GS_URI [...]``.

A thin entry point: flags → `TrainConfig` (`trainer.config.parse_flags`,
whose default ``--preset=auto`` is settled once TensorFlow has started
quietly), `trainer.train.train_and_evaluate`, one line of final metrics. Expected
failures (`TrainerError`) end with one line on stderr, no traceback, and the
exit status of the table in docs/README.md, "Exit status"
(`mnist_common.console`): a flag that `trainer.config` refuses is a bad flag
(2). A local ``--model_dir`` and ``--data`` are checked before TensorFlow is
imported (`trainer.path_checks`); a Python without TensorFlow gets one line
naming it, exit 1. A stop on SIGTERM, SIGINT or
SIGHUP (`trainer.run.preemption`, on `mnist_common.stop`), during training or outside it, ends with
one line and exit status 128 + the signal's number; the line says how to
resume: rerun the same command, or the command ``TRAINER_RESUME_COMMAND``
names (a wrapper's, e.g. ``RESUME=1 bash scripts/run_local.sh``).

TensorFlow's C++ start-up lines are dropped (`mnist_common.console`); the
level ``TF_CPP_MIN_LOG_LEVEL`` (default 2, errors only) decides what
TensorFlow logs after that. The default must be set before TensorFlow is
imported, hence here, first.
"""

from __future__ import annotations

import os

from mnist_common import console

console.set_tensorflow_log_level()
console.use_tf_keras()

import logging  # noqa: E402
import sys  # noqa: E402
from typing import NoReturn, Optional, Sequence  # noqa: E402

from trainer import path_checks  # noqa: E402
from trainer.config import TrainConfig, parse_flags, strategy_is_tpu  # noqa: E402
from trainer.errors import TrainerError, TrainerInputError  # noqa: E402
from mnist_common.stop import Stopped  # noqa: E402
from trainer.run import preemption  # noqa: E402
from trainer.run.preemption import ProcessSignals  # noqa: E402


class _StartFailed(Exception):
    """A `TrainerError` of starting TensorFlow or reaching a TPU while the
    flags are parsed (`_on_tpu`), carried out of `parse_flags`: not a bad flag."""


def _quiet_tensorflow_start(config: TrainConfig) -> None:
    """Imports TensorFlow (and, for a local run, finds its devices), start-up lines dropped.

    Listing the physical devices (where TensorFlow logs ``cuInit`` on a
    machine without a GPU) leaves a CPU split (``--cpu_replicas``, made here
    first) and a multi-worker strategy possible; a TPU connection is not, so
    runs that may need one only import TensorFlow here.
    """
    if "tensorflow" in sys.modules:
        return
    local = config.strategy in ("mirrored", "default", "multi_worker") or (
        config.strategy == "auto" and not config.tpu and not os.environ.get("TPU_NAME"))
    with console.tensorflow_start():
        import tensorflow as tf
        from trainer import strategy as strategy_lib
        if config.cpu_replicas:
            strategy_lib.split_cpu(config.cpu_replicas)
        elif local and not strategy_lib.tpu_hinted(None):
            tf.config.list_physical_devices()


def _on_tpu(flags: TrainConfig) -> bool:
    """`trainer.config.strategy_is_tpu`, with TensorFlow started quietly first
    (after a look at a local ``--data``, which needs no TensorFlow)."""
    try:
        path_checks.check_run_paths(flags.model_dir, flags.data)
        _quiet_tensorflow_start(flags)
        return strategy_is_tpu(flags)
    except TrainerError as e:
        raise _StartFailed(e) from None


def _parse_flags(argv: Optional[Sequence[str]]) -> TrainConfig:
    """`trainer.config.parse_flags`; what it refuses is a `TrainerInputError`."""
    try:
        return parse_flags(argv, on_tpu=_on_tpu)
    except _StartFailed as e:
        raise e.args[0] from None
    except TrainerError as e:
        raise TrainerInputError(str(e)) from None


def _end_process(status: int) -> NoReturn:
    """Ends the process of a run that stopped (a signal, or an error once
    training began) without unwinding further.

    By now the summaries are flushed, the ``model_dir`` lock is released
    (`trainer.train`) and a stop has saved its checkpoint. What unwinding would
    still do is free the interrupted loop's input iterators, and TensorFlow's
    teardown of each waits for tf.data's autotuning thread to wake (checked
    against TF 2.21.0; the wait measured is in docs/trainer.md, "Preemption:
    SIGTERM, Ctrl-C and SIGHUP"), and a preempted VM may be gone before that.
    """
    sys.stdout.flush()
    sys.stderr.flush()
    logging.shutdown()
    os._exit(status)


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Runs the command and returns its exit status.

    With ``argv=None`` (the process's own arguments: ``python -m trainer``,
    ``mnist-trainer``) it owns the process: a run that stopped once training
    began ends the process after its line (`_end_process`). Given ``argv``
    (a caller in the same process) it always returns.
    """
    owns_process = argv is None
    # The trainer's own INFO lines; only warnings from TensorFlow and absl.
    console.configure_logging(logging.WARNING)
    logging.getLogger("trainer").setLevel(logging.INFO)
    with ProcessSignals():  # a signal outside the training steps: one line, 128 + N
        try:
            preemption.resume_with(preemption.resume_command(os.environ))
            config = _parse_flags(argv)
            path_checks.check_run_paths(config.model_dir, config.data)  # before TensorFlow
            _quiet_tensorflow_start(config)
            from trainer.train import train_and_evaluate  # imports TensorFlow
            metrics = train_and_evaluate(config)
        except TrainerError as e:
            print(f"error: {e}", file=sys.stderr)
            if owns_process and e.after_training_began:
                _end_process(e.exit_status)
            return e.exit_status
        except ModuleNotFoundError as e:  # a Python without the trainer's packages
            print(console.missing_package(e, "trainer"), file=sys.stderr)
            return console.FAILURE
        except Stopped as e:
            print(e, file=sys.stderr)
            if owns_process:
                _end_process(e.exit_status)
            return e.exit_status
    print(f"test_loss={metrics['test_loss']:.4f} "
          f"test_accuracy={metrics['test_accuracy']:.4f} "
          f"test_examples={metrics['test_examples']} "
          f"train_examples={metrics['train_examples']} "
          f"train_steps={metrics['train_steps']} "
          f"preset={metrics['preset']} "
          f"({metrics['loop']} loop, {metrics['strategy']}, "
          f"{metrics['replicas']} replica(s))")
    return console.OK


if __name__ == "__main__":
    sys.exit(main())
