#!/usr/bin/env python3
"""Create a Cloud TPU VM, install this project on it, train, and delete it.

    python scripts/launch_tpu_vm.py all --name=mnist-tpu --zone=us-central2-b \\
        --accelerator_type=v4-8 --data=gs://BUCKET/mnist \\
        --model_dir=gs://BUCKET/runs/1 --delete_after [--dry_run] [TRAINER ARGS]

Steps (each is also a subcommand: create, setup, train, delete; ``all`` runs
create, setup, train and, with ``--delete_after``, delete even when training
failed, so a failed run does not leave a TPU billing):

create  ``gcloud compute tpus tpu-vm create NAME --zone --accelerator-type
        --version``.
setup   builds this project's wheel here, copies it to every host
        (``tpu-vm scp --worker=all``) and installs on every host
        (``tpu-vm ssh --worker=all``): TensorFlow for TPU, the tf-keras that
        matches it, then the wheel with ``--no-deps``, then an import check.
train   ``python3 -m trainer --strategy=tpu`` on the TPU host(s).
delete  ``gcloud compute tpus tpu-vm delete NAME --quiet``.

TensorFlow on the TPU VM. The project pins tensorflow==2.21.0, but that wheel
is built without TPU support: only the separate ``tensorflow-tpu`` wheel is
(it depends on ``libtpu``, the TPU runtime library, as a pip package), and
the newest ``tensorflow-tpu`` release is 2.20.0. Installing the project with
its dependencies on a TPU VM would therefore replace a TPU-capable
TensorFlow with one that finds no TPU, so the wheel is installed with
``--no-deps`` after TensorFlow is in place. Two ways to get that TensorFlow:

* default for one-host slices: a plain TPU OS image (``tpu-ubuntu2204-base``
  for v2/v3/v4, ``v2-alpha-tpuv5`` for v5p, ``v2-alpha-tpuv5-lite`` for v5e,
  ``v2-alpha-tpuv6e`` for v6e) plus ``pip install tensorflow-tpu==2.20.0``
  with TensorFlow's libtpu index as ``--find-links``; ``--libtpu=libtpu==X``
  pins the runtime library if the resolved one does not match.
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
``--loop=custom --epochs=5``). ``--dry_run`` prints the commands and exits 0
without running anything.
"""

from __future__ import annotations

import argparse
import dataclasses
import re
import shlex
import sys
from pathlib import Path
from typing import Mapping, Sequence

sys.path.insert(0, str(Path(__file__).resolve().parent))

import launch_common as lc  # noqa: E402

STEPS = ("create", "setup", "train", "delete")
DEFAULT_TENSORFLOW = "tensorflow-tpu==2.20.0"
PREINSTALLED = "preinstalled"
LIBTPU_FIND_LINKS = "https://storage.googleapis.com/libtpu-tf-releases/index.html"
DEFAULT_DIST_DIR = lc.REPO_ROOT / "dist" / "tpu_vm"
# Accelerator family -> plain OS image for the TPU VM (JAX/PyTorch images in
# Google's runtime table; TensorFlow is installed on top with pip).
BASE_IMAGES = {
    "v2": "tpu-ubuntu2204-base",
    "v3": "tpu-ubuntu2204-base",
    "v4": "tpu-ubuntu2204-base",
    "v5p": "v2-alpha-tpuv5",
    "v5litepod": "v2-alpha-tpuv5-lite",
    "v5e": "v2-alpha-tpuv5-lite",
    "v6e": "v2-alpha-tpuv6e",
}
_ACCELERATOR_RE = re.compile(r"^(?P<family>[a-z0-9]+)-(?P<size>\d+)$")
# Above this size (TensorCores for v2-v5p, chips for v5e/v6e) a slice spans
# more than one host VM.
_ONE_HOST_MAX = 8
# Remote shell fragments. They use double quotes only, so that the one level
# of single quotes shlex adds around ``--command=...`` stays readable.
_TF_VERSION = ('TF_VERSION="$(python3 -c '
               '"import tensorflow as tf; print(tf.__version__)")"')
_CHECK = ('python3 -c "import tensorflow as tf, tf_keras, trainer; '
          'print(tf.__version__, tf_keras.__version__)"')


@dataclasses.dataclass
class TpuConfig:
    name: str
    zone: str
    project: str | None = None
    accelerator_type: str | None = None
    runtime_version: str | None = None
    multi_host: bool = False
    tensorflow: str = DEFAULT_TENSORFLOW
    libtpu: str | None = None
    spot: bool = False
    data: str | None = None
    model_dir: str | None = None
    trainer_args: list[str] = dataclasses.field(default_factory=list)
    delete_after: bool = False
    gcloud: str = "gcloud"
    python: str = sys.executable
    dist_dir: Path = DEFAULT_DIST_DIR
    build_isolation: bool = True


def parse_accelerator(accelerator_type: str) -> tuple[str, int]:
    match = _ACCELERATOR_RE.match(accelerator_type)
    if not match or match["family"] not in BASE_IMAGES:
        raise lc.ConfigError(
            f"--accelerator_type {accelerator_type!r} is not one of "
            f"{', '.join(f + '-N' for f in BASE_IMAGES)} (e.g. v4-8, "
            "v5litepod-8, v6e-8)")
    return match["family"], int(match["size"])


def is_multi_host(accelerator_type: str) -> bool:
    return parse_accelerator(accelerator_type)[1] > _ONE_HOST_MAX


def default_runtime_version(accelerator_type: str) -> str:
    family, _ = parse_accelerator(accelerator_type)
    if is_multi_host(accelerator_type):
        raise lc.ConfigError(
            f"{accelerator_type} spans several hosts: pass "
            "--runtime_version=tpu-vm-tf-<version>-pod-pjrt (a TensorFlow pod "
            "image; list them with `gcloud compute tpus tpu-vm versions list`)")
    return BASE_IMAGES[family]


def parse_args(argv: Sequence[str]) -> tuple[argparse.Namespace, list[str]]:
    common = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
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
    common.add_argument("--libtpu", help="optional pin, e.g. libtpu==0.0.17")
    common.add_argument("--spot", action="store_true", help="Spot TPU VM")
    common.add_argument("--data", help="gs:// folder the pipeline wrote")
    common.add_argument("--model_dir", help="gs:// folder for checkpoints")
    common.add_argument("--delete_after", action="store_true",
                        help="with `all`: delete the TPU VM at the end")
    common.add_argument("--gcloud", default="gcloud")
    common.add_argument("--python", default=sys.executable,
                        help="interpreter that builds the wheel here")
    common.add_argument("--dist_dir", type=Path, default=DEFAULT_DIST_DIR)
    common.add_argument("--no_build_isolation", action="store_true")
    common.add_argument("--dry_run", action="store_true",
                        help="print the commands and exit")
    parser = argparse.ArgumentParser(
        allow_abbrev=False,
        description="Cloud TPU VM launcher for the trainer. Unknown "
                    "arguments go to `python -m trainer`.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Settings come from" + __doc__.split("Settings come from", 1)[1])
    sub = parser.add_subparsers(dest="step", required=True)
    for step in STEPS + ("all",):
        sub.add_parser(step, parents=[common], allow_abbrev=False)
    return parser.parse_known_args(list(argv))


def resolve_config(args: argparse.Namespace, trainer_args: Sequence[str],
                   environ: Mapping[str, str] | None = None) -> TpuConfig:
    """Merge flags with environment variables and validate; ConfigError."""
    steps = STEPS if args.step == "all" else (args.step,)
    name = lc.first_setting(args.name, lc.env("TPU_NAME", environ=environ))
    if not name:
        raise lc.ConfigError("--name is required (or set TPU_NAME)")
    zone = lc.first_setting(args.zone, lc.env(
        "TPU_ZONE", "CLOUDSDK_COMPUTE_ZONE", environ=environ))
    if not zone:
        raise lc.ConfigError("--zone is required (or set TPU_ZONE)")
    cfg = TpuConfig(
        name=name, zone=zone,
        project=lc.first_setting(args.project, lc.env(
            "GOOGLE_CLOUD_PROJECT", "CLOUDSDK_CORE_PROJECT", environ=environ)),
        libtpu=args.libtpu, spot=args.spot,
        trainer_args=list(trainer_args), delete_after=args.delete_after,
        gcloud=args.gcloud, python=args.python,
        dist_dir=Path(args.dist_dir).resolve(),
        build_isolation=not args.no_build_isolation)
    if steps == ("delete",):
        return cfg
    accelerator = lc.first_setting(args.accelerator_type, lc.env(
        "TPU_ACCELERATOR_TYPE", environ=environ))
    if not accelerator:
        raise lc.ConfigError(
            "--accelerator_type is required (or set TPU_ACCELERATOR_TYPE), "
            "e.g. v4-8")
    cfg.accelerator_type = accelerator
    cfg.multi_host = is_multi_host(accelerator)
    cfg.runtime_version = (lc.first_setting(args.runtime_version, lc.env(
        "TPU_RUNTIME_VERSION", environ=environ))
        or default_runtime_version(accelerator))
    tf_image = cfg.runtime_version.startswith("tpu-vm-tf-")
    cfg.tensorflow = args.tensorflow or (PREINSTALLED if tf_image
                                         else DEFAULT_TENSORFLOW)
    if cfg.multi_host and not (tf_image and "-pod" in cfg.runtime_version):
        raise lc.ConfigError(
            f"{accelerator} spans several hosts and needs a TensorFlow pod "
            f"image, not {cfg.runtime_version!r}: pass "
            "--runtime_version=tpu-vm-tf-<version>-pod-pjrt")
    if cfg.multi_host and cfg.tensorflow != PREINSTALLED:
        raise lc.ConfigError(
            "on a multi-host slice keep the pod image's TensorFlow "
            f"(--tensorflow={PREINSTALLED}); it runs the TPU worker service")
    if "train" in steps:
        if not (args.data or "").strip():
            raise lc.ConfigError(
                "--data is required: the gs:// folder the pipeline wrote")
        cfg.data = lc.require_gs(args.data, "--data")
        if not args.model_dir:
            raise lc.ConfigError(
                "--model_dir is required: a gs:// folder (TPU hosts cannot "
                "write to this machine's disk)")
        cfg.model_dir = lc.require_gs(args.model_dir, "--model_dir")
    for arg in cfg.trainer_args:
        if arg.split("=", 1)[0] in ("--data", "--model_dir", "--strategy",
                                    "--tpu"):
            raise lc.ConfigError(f"{arg.split('=', 1)[0]} is set by this "
                                 "launcher; drop it")
    return cfg


def _gcloud(cfg: TpuConfig, verb: str, *rest: str) -> lc.Command:
    cmd = [cfg.gcloud, "compute", "tpus", "tpu-vm", verb, *rest,
           f"--zone={cfg.zone}"]
    if cfg.project:
        cmd.append(f"--project={cfg.project}")
    return cmd


def wheel_name(pyproject: Mapping) -> str:
    return lc.wheel_filename(*lc.project_name_version(pyproject))


def create_commands(cfg: TpuConfig) -> list[lc.Command]:
    cmd = _gcloud(cfg, "create", cfg.name)
    cmd += [f"--accelerator-type={cfg.accelerator_type}",
            f"--version={cfg.runtime_version}"]
    if cfg.spot:
        cmd.append("--spot")
    return [cmd]


def install_script(cfg: TpuConfig, pyproject: Mapping) -> str:
    """The shell command every host runs to install TensorFlow + project.

    tf-keras declares a dependency on the ``tensorflow`` distribution, which
    a TPU build (``tensorflow-tpu``) does not provide; installing it with its
    dependencies would add the CPU-only ``tensorflow`` wheel on top of the
    same import package. Hence ``--no-deps`` for tf-keras (pinned to the
    installed TensorFlow's minor version) and for this project's wheel.
    """
    steps = ["set -e", "cd ~"]
    if cfg.tensorflow != PREINSTALLED:
        pip = ["python3", "-m", "pip", "install", "--user", cfg.tensorflow]
        if cfg.libtpu:
            pip.append(cfg.libtpu)
        steps.append(shlex.join(pip + ["-f", LIBTPU_FIND_LINKS]))
    steps.append(_TF_VERSION)
    steps.append('python3 -m pip install --user --no-deps '
                 '"tf-keras~=${TF_VERSION%.*}.0"')
    steps.append(shlex.join(["python3", "-m", "pip", "install", "--user",
                             "--no-deps", "--force-reinstall",
                             wheel_name(pyproject)]))
    steps.append(_CHECK)
    return "; ".join(steps)


def setup_commands(cfg: TpuConfig, pyproject: Mapping) -> list[lc.Command]:
    wheel = cfg.dist_dir / wheel_name(pyproject)
    return [
        lc.wheel_build_command(cfg.python, cfg.dist_dir / "src", cfg.dist_dir,
                               cfg.build_isolation),
        _gcloud(cfg, "scp", str(wheel), f"{cfg.name}:", "--worker=all"),
        _gcloud(cfg, "ssh", cfg.name, "--worker=all",
                f"--command={install_script(cfg, pyproject)}"),
    ]


def train_script(cfg: TpuConfig) -> str:
    tpu = cfg.name if cfg.multi_host else "local"
    trainer = ["python3", "-m", "trainer", "--strategy=tpu", f"--tpu={tpu}",
               f"--data={cfg.data}", f"--model_dir={cfg.model_dir}",
               *cfg.trainer_args]
    prefix = "TPU_LOAD_LIBRARY=0 " if cfg.multi_host else ""
    return "cd ~ && " + prefix + shlex.join(trainer)


def train_commands(cfg: TpuConfig) -> list[lc.Command]:
    # One host: the same program on every worker (there is only worker 0).
    # Several hosts: TensorFlow's single client on worker 0 drives the slice.
    worker = "--worker=0" if cfg.multi_host else "--worker=all"
    return [_gcloud(cfg, "ssh", cfg.name, worker,
                    f"--command={train_script(cfg)}")]


def delete_commands(cfg: TpuConfig) -> list[lc.Command]:
    return [_gcloud(cfg, "delete", cfg.name, "--quiet")]


def plan(step: str, cfg: TpuConfig, pyproject: Mapping) -> list[lc.Command]:
    """Every command ``step`` runs, in order."""
    builders = {
        "create": lambda: create_commands(cfg),
        "setup": lambda: setup_commands(cfg, pyproject),
        "train": lambda: train_commands(cfg),
        "delete": lambda: delete_commands(cfg),
    }
    if step != "all":
        return builders[step]()
    steps = ["create", "setup", "train"] + (["delete"] if cfg.delete_after
                                            else [])
    return [cmd for s in steps for cmd in builders[s]()]


def _run_all(commands: Sequence[lc.Command]) -> int:
    for cmd in commands:
        rc = lc.run_command(cmd, cwd=lc.REPO_ROOT)
        if rc != 0:
            return rc
    return 0


def execute(step: str, cfg: TpuConfig, pyproject: Mapping) -> int:
    def run_step(name: str) -> int:
        if name == "setup":
            lc.build_wheel(cfg.python, cfg.dist_dir, cfg.build_isolation,
                           pyproject)
            return _run_all(setup_commands(cfg, pyproject)[1:])
        return _run_all(plan(name, cfg, pyproject))

    if step != "all":
        return run_step(step)
    rc = run_step("create")
    if rc != 0:
        return rc
    try:
        for name in ("setup", "train"):
            rc = run_step(name)
            if rc != 0:
                break
    finally:
        if cfg.delete_after:
            delete_rc = run_step("delete")
            rc = rc or delete_rc
    return rc


def main(argv: Sequence[str] | None = None) -> int:
    args, rest = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        cfg = resolve_config(args, rest)
        pyproject = lc.load_pyproject()
        if args.dry_run:
            print(lc.format_commands(plan(args.step, cfg, pyproject)))
            return 0
        return execute(args.step, cfg, pyproject)
    except lc.ConfigError as exc:
        return lc.fail(str(exc))


if __name__ == "__main__":
    sys.exit(main())
