"""``mnist-launch-tpu``: create a Cloud TPU VM, install this project on it,
train, and delete it; this module parses the flags into a `TpuConfig` and
runs the steps.

Each step, ``all`` and ``run`` (a spot run through preemptions,
`launch.tpu.spot.runner`), what each one runs and exits with, the settings
and what a host installs: docs/launch.md, "TPU VM", and
docs/tpu_vm_stack.md.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path
from typing import Mapping, Sequence

from launch import errors as le
from launch import processes as lp
from launch import settings as ls
from launch import staging
from launch.tpu.spot import runner as spot_runner
from launch.tpu.cloud import Cloud, check_gcloud, compare_manifest, run_step
from launch.tpu import commands as tc
from launch.tpu.commands import PREINSTALLED, check_trainer_args, phases, plan
from launch.tpu.config import DEFAULT_LIBTPU, DEFAULT_TENSORFLOW, TpuConfig
from launch.tpu.topology import api_accelerator, default_runtime_version, is_multi_host
from mnist_common import console
from mnist_common.flags import number
from mnist_common.stop import Stopped, exit_on_signals

STEPS = ("create", "setup", "train", "wait", "delete")
# Steps that only talk to an existing VM: they need its name and zone alone.
VM_STEPS = ("wait", "status", "logs", "delete")
VERBS = STEPS + ("status", "logs", "all", "run")
PROGRAM = "mnist-launch-tpu"
# The numeric flags' types: finite, in range, refused while parsing (exit 2).
# Seconds stop at 10**9 (31 years): a sleep far longer overflows the platform's time.
MAX_SECONDS = 10**9
POSITIVE_SECONDS = number(float, min=0, min_inclusive=False, max=MAX_SECONDS,
                          words="positive")
AT_LEAST_0_SECONDS = number(float, min=0, max=MAX_SECONDS, words="0 or more")
AT_LEAST_0_INT = number(int, min=0, words="0 or more")

# The end of ``--help``: where the settings come from, what goes to the trainer.
SETTINGS_HELP = """\
Settings come from flags, else from environment variables:

    --name               TPU_NAME
    --zone               TPU_ZONE, CLOUDSDK_COMPUTE_ZONE
    --accelerator_type   TPU_ACCELERATOR_TYPE
    --runtime_version    TPU_RUNTIME_VERSION
    --project            GOOGLE_CLOUD_PROJECT, CLOUDSDK_CORE_PROJECT
                         (optional: gcloud's configured project otherwise)

Arguments the launcher does not know go to ``python -m trainer`` (e.g.
``--loop=custom --epochs=5``). ``--dry_run`` prints, one a line, exactly the
commands the step runs, in order (``wait`` repeats its one command), and
exits 0 without running anything.
"""


def _add_run_flags(common: argparse.ArgumentParser) -> None:
    """The flags of ``run`` (launch/tpu/spot/runner.py), and ``create``'s kind of VM."""
    common.add_argument("--spot", action="store_true", help="create/run: a Spot TPU VM")
    common.add_argument("--queued", action="store_true",
                        help="create/run: a queued resource, which waits for "
                             "capacity instead of failing")
    common.add_argument("--max_recoveries", type=AT_LEAST_0_INT, default=5,
                        help="run: preemptions to recover from before giving "
                             "up (exit 75)")
    common.add_argument("--keep", action="store_true",
                        help="run: keep a READY VM at the end")
    common.add_argument("--events", type=Path,
                        help="run: append each event as a JSON line to this "
                             "file, the run's journal for a restarted launcher")
    common.add_argument("--logs_dir", type=Path, default=Path("."),
                        help="run: where a failed trainer's log is copied")
    common.add_argument("--retry_seconds", type=POSITIVE_SECONDS, default=900.0,
                        help="run: give up (exit 255) after calls to the "
                             "cloud failed for this long")


def _add_vm_flags(common: argparse.ArgumentParser) -> None:
    """The VM's identity and software."""
    common.add_argument("--name", help="TPU VM name")
    common.add_argument("--zone", help="e.g. us-central2-b")
    common.add_argument("--project")
    common.add_argument("--run_id",
                        help="the VM's mark (label mnist-run): create and all "
                             "make a new one unless given; the steps that reach "
                             "an existing VM need the one it was made with")
    common.add_argument("--accelerator_type", help="e.g. v4-8, v5litepod-8")
    common.add_argument("--runtime_version",
                        help="TPU software version (default: see above)")
    common.add_argument("--tensorflow", default=None,
                        help=f"pip requirement for TPU TensorFlow, or "
                             f"'{PREINSTALLED}' (default: {DEFAULT_TENSORFLOW}"
                             f" on OS images, {PREINSTALLED} on tpu-vm-tf-*)")
    common.add_argument("--libtpu",
                        help=f"libtpu pip requirement (default with "
                             f"{DEFAULT_TENSORFLOW}: {DEFAULT_LIBTPU})")


def build_parser() -> ls.LauncherParser:
    """The launcher's parser: one sub-command per verb, each with every flag."""
    common = ls.LauncherParser(add_help=False, allow_abbrev=False)
    _add_vm_flags(common)
    common.add_argument("--data", help="gs:// folder the pipeline wrote")
    common.add_argument("--model_dir", help="gs:// folder for checkpoints")
    common.add_argument("--delete_after", action="store_true",
                        help="with `all`: delete the TPU VM at the end")
    common.add_argument("--poll_seconds", type=AT_LEAST_0_SECONDS, default=60.0,
                        help="wait/all/run: seconds between status checks")
    common.add_argument("--wait_timeout", type=POSITIVE_SECONDS, default=86400.0,
                        help="wait/all: give up (exit 124) after this many "
                             "seconds of training")
    common.add_argument("--lines", type=number(int, min=1, words="at least 1"),
                        default=100,
                        help="logs: lines to print from the end of each log")
    common.add_argument("--follow", action="store_true",
                        help="logs: keep printing until the trainer exits")
    common.add_argument("--gcloud", default="gcloud")
    common.add_argument("--python", default=sys.executable,
                        help="interpreter that builds the wheel here")
    common.add_argument("--dist_dir", type=Path,
                        help="where the wheel goes (default: the checkout's "
                             "dist/tpu_vm; installed: ~/.cache/mnist-tpu/dist/tpu_vm)")
    common.add_argument("--source_dir", type=Path,
                        help="a checkout of the project to build the wheel from "
                             "(default: the checkout this launcher is in, else the "
                             "installed distribution it is part of)")
    common.add_argument("--no_build_isolation", action="store_true")
    common.add_argument("--dry_run", action="store_true",
                        help="print the commands a run executes, and exit")
    _add_run_flags(common)
    parser = ls.LauncherParser(
        allow_abbrev=False,
        description="Cloud TPU VM launcher for the trainer. Unknown "
                    "arguments go to `python -m trainer`.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=SETTINGS_HELP)
    sub = parser.add_subparsers(dest="step", required=True)
    for step in VERBS:
        sub.add_parser(step, parents=[common], allow_abbrev=False)
    return parser


def parse_args(argv: Sequence[str]) -> tuple[argparse.Namespace, list[str]]:
    """(the launcher's flags, the trainer's); a refused number: `le.ConfigError`."""
    return build_parser().parse_known_args(list(argv))


def resolve_config(args: argparse.Namespace, trainer_args: Sequence[str],
                   environ: Mapping[str, str] | None = None) -> TpuConfig:
    """Merge flags with environment variables and validate; ConfigError.

    Steps that only talk to an existing VM need its name and zone; the
    others also the accelerator and its software, and ``train`` the gs://
    folders. Every setting is settled first, then the config is built once.
    """
    steps = STEPS if args.step in ("all", "run") else (args.step,)
    _check_step_flags(args, steps, trainer_args)
    settings = _vm_settings(args, trainer_args, environ)
    if not set(steps) <= set(VM_STEPS):
        settings.update(_software_settings(args, environ))
        if "train" in steps:
            settings.update(_train_folders(args))
        _refuse_launcher_flags(trainer_args)
    cfg = TpuConfig(**settings)
    if "train" in steps:
        check_trainer_args(cfg)
    return cfg


def _refuse_launcher_flags(trainer_args: Sequence[str]) -> None:
    for arg in trainer_args:
        if arg.split("=", 1)[0] in ("--data", "--model_dir", "--strategy",
                                    "--tpu"):
            raise le.ConfigError(f"{arg.split('=', 1)[0]} is set by this "
                                 "launcher; drop it")


def _check_step_flags(args: argparse.Namespace, steps: Sequence[str],
                      trainer_args: Sequence[str]) -> None:
    """Trainer arguments only for a step that trains (the numeric flags'
    ranges are their types', checked while parsing)."""
    if trainer_args and "train" not in steps:
        raise le.ConfigError(f"{args.step} takes no trainer arguments, got "
                             f"{shlex.join(trainer_args)}")


def _vm_settings(args: argparse.Namespace, trainer_args: Sequence[str],
                 environ: Mapping[str, str] | None) -> dict:
    """The settings every step needs: the VM's name, zone and project, and
    the launcher's own options, the project it stages among them."""
    name = ls.first_setting(args.name, ls.env("TPU_NAME", environ=environ))
    if not name:
        raise le.ConfigError("--name is required (or set TPU_NAME)")
    if not tc.VM_NAME_RE.fullmatch(name):
        raise le.ConfigError(f"--name {name!r} is not a TPU VM name: a lowercase "
                             "letter, then lowercase letters, digits or -, not "
                             "ending in -, at most 63 characters")
    zone = ls.first_setting(args.zone, ls.env(
        "TPU_ZONE", "CLOUDSDK_COMPUTE_ZONE", environ=environ))
    if not zone:
        raise le.ConfigError("--zone is required (or set TPU_ZONE)")
    source = staging.find_source(args.source_dir)
    return dict(
        name=name, zone=zone,
        project=ls.first_setting(args.project, ls.env(
            "GOOGLE_CLOUD_PROJECT", "CLOUDSDK_CORE_PROJECT", environ=environ)),
        libtpu=args.libtpu, spot=args.spot, queued=args.queued,
        max_recoveries=args.max_recoveries, keep=args.keep,
        events=args.events and args.events.resolve(),
        logs_dir=args.logs_dir.resolve(), retry_seconds=args.retry_seconds,
        trainer_args=tuple(trainer_args), delete_after=args.delete_after,
        poll_seconds=args.poll_seconds, wait_timeout=args.wait_timeout,
        lines=args.lines, follow=args.follow,
        run_id=_run_id(args), gcloud=args.gcloud, python=args.python,
        dist_dir=Path(args.dist_dir or source.dist_dir("tpu_vm")).resolve(),
        build_isolation=not args.no_build_isolation, wheel_source=source)


def _run_id(args: argparse.Namespace) -> str | None:
    """``--run_id``, a valid label value; new for ``create`` and ``all``
    (``run`` takes its journal's, else a new one: launch/tpu/spot/runner.py);
    required by a step that reaches an existing VM."""
    if args.run_id is not None and not tc.RUN_ID_RE.fullmatch(args.run_id):
        raise le.ConfigError(f"--run_id {args.run_id!r} is not a label value: "
                             "lowercase letters, digits, - and _, at most 63")
    if args.run_id is None and args.step in ("create", "all"):
        return tc.new_run_id()
    if args.run_id is None and args.step in tc.REACHES_VM:
        raise le.ConfigError(f"{args.step} needs --run_id: the id create printed, "
                             f"the VM's label {tc.MARK_KEY}")
    return args.run_id


def _software_settings(args: argparse.Namespace,
                       environ: Mapping[str, str] | None) -> dict:
    """The accelerator, its TPU software image and the TensorFlow to run on it.

    A multi-host slice needs a TensorFlow pod image and its own TensorFlow,
    which runs the TPU worker service on every host.
    """
    accelerator = ls.first_setting(args.accelerator_type, ls.env(
        "TPU_ACCELERATOR_TYPE", environ=environ))
    if not accelerator:
        raise le.ConfigError(
            "--accelerator_type is required (or set TPU_ACCELERATOR_TYPE), "
            "e.g. v4-8")
    if api_accelerator(accelerator) != accelerator:
        print(f"--accelerator_type {accelerator}: sent as {api_accelerator(accelerator)}, "
              "the TPU API's name for it", file=sys.stderr)
        accelerator = api_accelerator(accelerator)
    multi_host = is_multi_host(accelerator)
    runtime_version = (ls.first_setting(args.runtime_version, ls.env(
        "TPU_RUNTIME_VERSION", environ=environ))
        or default_runtime_version(accelerator))
    tf_image = runtime_version.startswith("tpu-vm-tf-")
    tensorflow = args.tensorflow or (PREINSTALLED if tf_image else DEFAULT_TENSORFLOW)
    if multi_host and not (tf_image and "-pod" in runtime_version):
        raise le.ConfigError(
            f"{accelerator} spans several hosts and needs a TensorFlow pod "
            f"image, not {runtime_version!r}: pass "
            "--runtime_version=tpu-vm-tf-<version>-pod-pjrt")
    if multi_host and tensorflow != PREINSTALLED:
        raise le.ConfigError(
            "on a multi-host slice keep the pod image's TensorFlow "
            f"(--tensorflow={PREINSTALLED}); it runs the TPU worker service")
    return dict(accelerator_type=accelerator, multi_host=multi_host,
                runtime_version=runtime_version, tensorflow=tensorflow)


def _train_folders(args: argparse.Namespace) -> dict:
    """``--data`` and ``--model_dir``: required, and gs:// (TPU hosts read
    and write Cloud Storage, not this machine's disk)."""
    if not (args.data or "").strip():
        raise le.ConfigError(
            "--data is required: the gs:// folder the pipeline wrote")
    data = ls.require_gs(args.data, "--data")
    if not args.model_dir:
        raise le.ConfigError(
            "--model_dir is required: a gs:// folder (TPU hosts cannot "
            "write to this machine's disk)")
    return dict(data=data, model_dir=ls.require_gs(args.model_dir, "--model_dir"))


# What --dry_run adds to the plan of ``run`` (its commands without a preemption).
RUN_PLAN_NOTE = """\
# the describe (and, while the VM is READY, the status) commands repeat every
# {cfg.poll_seconds:g} s; what run does on each state:
#   no VM: create it (the wheel built first, once; refused: again, with backoff)
#   READY, no trainer: setup, then train
#   READY, trainer running: wait
#   READY, trainer exited 0: delete (not with --keep), exit 0
#   READY, trainer exited 1, 2, ...: copy its log to {cfg.logs_dir}, delete, exit with it
#   PREEMPTED, TERMINATED, gone, or trainer exited 143: delete, wait until
#     gone, create again and resume (at most --max_recoveries={cfg.max_recoveries}; then exit 75)
#   calls failing or creates refused: retried with backoff for
#     --retry_seconds={cfg.retry_seconds:g}, then exit 255
#   a VM or queued resource of that name not labelled {mark}=RUN_ID: exit 2,
#     left as it is (RUN_ID: --events's run's, else --run_id, else new)"""

def run_spot(cfg: TpuConfig, pyproject: Mapping) -> int:
    """``run``: the journal checked (launch/tpu/spot/journal.py), gcloud's
    version, a VM of the name that is not this run's refused, the manifest
    compared with the slice once, then the spot loop
    (launch/tpu/spot/runner.py) until the run ends."""
    def make_cloud(cfg: TpuConfig) -> Cloud:
        return Cloud(cfg, pyproject, dict(phases("run", cfg, pyproject)))

    def prepare(cloud: Cloud) -> None:
        cloud.vm_state()  # `NotThisRun` before the run says or does anything
        compare_manifest(Cloud.shown(cloud.cfg, pyproject, cloud.planned))

    def check() -> None:
        check_gcloud(cfg, [cmd for _, cmds in phases("run", cfg, pyproject) for cmd in cmds])
    return spot_runner.run_spot(cfg, make_cloud, prepare, check)


def execute(step: str, cfg: TpuConfig, pyproject: Mapping) -> int:
    """Run the steps of ``phases(step)`` until one fails (``run``: `run_spot`).

    In ``all`` the final delete (``--delete_after``) runs once the VM was
    created, whatever happens after: a failure, a wait that gave up, a
    signal.
    """
    if step == "run":
        return run_spot(cfg, pyproject)
    work = phases(step, cfg, pyproject)
    check_gcloud(cfg, [cmd for _, cmds in work for cmd in cmds])
    cloud = Cloud.shown(cfg, pyproject, dict(work))
    names = [name for name, _ in work]
    # The final describe and delete of ``all --delete_after``.
    delete = names[-2:] if step == "all" and cfg.delete_after else []
    rc, created = 0, False
    try:
        for name in names[:len(names) - len(delete)]:
            rc = run_step(name, cloud)
            if rc != 0:
                break
            created = created or name == "create"
    finally:
        if delete and created:
            delete_rc = run_step(delete[0], cloud) or run_step(delete[1], cloud)
            rc = rc or delete_rc
    return rc


def main(argv: Sequence[str] | None = None) -> int:
    """Exit status: the step's (`wait`: the trainer's, 124, 255), 2 for bad
    settings, 1 when a command fails to run, 128 + N for signal N. A signal
    goes to the gcloud command that runs (`launch.processes.run_command`),
    then stops the launcher; ``all --delete_after`` deletes the VM first.
    Training on the hosts goes on. ``run`` handles signals itself
    (launch/tpu/spot/runner.py)."""
    try:
        args, rest = parse_args(sys.argv[1:] if argv is None else argv)
    except le.ConfigError as exc:
        return le.fail(str(exc), exc.code)
    signals = (exit_on_signals(PROGRAM) if args.step == "run"
               else lp.raising_on_signals())
    try:
        with signals:
            return _main(args, rest)
    except le.LaunchError as exc:
        return le.fail(str(exc), exc.code)
    except Stopped as exc:
        return le.stopped(exc, PROGRAM)


def _main(args: argparse.Namespace, rest: list[str]) -> int:
    cfg = resolve_config(args, rest)
    pyproject = cfg.wheel_source.project()
    if not args.dry_run:
        return execute(args.step, cfg, pyproject)
    if args.step in ("setup", "all", "run"):
        print(cfg.wheel_source.line(pyproject), file=sys.stderr)
    print(lp.format_commands(plan(args.step, cfg, pyproject)))
    if args.step in ("all", "wait"):
        print(f"# the status command repeats every "
              f"{cfg.poll_seconds:g} s until the trainer exits "
              f"(--wait_timeout {cfg.wait_timeout:g} s)",
              file=sys.stderr)
    if args.step == "run":
        print(RUN_PLAN_NOTE.format(cfg=cfg, mark=tc.MARK_KEY), file=sys.stderr)
    return console.OK
