"""``mnist-launch-dataflow``: the MNIST -> TFRecord conversion job on Google
Cloud Dataflow, with this project staged on the workers as a wheel. What it
runs, its settings and what it stages: docs/launch.md, "Dataflow" and "What
a launcher stages".

Why a wheel and ``--extra_package`` rather than ``--setup_file``: Beam 2.77
accepts ``--setup_file=pyproject.toml``, but it then builds an sdist with
``python -m build --no-isolation``, so the launching environment needs the
``build`` package *and* the build backend pyproject.toml asks for
(setuptools>=68) installed next to Beam; neither comes with this project's
extras, and without them submission fails ("Failed to build package from
.../pyproject.toml using 'python -m build'"). ``--setup_file`` also wants a
``setup.py``/``pyproject.toml`` path whose folder is the project, and the
worker then rebuilds the sdist on every VM. A wheel built here needs only pip,
and the Beam worker boot installs each ``--extra_package`` in two passes
(``pip install --force-reinstall --no-deps`` then ``pip install``), so the
wheel's own dependencies (numpy, tensorflow) are resolved on the worker.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as _dt
import re
import sys
from pathlib import Path
from typing import Mapping, Sequence


from launch import errors as le
from launch import processes as lp
from launch import settings as ls
from launch import wheel as lw
from launch import staging as wheels

from mnist_common import console
from mnist_common.flags import number, option_strings
from mnist_common.stop import Stopped, exit_on_signals
from pipeline import options as pipeline_options

PROGRAM = "mnist-launch-dataflow"

DEFAULT_DIST_DIR = lw.REPO_ROOT / "dist" / "dataflow"
REQUIREMENTS_NAME = "dataflow-requirements.txt"
# Dataflow job names: lowercase letters, digits and hyphens, starting with a
# letter and not ending with a hyphen.
_JOB_NAME_RE = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
# Installed on workers by the Beam container itself.
_PROVIDED_BY_WORKER = {"apache-beam"}

# The end of ``--help``: where the settings come from, what goes to the job.
SETTINGS_HELP = """\
Settings come from flags, else from environment variables:

    --project         GOOGLE_CLOUD_PROJECT, CLOUDSDK_CORE_PROJECT
    --region          DATAFLOW_REGION, CLOUDSDK_COMPUTE_REGION
    --temp_location   DATAFLOW_TEMP_LOCATION
    --output          DATAFLOW_OUTPUT

Any argument this launcher does not know is passed on to ``python -m
pipeline`` unchanged (e.g. ``--source=tfds``, ``--target_shard_mb=50``,
``--compression=gzip``; all of them: ``mnist-pipeline --help``). The
pipeline's own parser checks them here first: a flag it refuses ends the
launch with its one line before anything is built or submitted.
``--dry_run`` prints the commands (``cd`` to the repository first) and exits
0 without running or writing anything.
"""


@dataclasses.dataclass
class DataflowConfig:
    project: str
    region: str
    temp_location: str
    staging_location: str
    output: str
    job_name: str
    python: str = sys.executable
    dist_dir: Path = DEFAULT_DIST_DIR
    build_isolation: bool = True
    wheel_source: wheels.Source = dataclasses.field(default_factory=wheels.find_source)
    num_workers: int | None = None
    max_num_workers: int | None = None
    machine_type: str | None = None
    experiments: list[str] = dataclasses.field(default_factory=list)
    sdk_container_image: str | None = None
    service_account_email: str | None = None
    pipeline_args: list[str] = dataclasses.field(default_factory=list)


def default_job_name(now: _dt.datetime | None = None) -> str:
    now = now or _dt.datetime.now(_dt.timezone.utc)
    return "mnist-tfrecords-" + now.strftime("%Y%m%d-%H%M%S")


def build_parser() -> ls.LauncherParser:
    """The launcher's flags; a refused number is a `le.ConfigError`."""
    parser = ls.LauncherParser(
        allow_abbrev=False,
        description="Run `python -m pipeline` on Dataflow with this project "
                    "staged on the workers. Unknown arguments go to the "
                    "pipeline (its flags: `mnist-pipeline --help`).",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=SETTINGS_HELP)
    parser.add_argument("--project", help="GCP project id")
    parser.add_argument("--region", help="Dataflow region, e.g. us-central1")
    parser.add_argument("--temp_location", help="gs:// folder for temp files")
    parser.add_argument("--staging_location",
                        help="gs:// folder for staged packages "
                             "(default: TEMP_LOCATION/staging)")
    parser.add_argument("--output", help="gs:// prefix for shards + metadata")
    parser.add_argument("--job_name", help="default: mnist-tfrecords-<UTC>")
    parser.add_argument("--num_workers", type=number(int, min=1, words="at least 1"))
    parser.add_argument("--max_num_workers", type=number(int, min=1, words="at least 1"))
    parser.add_argument("--machine_type", help="worker type, e.g. n2-standard-4")
    parser.add_argument("--experiments", action="append", default=[],
                        help="Dataflow experiment; repeat for several")
    parser.add_argument("--sdk_container_image",
                        help="worker image that already holds the "
                             "dependencies (then no requirements file)")
    parser.add_argument("--service_account_email")
    parser.add_argument("--python", default=sys.executable,
                        help="interpreter with apache-beam[gcp] installed")
    parser.add_argument("--dist_dir", type=Path,
                        help="where the wheel and requirements file go (default: "
                             "the checkout's dist/dataflow; installed: "
                             "~/.cache/mnist-tpu/dist/dataflow)")
    parser.add_argument("--source_dir", type=Path,
                        help="a checkout of the project to build the wheel from "
                             "(default: the checkout this launcher is in, else the "
                             "installed distribution it is part of)")
    parser.add_argument("--no_build_isolation", action="store_true",
                        help="build the wheel with the installed setuptools "
                             "(offline machines)")
    parser.add_argument("--dry_run", action="store_true",
                        help="print the commands and exit")
    return parser


def parse_args(argv: Sequence[str]) -> tuple[argparse.Namespace, list[str]]:
    args, rest = build_parser().parse_known_args(list(argv))
    _refuse_abbreviations(args, rest)
    return args, rest


def _refuse_abbreviations(args: argparse.Namespace, rest: Sequence[str]) -> None:
    """An unknown flag that begins one of the launcher's (``--dry`` for
    ``--dry_run``) would go to the pipeline while the launcher's flag stays
    unset (and the job is submitted): refused, flags are spelled out. So is
    one that begins a flag of the pipeline's own parser (``--target`` for
    ``--target_shard_mb``), before anything is built."""
    job = set(option_strings(pipeline_options.build_parser()))
    known = sorted({f"--{name}" for name in vars(args)} | {f for f in job if f.startswith("--")})
    for arg in rest:
        name = arg.split("=", 1)[0]
        if name in job:
            continue
        matches = [flag for flag in known if name.startswith("--") and flag.startswith(name)]
        if matches:
            raise le.ConfigError(f"{name}: not a flag; flags are not abbreviated "
                                 f"(did you mean {' or '.join(matches)}?)")


def _required(value, names: Sequence[str], flag: str,
              environ: Mapping[str, str] | None) -> str:
    """The flag's ``value``, else the first of the environment variables
    ``names`` that is set; ConfigError if neither is."""
    found = ls.first_setting(value, ls.env(*names, environ=environ))
    if not found:
        raise le.ConfigError(f"{flag} is required (or set {names[0]})")
    return found


def _check_job_flags(args: argparse.Namespace, pipeline_args: Sequence[str]) -> None:
    """Refuses pipeline flags the launcher sets (the numbers' ranges are
    their types', checked while parsing)."""
    for arg in pipeline_args:
        if arg.split("=", 1)[0] in ("--runner", "--setup_file"):
            raise le.ConfigError(
                f"{arg.split('=', 1)[0]} is set by this launcher; drop it")


def resolve_config(args: argparse.Namespace, pipeline_args: Sequence[str],
                   environ: Mapping[str, str] | None = None) -> DataflowConfig:
    """Merge flags with environment variables and validate; ConfigError."""
    project = _required(args.project, ("GOOGLE_CLOUD_PROJECT", "CLOUDSDK_CORE_PROJECT"),
                        "--project", environ)
    region = _required(args.region, ("DATAFLOW_REGION", "CLOUDSDK_COMPUTE_REGION"),
                       "--region", environ)
    temp = _required(args.temp_location, ("DATAFLOW_TEMP_LOCATION",), "--temp_location",
                     environ)
    temp = ls.require_gs(temp, "--temp_location")
    staging = ls.require_gs(args.staging_location or temp + "/staging",
                            "--staging_location")
    output = _required(args.output, ("DATAFLOW_OUTPUT",), "--output", environ)
    output = ls.require_gs(output, "--output")
    job_name = args.job_name or default_job_name()
    if not _JOB_NAME_RE.match(job_name):
        raise le.ConfigError(
            f"--job_name {job_name!r} must be lowercase letters, digits and "
            "hyphens, starting with a letter")
    _check_job_flags(args, pipeline_args)
    source = wheels.find_source(args.source_dir)
    dist_dir = args.dist_dir or source.dist_dir("dataflow")
    cfg = DataflowConfig(
        project=project, region=region, temp_location=temp,
        staging_location=staging, output=output, job_name=job_name,
        python=args.python, dist_dir=Path(dist_dir).resolve(),
        build_isolation=not args.no_build_isolation, wheel_source=source,
        num_workers=args.num_workers,
        max_num_workers=args.max_num_workers, machine_type=args.machine_type,
        experiments=list(args.experiments),
        sdk_container_image=args.sdk_container_image,
        service_account_email=args.service_account_email,
        pipeline_args=list(pipeline_args))
    check_pipeline_args(cfg)
    return cfg


def check_pipeline_args(cfg: DataflowConfig) -> None:
    """The pipeline's own answer to the command the launcher will run, asked
    before the wheel is built or the job submitted: a flag the job refuses
    ends the launch with the job's own line (exit 2). `pipeline.options`
    loads neither Beam nor TensorFlow (the standard library is enough)."""
    problem = pipeline_options.flag_problem(
        pipeline_command(cfg, cfg.wheel_source.project())[3:])
    if problem:
        raise le.ConfigError(problem)


def worker_requirements(pyproject: Mapping) -> list[str]:
    """The ``pipeline`` extra, less what the Beam worker image provides."""
    return [req for req in lw.extra_requirements(pyproject, "pipeline")
            if lw.requirement_name(req) not in _PROVIDED_BY_WORKER]


def wheel_path(cfg: DataflowConfig, pyproject: Mapping) -> Path:
    return cfg.dist_dir / lw.wheel_filename(*lw.project_name_version(pyproject))


def requirements_path(cfg: DataflowConfig) -> Path:
    return cfg.dist_dir / REQUIREMENTS_NAME


def build_commands(cfg: DataflowConfig) -> list[lp.Command]:
    """``pip wheel`` of a checkout; none for an installed copy (`launch.staging`)."""
    return wheels.build_commands(cfg.wheel_source, cfg.python, cfg.dist_dir,
                                  cfg.build_isolation)


def pipeline_command(cfg: DataflowConfig, pyproject: Mapping) -> lp.Command:
    cmd = [
        cfg.python, "-m", "pipeline",
        "--runner=DataflowRunner",
        f"--project={cfg.project}",
        f"--region={cfg.region}",
        f"--temp_location={cfg.temp_location}",
        f"--staging_location={cfg.staging_location}",
        f"--job_name={cfg.job_name}",
        f"--output={cfg.output}",
        f"--extra_package={wheel_path(cfg, pyproject)}",
    ]
    if cfg.sdk_container_image:
        cmd.append(f"--sdk_container_image={cfg.sdk_container_image}")
    else:
        cmd += [f"--requirements_file={requirements_path(cfg)}",
                "--requirements_cache=skip"]
    if cfg.num_workers is not None:
        cmd.append(f"--num_workers={cfg.num_workers}")
    if cfg.max_num_workers is not None:
        cmd.append(f"--max_num_workers={cfg.max_num_workers}")
    if cfg.machine_type:
        cmd.append(f"--machine_type={cfg.machine_type}")
    cmd += [f"--experiments={exp}" for exp in cfg.experiments]
    if cfg.service_account_email:
        cmd.append(f"--service_account_email={cfg.service_account_email}")
    return cmd + cfg.pipeline_args


def plan(cfg: DataflowConfig, pyproject: Mapping) -> list[lp.Command]:
    """Every command a real run executes, in order (cwd: the folder that
    holds the `launch` package, `launch.wheel.REPO_ROOT`)."""
    return [*build_commands(cfg), pipeline_command(cfg, pyproject)]


def execute(cfg: DataflowConfig, pyproject: Mapping) -> int:
    wheels.make_wheel(cfg.wheel_source, cfg.dist_dir, pyproject, build_commands(cfg))
    if not cfg.sdk_container_image:
        requirements_path(cfg).write_text(
            "\n".join(worker_requirements(pyproject)) + "\n")
    return lp.run_command(pipeline_command(cfg, pyproject), cwd=lw.REPO_ROOT)


def main(argv: Sequence[str] | None = None) -> int:
    """Exit status: the job's, 2 for bad settings, 1 when the wheel build
    fails, 128 + N for signal N. While the wheel build or the job runs, a
    signal goes to it (`launch.processes.run_command`) and its status is the
    launcher's; at any other moment the launcher stops at once, with nothing
    to clean up."""
    with exit_on_signals(PROGRAM):
        try:
            args, rest = parse_args(sys.argv[1:] if argv is None else argv)
            cfg = resolve_config(args, rest)
            pyproject = cfg.wheel_source.project()
            if args.dry_run:
                print(cfg.wheel_source.line(pyproject), file=sys.stderr)
                print(lp.format_commands([["cd", str(lw.REPO_ROOT)]]
                                         + plan(cfg, pyproject)))
                return console.OK
            return execute(cfg, pyproject)
        except le.LaunchError as exc:
            return le.fail(str(exc), exc.code)
        except Stopped as exc:
            return le.stopped(exc, PROGRAM)


if __name__ == "__main__":
    sys.argv[0] = "python -m launch.dataflow"  # argparse's usage line names the command typed
    sys.exit(main())
