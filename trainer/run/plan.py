"""The run's numbers, derived once from the flags, the strategy's answers
(`trainer.strategy.Distribution`) and the train split.

`plan_run` (called by `trainer.run.preflight`) checks the batch against the
replicas, XLA if asked for, and the run's length against ``--profile_steps``,
and computes each derived value once, into a `Plan`; the parts of the
trainer take the few values they use from it. `ModelSpec`, `StepSettings`
and `trainer.data.input_pipeline.InputSettings` are the flags the model, the
custom loop's train step and the input pipelines are built from
(`settings_of`).
"""

from __future__ import annotations

import dataclasses

from trainer.config import TrainConfig
from trainer.data.splits import SplitFiles
from trainer.errors import TrainerError, TrainerInputError
from trainer.strategy import Distribution


@dataclasses.dataclass(frozen=True)
class Plan:
    """The run's shape and boundaries, in examples and global steps."""

    replicas: int
    global_batch_size: int
    per_replica_batch: int
    epochs: int
    steps_per_epoch: int
    total_steps: int
    warmup_steps: int
    ghost_batch_size: int  # batch normalization's group in training (0: the whole batch)
    steps_per_execution: int
    log_every: int
    checkpoint_every: int

    @classmethod
    def of(cls, config: TrainConfig, replicas: int, steps_per_epoch: int) -> "Plan":
        """The numbers of ``config`` on ``replicas`` replicas at ``steps_per_epoch``
        (`plan_run` checks them first)."""
        per_replica = config.global_batch_size // replicas
        total = config.epochs * steps_per_epoch
        return cls(replicas=replicas, global_batch_size=config.global_batch_size,
                   per_replica_batch=per_replica, epochs=config.epochs,
                   steps_per_epoch=steps_per_epoch, total_steps=total,
                   warmup_steps=warmup_steps(config, total),
                   ghost_batch_size=ghost_batch_size(config.bn_virtual_batch_size,
                                                     per_replica),
                   steps_per_execution=config.steps_per_execution,
                   log_every=config.log_every, checkpoint_every=config.checkpoint_every)

    def epoch(self, step: int) -> int:
        """The (1-based) epoch ``step`` ends or lies in."""
        return -(-step // self.steps_per_epoch)


@dataclasses.dataclass(frozen=True)
class ModelSpec:
    """The flags the model and its optimizer are built from (`trainer.model.models.build`)."""

    model: str
    augment: bool
    dropout: float
    label_smoothing: float
    optimizer: str
    learning_rate: float
    lr_schedule: str
    warmup_epochs: float  # named in the warning of a warmup longer than the run
    weight_decay: float
    steps_per_execution: int
    jit_compile: bool


@dataclasses.dataclass(frozen=True)
class StepSettings:
    """What the custom loop's train step uses (`trainer.loop.custom_loop.CustomLoop`)."""

    global_batch_size: int
    steps_per_execution: int
    label_smoothing: float
    jit_compile: bool


def settings_of(cls: type, config: TrainConfig):
    """A `ModelSpec`, `StepSettings` or `InputSettings` with ``config``'s values
    of its fields."""
    return cls(**{f.name: getattr(config, f.name) for f in dataclasses.fields(cls)})


def plan_run(config: TrainConfig, distribution: Distribution,
             train_files: SplitFiles) -> Plan:
    """The `Plan` of ``config`` on the ``distribution``'s replicas over
    ``train_files``; a `TrainerError` if the batch does not divide among them,
    XLA is asked for and missing, or the run is too short."""
    replicas = distribution.replicas
    check_replicas(config, replicas)
    if distribution.no_xla:
        raise TrainerError(distribution.no_xla)
    plan = Plan.of(config, replicas, steps_per_epoch(train_files, config))
    check_total_steps(config, plan.total_steps)
    return plan


def steps_per_epoch(split: SplitFiles, config: TrainConfig) -> int:
    """``--steps_per_epoch``, or as many whole global batches as the split fills."""
    steps = config.steps_per_epoch or split.num_examples // config.global_batch_size
    if steps < 1:
        raise TrainerInputError(
            f"{config.data}: the {split.name} split has {split.num_examples} examples, "
            f"fewer than one global batch of {config.global_batch_size}")
    return steps


def check_replicas(config: TrainConfig, replicas: int) -> None:
    """A `TrainerInputError` (a bad flag: exit 2) unless the batch, and each
    replica's batch into ghost batches, divide whole."""
    if config.global_batch_size % replicas:
        raise TrainerInputError(f"--global_batch_size={config.global_batch_size} does not "
                           f"divide into {replicas} replicas")
    per_replica = config.global_batch_size // replicas
    ghost = ghost_batch_size(config.bn_virtual_batch_size, per_replica)
    if ghost and per_replica % ghost:
        raise TrainerInputError(
            f"--bn_virtual_batch_size={config.bn_virtual_batch_size} does not divide "
            f"the per-replica batch of {per_replica} (--global_batch_size="
            f"{config.global_batch_size} over {replicas} replicas)")


def ghost_batch_size(bn_virtual_batch_size: int, per_replica: int) -> int:
    """Batch normalization's group in training: ``--bn_virtual_batch_size``,
    or 0 (the whole per-replica batch) when that batch is no larger, as on
    a Pod slice where many replicas share the global batch."""
    return bn_virtual_batch_size if bn_virtual_batch_size < per_replica else 0


def check_total_steps(config: TrainConfig, total_steps: int) -> None:
    """The check that needs the run's length: ``--profile_steps`` inside it
    (else a `TrainerInputError`: a bad flag, exit 2)."""
    if config.profile_steps is not None and config.profile_steps[1] > total_steps:
        start, end = config.profile_steps
        raise TrainerInputError(f"--profile_steps={start},{end} ends after the run's "
                           f"{total_steps} steps ({config.epochs} epoch(s)); profile "
                           f"steps within 1..{total_steps}")


def warmup_steps(config: TrainConfig, total_steps: int) -> int:
    """The warmup in steps: ``--warmup_steps``, or ``--warmup_epochs`` as the
    same share of the run on any data size (`trainer.model.models.build`
    warns when it is longer than the run)."""
    if config.warmup_epochs:
        return max(1, round(config.warmup_epochs * total_steps / config.epochs))
    return config.warmup_steps
