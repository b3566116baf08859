"""The trainer's configuration: one frozen dataclass, its flags, its presets.

`TrainConfig` is where settings start: the command line fills one in
(`parse_flags`); `trainer.run.preflight` derives the run's numbers from it
once (`trainer.run.plan`), and each part of the trainer takes the values it uses.
Each field's help text sits in its metadata, and the flags are generated
from the fields (type, default, choices, help), so ``python -m trainer
--help`` cannot drift from the code. All checks that need no TensorFlow
run once, in ``__post_init__``; the one that needs the strategy (batch
divisible by replicas) is `trainer.run.plan.check_replicas`.

Presets are named sets of field values applied before explicit flags
(`PRESETS`); the default, ``auto``, picks ``tpu`` when the strategy is a TPU
and ``cpu`` otherwise (`resolve_preset`). No preset sets the strategy's own
fields, so the strategy is settled from the flags first. This module imports
neither TensorFlow nor Keras, so ``--help`` and bad flags answer at once;
settling ``auto`` (`from_preset`) may import TensorFlow and connect to a TPU.
"""

from __future__ import annotations

import argparse
import dataclasses
import typing
from typing import Any, Callable, Mapping, Optional, Sequence

from mnist_common import storage_lock
from mnist_common.flags import EnvironmentValueError, OneLineParser, number
from trainer.errors import TrainerError

# The names of the models, optimizers, learning-rate schedules and precisions:
# flag choices here, built by `trainer.model` (which imports them from here:
# this module needs no TensorFlow, so ``--help`` lists them without loading it).
MODELS = ("guide", "small", "convnet", "convnet_bn")
BATCH_NORM_MODELS = ("convnet_bn",)
OPTIMIZERS = ("adam", "lamb", "lars")
SCHEDULES = ("constant", "cosine")
PRECISIONS = ("none", "bfloat16")

# The numeric fields' types (`mnist_common.flags.Number`): finite, in range.
# Counts stop at 2**31 - 1, which TensorFlow's integer tensors hold; a seed
# is numpy's too (``np.random.seed``: 0 <= seed < 2**32).
COUNT = number(int, min=1, max=2**31 - 1)
COUNT_OR_0 = number(int, min=0, max=2**31 - 1)
POSITIVE = number(float, min=0, min_inclusive=False)
AT_LEAST_0 = number(float, min=0)
RATE = number(float, min=0, max=1, max_inclusive=False)
SEEDS = number(int, min=0, max=2**32 - 1)

LOOPS = ("keras", "custom")
STRATEGIES = ("auto", "tpu", "mirrored", "multi_worker", "default")


def _field(default: Any, help: str, **meta) -> Any:
    return dataclasses.field(default=default, metadata={"help": help, **meta})


def parse_step_range(text: str) -> tuple[int, int]:
    """``"START,END"`` → ``(START, END)`` (global steps, 1 <= START < END)."""
    parts = text.split(",")
    try:
        start, end = (int(p) for p in parts)
    except ValueError:
        raise ValueError(f"expected START,END (two integers), not {text!r}") from None
    return start, end


def _require(ok: bool, what: str) -> None:
    if not ok:
        raise TrainerError(what)


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    data: str = _field("", "pipeline output directory (manifest.json + shards), "
                           "local or gs://", required=True)
    model_dir: str = _field("", "where checkpoints, TensorBoard logs, the export "
                                "and metrics.json go", required=True)
    loop: str = _field("keras", "keras: Model.fit; custom: a hand-written loop",
                       choices=LOOPS)
    model: str = _field("small", "guide: the TPU guide's CNN; small: a narrow one "
                                 "for tests; convnet: the CPU recipe (with --augment, "
                                 "--lr_schedule=cosine)", choices=MODELS)
    augment: bool = _field(False, "random rotations, zooms and shifts while training "
                                  "(inactive at inference)")
    epochs: int = _field(3, "passes over steps_per_epoch steps", number=COUNT)
    global_batch_size: int = _field(128, "examples per step, split evenly "
                                         "between replicas", number=COUNT)
    steps_per_epoch: Optional[int] = _field(
        None, "optimizer steps per epoch", shown="train examples // global batch size",
        number=COUNT)
    steps_per_execution: int = _field(50, "training steps per tf.function call "
                                          "(both loops; 1: one step per call)", number=COUNT)
    optimizer: str = _field("adam", "adam; or for large batches lamb (Adam's step) or "
                                    "lars (momentum SGD's), scaled per weight matrix "
                                    "to a share of its norm",
                            choices=OPTIMIZERS)
    learning_rate: float = _field(1e-3, "the optimizer's (peak) learning rate", number=POSITIVE)
    lr_schedule: str = _field("constant", "learning rate after warm-up: constant "
                                          "or cosine decay to 0", choices=SCHEDULES)
    warmup_steps: int = _field(0, "linear warm-up from 0 over this many steps", number=COUNT_OR_0)
    warmup_epochs: float = _field(0.0, "linear warm-up from 0 over this many epochs "
                                       "(instead of --warmup_steps)", number=AT_LEAST_0)
    weight_decay: float = _field(0.0, "weight decay of the kernels (AdamW's, decoupled; "
                                      "LAMB's and LARS's lambda): 0 is none", number=AT_LEAST_0)
    dropout: float = _field(0.4, "rate of the two dropout layers of convnet and "
                                 "convnet_bn (the other models have none)", number=RATE)
    label_smoothing: float = _field(0.0, "training targets: 1 - S on the label plus S/10 "
                                         "on every class (0: one-hot)", number=RATE)
    bn_recalibration_examples: int = _field(
        0, "after the last step, recompute batch normalization's statistics over "
           "the first N train examples, unaugmented (0: keep the running averages)",
        number=COUNT_OR_0)
    bn_virtual_batch_size: int = _field(
        0, "batch normalization in training normalizes over groups of N examples of "
           "each replica's batch (ghost batch norm; 0, or N at least the per-replica "
           "batch: the whole per-replica batch)", number=COUNT_OR_0)
    strategy: str = _field("auto", "auto: a TPU if there are signs of one, else "
                                   "GPUs, else TF_CONFIG workers, else default",
                           choices=STRATEGIES)
    tpu: Optional[str] = _field(None, "'local' on a TPU VM, else the TPU's name",
                                shown="$TPU_NAME, else local")
    cpu_replicas: int = _field(0, "split the CPU into N logical devices "
                                  "(MirroredStrategy); 0: off", number=COUNT_OR_0)
    cluster_timeout: float = _field(180.0, "seconds every TF_CONFIG task has to answer "
                                           "at start, after which the run ends naming "
                                           "those that did not", number=POSITIVE)
    mixed_precision: str = _field("none", "bfloat16: mixed_bfloat16 policy, "
                                          "logits kept float32", choices=PRECISIONS)
    jit_compile: bool = _field(False, "XLA-compile the train step")
    cache: bool = _field(False, "train split: each host's share decoded once and held "
                                "in memory when it fits the memory bound (else read "
                                "from the files), each epoch a full permutation; test "
                                "split: its batches kept after the first pass")
    shuffle_buffer: int = _field(10_000, "records (reading from the files; the "
                                         "in-memory train split shuffles whole epochs)",
                                 number=COUNT)
    seed: Optional[int] = _field(None, "seed the weights and the input order; a "
                                       "resumed run continues the same stream", number=SEEDS)
    checkpoint_every: int = _field(0, "also checkpoint every N steps within an "
                                      "epoch (0: epoch ends only)", number=COUNT_OR_0)
    keep_checkpoints: int = _field(3, "checkpoints kept in model_dir/checkpoints", number=COUNT)
    log_every: int = _field(100, "a progress line and train summaries every N "
                                 "steps (rounded up to whole executions)", number=COUNT)
    verbose: int = _field(1, "Keras progress: 0 silent, 1 bar, 2 a line per epoch",
                          choices=(0, 1, 2), number=number(int, min=0, max=2))

    profile_steps: Optional[tuple[int, int]] = _field(
        None, "START,END: TensorBoard profile of these global steps "
              "(model_dir/logs/plugins/profile)", parse=parse_step_range)
    verify_checksums: bool = _field(False, "check each shard's sha256 against "
                                           "manifest.json before training (each "
                                           "input pipeline its own files)")
    allow_new_dataset: bool = _field(False, "resume on another dataset than the one "
                                            "model_dir/dataset.json records")
    restart: bool = _field(False, "train from step 0, deleting model_dir's "
                                  "checkpoints (else a run resumes, and stops if none "
                                  "restores)")
    preset: Optional[str] = _field(None, "the preset the values started from "
                                         "(recorded in metrics.json)", flag=False)

    def __post_init__(self):
        check = _require
        check(bool(self.data), "--data is required")
        check(bool(self.model_dir), "--model_dir is required")
        for f in dataclasses.fields(self):
            choices = f.metadata.get("choices")
            value = getattr(self, f.name)
            check(choices is None or value in choices,
                  f"--{f.name} must be one of {', '.join(map(str, choices or ()))}, "
                  f"not {value!r}")
        check(0 < self.cluster_timeout < float("inf"),
              f"--cluster_timeout must be a positive number, not {self.cluster_timeout}")
        check(self.learning_rate > 0 and self.learning_rate < float("inf"),
              f"--learning_rate must be a positive number, not {self.learning_rate}")
        self._check_ranges()
        check(not (self.warmup_steps and self.warmup_epochs),
              "--warmup_steps and --warmup_epochs: give one of them")
        check(self.tpu is None or self.tpu.strip() != "", "--tpu must not be empty")
        check(not self.bn_virtual_batch_size or self.model in BATCH_NORM_MODELS,
              f"--bn_virtual_batch_size: --model={self.model} has no batch "
              f"normalization (models with it: {', '.join(BATCH_NORM_MODELS)})")
        check(self.preset is None or self.preset in PRESETS,
              f"preset must be one of {', '.join(PRESETS)}, not {self.preset!r}")
        if self.profile_steps is not None:
            start, end = self.profile_steps
            check(1 <= start < end, "--profile_steps must be START,END with "
                                    f"1 <= START < END, not {start},{end}")
        # XLA compiles for one CPU device; logical CPU replicas' variables sit
        # on the others ("Trying to access resource ... located in device CPU:1").
        check(not (self.jit_compile and self.cpu_replicas > 1),
              "--jit_compile does not work with --cpu_replicas > 1 "
              "(XLA sees one CPU device)")
        check(self.cpu_replicas == 0 or self.strategy in ("auto", "mirrored"),
              "--cpu_replicas works with --strategy=auto or mirrored, "
              f"not {self.strategy!r}")

    def _check_ranges(self) -> None:
        """Each numeric field within its `Number` (finite, in range): the
        flags' own type, so a config built in code is held to it too."""
        for f in dataclasses.fields(self):
            spec, value = f.metadata.get("number"), getattr(self, f.name)
            _require(spec is None or value is None or spec.accepts(value),
                     f"--{f.name} must be {spec and spec.bound_text(value)}, not {value}")


# Field values a preset sets; explicit flags (or keyword arguments) win.
# "smoke" is the field defaults: the small model for 3 epochs, for tests.
# "cpu" is the demo's recipe (about 0.98 on the 1,000 sample test digits; the
# warmup is one epoch of 4,000 digits, ~4,000 examples); its model, convnet_bn,
# was chosen on a validation split of all of MNIST
# (docs/history/benchmarks-2026-12.md).
# "tpu" is the cpu recipe as it is (its batch, its schedule per example) in
# bfloat16 with 50 steps per call: on a validation split of MNIST no larger-
# batch candidate reached the cpu preset's mean over the same 3 seeds
# (docs/trainer.md, "The tpu preset"; docs/benchmarks.md, "The tpu preset's
# search"). Its cache holds each host's share of the train split decoded (800
# bytes an example: 48 MB for 60,000 digits) and the test split's padded
# batches as float32 images (~3.2 KB an example: 32 MB for 10,000), well
# under 1% of any TPU VM host's memory.
# Both recompute batch normalization's statistics after the last step over
# 10,000 train examples (on a validation split 25,600 did no better than 6,400;
# docs/benchmarks.md, "Batch-norm recalibration").
# "guide" is the "Use TPUs" guide's own model and settings.
_CPU_RECIPE: Mapping[str, Any] = {
    "model": "convnet_bn", "augment": True, "learning_rate": 2e-3, "lr_schedule": "cosine",
    "warmup_steps": 31, "epochs": 20, "global_batch_size": 128,
    "bn_recalibration_examples": 10_000}
PRESETS: Mapping[str, Mapping[str, Any]] = {
    "smoke": {},
    "cpu": _CPU_RECIPE,
    "tpu": {**_CPU_RECIPE, "mixed_precision": "bfloat16", "steps_per_execution": 50,
            "cache": True},
    "guide": {"model": "guide", "global_batch_size": 1024,
              "mixed_precision": "bfloat16", "steps_per_execution": 50},
}
AUTO_PRESET = "auto"
PRESET_CHOICES = (AUTO_PRESET, *PRESETS)
DEFAULT_PRESET = AUTO_PRESET


def resolve_preset(preset: str, on_tpu: bool) -> str:
    """The preset ``preset`` names once the strategy is known: ``auto`` is
    ``tpu`` on a TPU and ``cpu`` elsewhere; the others name themselves."""
    if preset != AUTO_PRESET:
        return preset
    return "tpu" if on_tpu else "cpu"


def strategy_is_tpu(flags: TrainConfig) -> bool:
    """Whether the strategy ``flags`` ask for is a TPU (imports TensorFlow)."""
    from trainer import strategy
    return strategy.resolves_to_tpu(flags.strategy, flags.tpu, flags.cpu_replicas)


def from_preset(preset: str = DEFAULT_PRESET, *,
                on_tpu: Callable[[TrainConfig], bool] = strategy_is_tpu,
                **values: Any) -> TrainConfig:
    """A config from a preset's values, overridden by ``values``.

    For ``auto``, ``on_tpu`` answers for ``values`` over the ``cpu`` preset,
    the answer off a TPU (their strategy fields are the run's: no preset sets
    them), so bad values are refused before a TPU is probed; a flag that
    needs a preset's field (``--bn_virtual_batch_size`` needs
    ``convnet_bn``) is checked against a preset, not the bare defaults.
    """
    if preset not in PRESET_CHOICES:
        raise TrainerError(f"--preset must be one of {', '.join(PRESET_CHOICES)}, "
                           f"not {preset!r}")
    if preset == AUTO_PRESET:
        off_tpu = TrainConfig(**{**_preset_values("cpu", values), **values})
        preset = resolve_preset(preset, on_tpu(off_tpu))
    return TrainConfig(**{**_preset_values(preset, values), **values, "preset": preset})


def _preset_values(preset: str, values: Mapping[str, Any]) -> dict[str, Any]:
    """The preset's values that ``values`` leave to it: an explicit warmup,
    in steps or in epochs, replaces the preset's in either unit."""
    kept = dict(PRESETS[preset])
    if "warmup_steps" in values or "warmup_epochs" in values:
        kept.pop("warmup_steps", None)
        kept.pop("warmup_epochs", None)
    return kept


# -- flags ----------------------------------------------------------------------

def _bool(text: str) -> bool:
    if text.lower() in ("1", "true", "yes"):
        return True
    if text.lower() in ("0", "false", "no"):
        return False
    raise argparse.ArgumentTypeError(f"expected true/false, not {text!r}")


def _converter(f: dataclasses.Field, hint) -> Any:
    if "parse" in f.metadata:
        parse = f.metadata["parse"]

        def convert(text: str):
            try:
                return parse(text)
            except ValueError as e:
                raise argparse.ArgumentTypeError(str(e)) from None
        return convert
    if "number" in f.metadata:
        return f.metadata["number"]
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    base = args[0] if typing.get_origin(hint) is typing.Union else hint
    if base in (int, float):
        raise TypeError(f"--{f.name}: a numeric field needs its Number (number=...)")
    return {bool: _bool, str: str}[base]


def _show(value: Any) -> str:
    if value is None:
        return "none"
    if isinstance(value, tuple):
        return ",".join(map(str, value))
    return str(value).lower() if isinstance(value, bool) else str(value)


def flag_parser(parser_class: type = OneLineParser) -> argparse.ArgumentParser:
    """An argparse parser with one flag per `TrainConfig` field, plus ``--preset``.

    Unset flags stay absent from the result (``SUPPRESS``), so a preset's
    values apply unless a flag names them.
    """
    presets = "; ".join(
        f"{name}: " + (", ".join(f"{k}={_show(v)}" for k, v in values.items())
                       or "the defaults shown") for name, values in PRESETS.items())
    p = parser_class(
        prog="python -m trainer", argument_default=argparse.SUPPRESS,
        allow_abbrev=False,  # --res would be --restart, which deletes checkpoints
        description="Train an MNIST CNN on the pipeline's TFRecords "
                    "(local path or gs://), on CPU, GPUs or a TPU.",
        epilog=f"Presets: {presets}. The defaults shown are the values without a "
               "preset (smoke); the preset in force (auto: tpu on a TPU, else cpu) "
               "replaces them, and explicit flags override the preset's values. "
               "At start the trainer logs the global batch per replica and per host "
               "(on a pod: global batch / hosts).")
    p.add_argument("--preset", choices=PRESET_CHOICES, default=DEFAULT_PRESET,
                   help="named defaults applied before the flags: auto (tpu on a TPU, "
                        "else cpu), cpu (the CPU recipe), tpu (the same recipe in "
                        "bfloat16, for a TPU), guide (the TPU guide's settings), smoke (the "
                        "defaults shown; a quick run for tests) (default: auto)")
    hints = typing.get_type_hints(TrainConfig)
    for f in dataclasses.fields(TrainConfig):
        if f.metadata.get("flag", True) is False:
            continue
        kwargs: dict[str, Any] = {"type": _converter(f, hints[f.name])}
        if hints[f.name] is bool:  # --flag alone means true
            kwargs.update(nargs="?", const=True, metavar="true|false")
        if "choices" in f.metadata:
            kwargs["choices"] = f.metadata["choices"]
        if f.metadata.get("required"):
            kwargs["required"] = True
            help_text = f.metadata["help"] + " (required)"
        else:
            shown = f.metadata.get("shown") or _show(f.default)
            help_text = f"{f.metadata['help']} (default: {shown})"
        p.add_argument(f"--{f.name}", help=help_text.replace("%", "%%"), **kwargs)
    # A number out of range is refused as `TrainConfig` refuses it (exit 2).
    p.number_style, p.number_error = "{flag} must be {requirement}, not {value}", TrainerError
    return p


def parse_flags(argv: Optional[Sequence[str]] = None, *,
                on_tpu: Callable[[TrainConfig], bool] = strategy_is_tpu,
                parser_class: type = OneLineParser) -> TrainConfig:
    """Flags → `TrainConfig`: preset values first, then the flags given.

    ``on_tpu`` settles ``--preset=auto`` (see `from_preset`). The numbers
    the trainer reads from the environment (`storage_lock.check_environment`)
    are refused here too, as its flags are.
    """
    given = vars(flag_parser(parser_class).parse_args(argv))
    try:
        storage_lock.check_environment()
    except EnvironmentValueError as e:
        raise TrainerError(str(e)) from None
    preset = given.pop("preset")
    return from_preset(preset, on_tpu=on_tpu, **given)


class _UsageErrorRaised(OneLineParser):
    def usage_error(self, message: str):
        raise TrainerError(message)


def flag_problem(argv: Sequence[str], *, on_tpu: bool) -> Optional[str]:
    """What `parse_flags` refuses in ``argv``, as one line; None when it takes them.

    Prints nothing (``--help`` prints the help and exits, as the trainer
    does) and loads no TensorFlow (the standard library is enough), so a
    launcher asks before it spends anything: `scripts/run_local.sh`
    before it replaces its folders, `mnist-launch-tpu` before it
    creates a TPU VM. ``on_tpu`` settles ``--preset=auto``.
    """
    try:
        parse_flags(list(argv), on_tpu=lambda config: on_tpu, parser_class=_UsageErrorRaised)
    except TrainerError as e:
        return str(e)
    return None
