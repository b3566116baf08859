"""The trainer's configuration: one frozen dataclass, validated on creation.

The command line (`trainer.__main__`) only fills this in; everything else
takes a `TrainConfig`, so a notebook or a test can drive the trainer
without argv.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Optional

LOOPS = ("keras", "custom")
STRATEGIES = ("auto", "tpu", "mirrored", "multi_worker", "default")
MODELS = ("guide", "small", "convnet")
LR_SCHEDULES = ("constant", "cosine")
PRECISIONS = ("none", "bfloat16")


class TrainerError(Exception):
    """An expected failure (bad input, missing file, no TPU...).

    The message is one line that names the file or setting at fault; the
    command line prints it without a traceback.
    """


def summarize_error(error: BaseException, limit: int = 160) -> str:
    """The gist of a (TensorFlow) exception, fit for one line.

    Drops TF's ``{{function_node ...}}`` prefixes and ``[Op:...]`` suffixes
    and keeps the first sentence of the first line.
    """
    text = getattr(error, "message", None) or str(error) or type(error).__name__
    line = text.strip().splitlines()[0] if text.strip() else type(error).__name__
    line = re.sub(r"\{\{[^}]*\}\}\s*", "", line)
    line = re.sub(r"\s*\[Op:.*$", "", line).strip()
    line = line.split(". ")[0]
    return line[:limit] or type(error).__name__


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    data: str
    model_dir: str
    loop: str = "keras"
    model: str = "small"
    # Random rotations/zooms/shifts while training (trainer.augment).
    augment: bool = False
    epochs: int = 3
    global_batch_size: int = 128
    # None: as many steps as the train split fills with whole global batches.
    steps_per_epoch: Optional[int] = None
    steps_per_execution: int = 50
    learning_rate: float = 1e-3
    lr_schedule: str = "constant"  # or "cosine": decay to 0 at the last step
    warmup_steps: int = 0  # linear warmup from 0 to learning_rate
    strategy: str = "auto"
    tpu: Optional[str] = None  # 'local' on a TPU VM, else the TPU's name
    cpu_replicas: int = 0  # >0: split the CPU into this many logical devices
    mixed_precision: str = "none"
    jit_compile: bool = False
    cache: bool = False
    shuffle_buffer: int = 10_000
    # Seeds the weights and the input order (a deterministic stream that a
    # resumed run continues); None: random.
    seed: Optional[int] = None
    # Also checkpoint every N steps within an epoch (0: at epoch ends only).
    checkpoint_every: int = 0
    log_every: int = 100  # custom loop: a progress line at least this often
    keep_checkpoints: int = 3
    verbose: int = 1  # Keras progress bar: 0 silent, 1 bar, 2 one line/epoch

    def __post_init__(self):
        def check(ok: bool, what: str):
            if not ok:
                raise TrainerError(what)

        check(bool(self.data), "--data is required")
        check(bool(self.model_dir), "--model_dir is required")
        check(self.loop in LOOPS, f"--loop must be one of {LOOPS}, not {self.loop!r}")
        check(self.model in MODELS, f"--model must be one of {MODELS}, not {self.model!r}")
        check(self.strategy in STRATEGIES,
              f"--strategy must be one of {STRATEGIES}, not {self.strategy!r}")
        check(self.mixed_precision in PRECISIONS,
              f"--mixed_precision must be one of {PRECISIONS}, not {self.mixed_precision!r}")
        check(self.lr_schedule in LR_SCHEDULES,
              f"--lr_schedule must be one of {LR_SCHEDULES}, not {self.lr_schedule!r}")
        check(self.warmup_steps >= 0, f"--warmup_steps must be >= 0, not {self.warmup_steps}")
        check(self.epochs >= 1, f"--epochs must be >= 1, not {self.epochs}")
        check(self.global_batch_size >= 1,
              f"--global_batch_size must be >= 1, not {self.global_batch_size}")
        check(self.steps_per_epoch is None or self.steps_per_epoch >= 1,
              f"--steps_per_epoch must be >= 1, not {self.steps_per_epoch}")
        check(self.steps_per_execution >= 1,
              f"--steps_per_execution must be >= 1, not {self.steps_per_execution}")
        check(self.cpu_replicas >= 0, f"--cpu_replicas must be >= 0, not {self.cpu_replicas}")
        check(self.shuffle_buffer >= 1, f"--shuffle_buffer must be >= 1, not {self.shuffle_buffer}")
        check(self.checkpoint_every >= 0,
              f"--checkpoint_every must be >= 0, not {self.checkpoint_every}")
        check(self.log_every >= 1, f"--log_every must be >= 1, not {self.log_every}")
        check(self.tpu is None or self.tpu.strip() != "", "--tpu must not be empty")
        # XLA compiles for one CPU device; logical CPU replicas' variables sit
        # on the others ("Trying to access resource ... located in device CPU:1").
        check(not (self.jit_compile and self.cpu_replicas > 1),
              "--jit_compile does not work with --cpu_replicas > 1 "
              "(XLA sees one CPU device)")
        check(self.cpu_replicas == 0 or self.strategy in ("auto", "mirrored"),
              "--cpu_replicas works with --strategy=auto or mirrored, "
              f"not {self.strategy!r}")
