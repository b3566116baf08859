"""Create a Cloud TPU VM, install this project on it, train, and delete it.

    python scripts/launch_tpu_vm.py all --name=mnist-tpu --zone=us-central2-b \\
        --accelerator_type=v4-8 --data=gs://BUCKET/mnist \\
        --model_dir=gs://BUCKET/runs/1 --delete_after [--dry_run] [TRAINER ARGS]

Steps, each also a subcommand; ``all`` runs create, setup, train, wait and,
with ``--delete_after``, delete even when training failed or the wait gave
up, so a failed run does not leave a TPU billing:

create  ``gcloud compute tpus tpu-vm create NAME --zone --accelerator-type
        --version``.
setup   builds this project's wheel here, copies it to every host
        (``tpu-vm scp --worker=all``) and installs on every host
        (``tpu-vm ssh --worker=all``): TensorFlow for TPU, the tf-keras that
        matches it, then the wheel with ``--no-deps``, then an import check.
train   reads ``--data``'s manifest.json (``gcloud storage cat``) and warns
        when the train split has fewer files than the slice has hosts, then
        starts ``python3 -m trainer --preset=tpu --strategy=tpu`` on the TPU
        host(s) detached from the ssh session (SIGHUP ignored, stdin from
        /dev/null, output to ``~/mnist-tpu/train.log``) and returns, so a
        dropped connection does not stop training. The host keeps the
        trainer's pid in ``~/mnist-tpu/train.pid`` and, when it ends, its
        exit status in ``~/mnist-tpu/train.exit``.
wait    asks every host for that state every ``--poll_seconds`` until the
        trainer has exited, then exits with the trainer's status (143, 130
        or 129: stopped by SIGTERM, SIGINT or SIGHUP, e.g. a preemption, with
        every trained step saved: it says to rerun the train step to
        resume); 124 after
        ``--wait_timeout`` seconds, 255 when several checks in a row fail.
status  asks once: prints one line per host; exits 0 while training runs or
        after it succeeded, else with the trainer's status (1 if none).
logs    prints the last ``--lines`` lines of every host's log; ``--follow``
        keeps printing until the trainer exits.
delete  ``gcloud compute tpus tpu-vm delete NAME --quiet``.
run     a spot run from start to result: create (``--queued``: a queued
        resource), setup, train, wait, and on a preemption delete, create
        again and resume, until the trainer exits (launch/spot/runner.py;
        docs/trainer.md, "Spot runs").

``--preset=tpu`` (the trainer's TPU recipe: the CPU recipe's convnet,
augmentation and schedule at global batch 1024, bfloat16, 50 steps per
execution, records cached) comes first, so trainer arguments given
here override its values; a ``--preset`` given here replaces it. The
trainer's own parser checks them here first: a flag it refuses ends the
launch with one line before any VM exists.

TensorFlow on the TPU VM. The project pins tensorflow==2.21.0, but that wheel
is built without TPU support: only the separate ``tensorflow-tpu`` wheel is
(it depends on ``libtpu``, the TPU runtime library, as a pip package), and
the newest ``tensorflow-tpu`` release is 2.20.0. Installing the project with
its dependencies on a TPU VM would therefore replace a TPU-capable
TensorFlow with one that finds no TPU, so the wheel is installed with
``--no-deps`` after TensorFlow is in place. Two ways to get that TensorFlow:

* default for one-host slices: a plain TPU OS image (``tpu-ubuntu2204-base``
  for v2/v3/v4, ``v2-alpha-tpuv5`` for v5p, ``v2-alpha-tpuv5-lite`` for v5e,
  ``v2-alpha-tpuv6e`` for v6e) plus ``pip install tensorflow-tpu==2.20.0
  libtpu==0.0.31`` from PyPI: the newest libtpu that this TensorFlow loads
  (docs/tpu_vm_stack.md). ``--libtpu=libtpu==X`` pins another; setup ends
  with one ``error:`` line on a host where it does not load.
* a TensorFlow runtime image (``--runtime_version=tpu-vm-tf-...``), whose
  preinstalled TensorFlow and libtpu are kept (``--tensorflow=preinstalled``
  is then the default). Multi-host slices need one of the ``-pod`` images:
  TensorFlow drives a TPU slice from a single client, and those images run
  the TPU worker service on every host. There the trainer runs on worker 0
  with ``--tpu=NAME`` and ``TPU_LOAD_LIBRARY=0`` instead of ``--tpu=local``
  on each host.

Settings come from flags, else from environment variables:

    --name               TPU_NAME
    --zone               TPU_ZONE, CLOUDSDK_COMPUTE_ZONE
    --accelerator_type   TPU_ACCELERATOR_TYPE
    --runtime_version    TPU_RUNTIME_VERSION
    --project            GOOGLE_CLOUD_PROJECT, CLOUDSDK_CORE_PROJECT
                         (optional: gcloud's configured project otherwise)

Arguments this script does not know go to ``python -m trainer`` (e.g.
``--loop=custom --epochs=5``). ``--dry_run`` prints, one a line, exactly the
commands the step runs, in order (``wait`` repeats its one command), and
exits 0 without running anything.
"""

from __future__ import annotations

import argparse
import shlex
import sys
import time
from pathlib import Path
from typing import Callable, Mapping, Sequence

from launch import common as lc
from launch.spot import runner as spot_runner
from launch.spot.cloud import Cloud
from launch.tpu.commands import (DEFAULT_DIST_DIR, DEFAULT_LIBTPU, DEFAULT_TENSORFLOW,
                                 PREINSTALLED, REMOTE_DIR, TpuConfig, exit_note,
                                 manifest_command, parse_status, phases, plan,
                                 summarize_status, trainer_command)
from launch.tpu.topology import default_runtime_version, is_multi_host, slice_hosts
from mnist_contract import MANIFEST_FILE, ContractError, Manifest, join_path
from mnist_common import console
from mnist_common.flags import OneLineParser

STEPS = ("create", "setup", "train", "wait", "delete")
# Steps that only talk to an existing VM: they need its name and zone alone.
VM_STEPS = ("wait", "status", "logs", "delete")
VERBS = STEPS + ("status", "logs", "all", "run")
PROGRAM = "mnist-launch-tpu"
POLL_FAILURES = 5    # failed status checks in a row before ``wait`` gives up


def train_shards_warning(cfg: TpuConfig, rc: int, manifest_text: str) -> str | None:
    """Why the slice's hosts may read the train split badly, or None.

    With fewer train files than hosts the trainer cannot give each host its
    own files: every host reads the whole split and keeps every n-th record.
    A manifest that cannot be read here is a warning too, not a failure:
    the trainer reads it on the TPU itself and names any problem there.
    """
    hosts = slice_hosts(cfg.accelerator_type)
    where = join_path(cfg.data, MANIFEST_FILE)
    if rc != 0:
        return (f"{where}: not read (gcloud storage cat exited {rc}); the train "
                f"files were not compared with the {hosts} host(s) of "
                f"{cfg.accelerator_type}")
    try:
        files = len(Manifest.from_json(manifest_text, origin=where)
                    .split("train").shards)
    except ContractError as exc:
        problem = str(exc).removeprefix(f"{where}: ")
        return (f"{where}: {problem}; the train files were not compared with "
                "the slice's hosts")
    if files >= hosts:
        return None
    return (f"{where}: the train split has {files} file(s) but {cfg.accelerator_type} "
            f"has {hosts} hosts, so every host reads all of it and keeps one record "
            f"in {hosts}; rerun the pipeline with --min_shards={hosts} "
            "(or a multiple of it)")


def _add_run_flags(common: argparse.ArgumentParser) -> None:
    """The flags of ``run`` (launch/spot/runner.py), and ``create``'s kind of VM."""
    common.add_argument("--spot", action="store_true", help="create/run: a Spot TPU VM")
    common.add_argument("--queued", action="store_true",
                        help="create/run: a queued resource, which waits for "
                             "capacity instead of failing")
    common.add_argument("--max_recoveries", type=int, default=5,
                        help="run: preemptions to recover from before giving "
                             "up (exit 75)")
    common.add_argument("--keep", action="store_true",
                        help="run: keep a READY VM at the end")
    common.add_argument("--events", type=Path,
                        help="run: append each event as a JSON line to this "
                             "file, the run's journal for a restarted launcher")
    common.add_argument("--logs_dir", type=Path, default=Path("."),
                        help="run: where a failed trainer's log is copied")
    common.add_argument("--retry_seconds", type=float, default=900.0,
                        help="run: give up (exit 255) after calls to the "
                             "cloud failed for this long")


def _add_vm_flags(common: argparse.ArgumentParser) -> None:
    """The VM's identity and software."""
    common.add_argument("--name", help="TPU VM name")
    common.add_argument("--zone", help="e.g. us-central2-b")
    common.add_argument("--project")
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


def parse_args(argv: Sequence[str]) -> tuple[argparse.Namespace, list[str]]:
    common = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    _add_vm_flags(common)
    common.add_argument("--data", help="gs:// folder the pipeline wrote")
    common.add_argument("--model_dir", help="gs:// folder for checkpoints")
    common.add_argument("--delete_after", action="store_true",
                        help="with `all`: delete the TPU VM at the end")
    common.add_argument("--poll_seconds", type=float, default=60.0,
                        help="wait/all/run: seconds between status checks")
    common.add_argument("--wait_timeout", type=float, default=86400.0,
                        help="wait/all: give up (exit 124) after this many "
                             "seconds of training")
    common.add_argument("--lines", type=int, default=100,
                        help="logs: lines to print from the end of each log")
    common.add_argument("--follow", action="store_true",
                        help="logs: keep printing until the trainer exits")
    common.add_argument("--gcloud", default="gcloud")
    common.add_argument("--python", default=sys.executable,
                        help="interpreter that builds the wheel here")
    common.add_argument("--dist_dir", type=Path, default=DEFAULT_DIST_DIR)
    common.add_argument("--no_build_isolation", action="store_true")
    common.add_argument("--dry_run", action="store_true",
                        help="print the commands a run executes, and exit")
    _add_run_flags(common)
    parser = OneLineParser(
        allow_abbrev=False,
        description="Cloud TPU VM launcher for the trainer. Unknown "
                    "arguments go to `python -m trainer`.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Settings come from" + __doc__.split("Settings come from", 1)[1])
    sub = parser.add_subparsers(dest="step", required=True)
    for step in VERBS:
        sub.add_parser(step, parents=[common], allow_abbrev=False)
    return parser.parse_known_args(list(argv))


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
        _check_trainer_args(cfg)
    return cfg


def _refuse_launcher_flags(trainer_args: Sequence[str]) -> None:
    for arg in trainer_args:
        if arg.split("=", 1)[0] in ("--data", "--model_dir", "--strategy",
                                    "--tpu"):
            raise lc.ConfigError(f"{arg.split('=', 1)[0]} is set by this "
                                 "launcher; drop it")


def _check_trainer_args(cfg: TpuConfig) -> None:
    """The trainer's own answer to the command the hosts will run, asked here
    before a TPU VM is created: a misspelled flag or a value the trainer
    refuses would otherwise end the run only once the VM is up and set up.
    `trainer.config` loads no TensorFlow (the standard library is enough)."""
    from trainer.config import flag_problem
    problem = flag_problem(trainer_command(cfg)[3:], on_tpu=True)
    if problem:
        raise lc.ConfigError(f"trainer arguments: {problem}")


def _check_step_flags(args: argparse.Namespace, steps: Sequence[str],
                      trainer_args: Sequence[str]) -> None:
    """The numeric flags' ranges; trainer arguments only for a step that trains."""
    if args.poll_seconds < 0:
        raise lc.ConfigError("--poll_seconds must be 0 or more")
    if args.wait_timeout <= 0:
        raise lc.ConfigError("--wait_timeout must be positive")
    if args.lines < 1:
        raise lc.ConfigError("--lines must be at least 1")
    if args.max_recoveries < 0:
        raise lc.ConfigError("--max_recoveries must be 0 or more")
    if args.retry_seconds <= 0:
        raise lc.ConfigError("--retry_seconds must be positive")
    if trainer_args and "train" not in steps:
        raise lc.ConfigError(f"{args.step} takes no trainer arguments, got "
                             f"{shlex.join(trainer_args)}")


def _vm_settings(args: argparse.Namespace, trainer_args: Sequence[str],
                 environ: Mapping[str, str] | None) -> dict:
    """The settings every step needs: the VM's name, zone and project, and
    the launcher's own options."""
    name = lc.first_setting(args.name, lc.env("TPU_NAME", environ=environ))
    if not name:
        raise lc.ConfigError("--name is required (or set TPU_NAME)")
    zone = lc.first_setting(args.zone, lc.env(
        "TPU_ZONE", "CLOUDSDK_COMPUTE_ZONE", environ=environ))
    if not zone:
        raise lc.ConfigError("--zone is required (or set TPU_ZONE)")
    return dict(
        name=name, zone=zone,
        project=lc.first_setting(args.project, lc.env(
            "GOOGLE_CLOUD_PROJECT", "CLOUDSDK_CORE_PROJECT", environ=environ)),
        libtpu=args.libtpu, spot=args.spot, queued=args.queued,
        max_recoveries=args.max_recoveries, keep=args.keep,
        events=args.events and args.events.resolve(),
        logs_dir=args.logs_dir.resolve(), retry_seconds=args.retry_seconds,
        trainer_args=tuple(trainer_args), delete_after=args.delete_after,
        poll_seconds=args.poll_seconds, wait_timeout=args.wait_timeout,
        lines=args.lines, follow=args.follow,
        gcloud=args.gcloud, python=args.python,
        dist_dir=Path(args.dist_dir).resolve(),
        build_isolation=not args.no_build_isolation)


def _software_settings(args: argparse.Namespace,
                       environ: Mapping[str, str] | None) -> dict:
    """The accelerator, its TPU software image and the TensorFlow to run on it.

    A multi-host slice needs a TensorFlow pod image and its own TensorFlow,
    which runs the TPU worker service on every host.
    """
    accelerator = lc.first_setting(args.accelerator_type, lc.env(
        "TPU_ACCELERATOR_TYPE", environ=environ))
    if not accelerator:
        raise lc.ConfigError(
            "--accelerator_type is required (or set TPU_ACCELERATOR_TYPE), "
            "e.g. v4-8")
    multi_host = is_multi_host(accelerator)
    runtime_version = (lc.first_setting(args.runtime_version, lc.env(
        "TPU_RUNTIME_VERSION", environ=environ))
        or default_runtime_version(accelerator))
    tf_image = runtime_version.startswith("tpu-vm-tf-")
    tensorflow = args.tensorflow or (PREINSTALLED if tf_image else DEFAULT_TENSORFLOW)
    if multi_host and not (tf_image and "-pod" in runtime_version):
        raise lc.ConfigError(
            f"{accelerator} spans several hosts and needs a TensorFlow pod "
            f"image, not {runtime_version!r}: pass "
            "--runtime_version=tpu-vm-tf-<version>-pod-pjrt")
    if multi_host and tensorflow != PREINSTALLED:
        raise lc.ConfigError(
            "on a multi-host slice keep the pod image's TensorFlow "
            f"(--tensorflow={PREINSTALLED}); it runs the TPU worker service")
    return dict(accelerator_type=accelerator, multi_host=multi_host,
                runtime_version=runtime_version, tensorflow=tensorflow)


def _train_folders(args: argparse.Namespace) -> dict:
    """``--data`` and ``--model_dir``: required, and gs:// (TPU hosts read
    and write Cloud Storage, not this machine's disk)."""
    if not (args.data or "").strip():
        raise lc.ConfigError(
            "--data is required: the gs:// folder the pipeline wrote")
    data = lc.require_gs(args.data, "--data")
    if not args.model_dir:
        raise lc.ConfigError(
            "--model_dir is required: a gs:// folder (TPU hosts cannot "
            "write to this machine's disk)")
    return dict(data=data, model_dir=lc.require_gs(args.model_dir, "--model_dir"))


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
#     --retry_seconds={cfg.retry_seconds:g}, then exit 255"""

Runner = Callable[[lc.Command], tuple[int, str]]


def wait_for_trainer(cfg: TpuConfig, cmd: lc.Command,
                     run: Runner = lc.run_command_output,
                     sleep: Callable[[float], None] = time.sleep,
                     clock: Callable[[], float] = time.monotonic) -> int:
    """Run the status command until the trainer exits; its exit status.

    A failed check (the VM unreachable for a moment) is retried; after
    ``POLL_FAILURES`` in a row the wait gives up with 255. After
    ``cfg.wait_timeout`` seconds of a running trainer it gives up with 124.
    Giving up never stops the trainer.
    """
    start, failures = clock(), 0
    while True:
        rc, output = run(cmd)
        states = parse_status(output)
        if rc != 0 or not states:
            failures += 1
            if failures >= POLL_FAILURES:
                return lc.fail(f"{cfg.name}: {failures} status checks in a "
                               f"row failed (last exit {rc}); training may "
                               "still be running", console.LOST)
        else:
            failures = 0
            state, code = summarize_status(states)
            if state == "exited":
                print(f"training on {cfg.name} finished with exit status "
                      f"{code}{exit_note(code)}", file=sys.stderr)
                return code
            if state == "stopped":
                return lc.fail(f"{cfg.name}: the trainer stopped without an "
                               "exit status (killed, or the host restarted);"
                               " see the logs step", console.FAILURE)
            if state == "not started":
                return lc.fail(f"{cfg.name}: no trainer was started there "
                               f"({REMOTE_DIR}/train.pid is missing)", console.FAILURE)
        if clock() - start >= cfg.wait_timeout:
            return lc.fail(f"{cfg.name}: training still running after "
                           f"{cfg.wait_timeout:g} s (--wait_timeout); it "
                           "goes on, see the status and logs steps",
                           console.TIMED_OUT)
        sleep(cfg.poll_seconds)


def _run_phase(name: str, commands: Sequence[lc.Command], cfg: TpuConfig,
               pyproject: Mapping) -> int:
    if name == "wait":
        [cmd] = commands
        return wait_for_trainer(cfg, cmd)
    if name == "status":
        [cmd] = commands
        rc, output = lc.run_command_output(cmd)
        sys.stdout.write(output)
        if rc != 0:
            return rc
        code = summarize_status(parse_status(output))[1]
        if exit_note(code):
            print(f"{cfg.name}: exit status {code}{exit_note(code)}", file=sys.stderr)
        return code
    if name == "train":
        manifest, *commands = commands
        warning = train_shards_warning(cfg, *lc.run_command_output(manifest))
        if warning:
            print(f"warning: {warning}", file=sys.stderr)
    build = lc.wheel_build_command(cfg.python, cfg.dist_dir / "src",
                                   cfg.dist_dir, cfg.build_isolation)
    for cmd in commands:
        if cmd == build:
            wheel = lc.prepare_wheel_build(cfg.dist_dir, pyproject)
            lc.check_wheel_build(lc.run_command(cmd, cwd=lc.REPO_ROOT), wheel)
            continue
        rc = lc.run_command(cmd, cwd=lc.REPO_ROOT)
        if rc != 0:
            return rc
    return 0


def run_spot(cfg: TpuConfig, pyproject: Mapping) -> int:
    """``run``: the journal checked (launch/spot/journal.py), the manifest
    compared with the slice once, then the spot loop (launch/spot/runner.py)
    until the run ends."""
    def compare_manifest() -> None:
        warning = train_shards_warning(cfg, *lc.run_command_output(manifest_command(cfg)))
        if warning:
            print(f"warning: {warning}", file=sys.stderr)
    return spot_runner.run_spot(cfg, Cloud(cfg, pyproject), compare_manifest)


def execute(step: str, cfg: TpuConfig, pyproject: Mapping) -> int:
    """Run ``phases(step)`` until one fails (``run``: `run_spot`).

    In ``all`` the final delete (``--delete_after``) runs once the VM was
    created, whatever happens after: a failure, a wait that gave up, an
    interrupt.
    """
    if step == "run":
        return run_spot(cfg, pyproject)
    work = phases(step, cfg, pyproject)
    delete = work.pop() if step == "all" and cfg.delete_after else None
    rc, created = 0, False
    try:
        for name, commands in work:
            rc = _run_phase(name, commands, cfg, pyproject)
            if rc != 0:
                break
            created = created or name == "create"
    finally:
        if delete and created:
            delete_rc = _run_phase(*delete, cfg, pyproject)
            rc = rc or delete_rc
    return rc


def main(argv: Sequence[str] | None = None) -> int:
    """Exit status: the step's (`wait`: the trainer's, 124, 255), 2 for bad
    settings, 1 when a command fails to run, 128 + N for signal N. A signal
    goes to the gcloud command that runs (`launch.common.run_command`),
    then stops the launcher; ``all --delete_after`` deletes the VM first.
    Training on the hosts goes on. ``run`` handles signals itself
    (launch/spot/runner.py)."""
    args, rest = parse_args(sys.argv[1:] if argv is None else argv)
    signals = (console.exit_on_signals(PROGRAM) if args.step == "run"
               else lc.raising_on_signals())
    try:
        with signals:
            return _main(args, rest)
    except lc.LaunchError as exc:
        return lc.fail(str(exc), exc.code)
    except lc.Stopped as exc:
        return lc.stopped(exc, PROGRAM)


def _main(args: argparse.Namespace, rest: list[str]) -> int:
    cfg = resolve_config(args, rest)
    pyproject = lc.load_pyproject()
    if not args.dry_run:
        return execute(args.step, cfg, pyproject)
    print(lc.format_commands(plan(args.step, cfg, pyproject)))
    if args.step in ("all", "wait"):
        print(f"# the status command repeats every "
              f"{cfg.poll_seconds:g} s until the trainer exits "
              f"(--wait_timeout {cfg.wait_timeout:g} s)",
              file=sys.stderr)
    if args.step == "run":
        print(RUN_PLAN_NOTE.format(cfg=cfg), file=sys.stderr)
    return console.OK


if __name__ == "__main__":
    sys.exit(main())
