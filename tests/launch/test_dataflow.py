"""Checks of the Dataflow launcher (`launch.dataflow`), offline.

The TPU VM launcher has its own files in tests/launch/tpu/, the shell
scripts theirs in tests/scripts/.

Nothing here talks to Google Cloud. The launchers build their commands as
argv lists, so the tests read those lists (and the ``--dry_run`` output)
and check that a real run would have what it needs. Beam's own option
parser and stager read the Dataflow command, so a misspelt flag or a
package Beam would refuse to stage fails here, not at submission time. Real
execution paths are driven with a stand-in ``gcloud``/``python`` that only
records its arguments.
"""

from __future__ import annotations

import shlex
import signal
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

import pytest

from launch import wheel as lw
from launch import dataflow as ld
from tests.helpers import REPO
from tests.launch.helpers import (PYPROJECT, WHEEL, clean_env, fake_program, flag_values,
                                  program, run_program)


# --------------------------------------------------------------- Dataflow

DF_ARGS = ["--project=proj-1", "--region=europe-west4",
           "--temp_location=gs://bkt/tmp", "--output=gs://bkt/mnist/",
           "--job_name=mnist-test"]


def dataflow_plan(*extra: str, environ=None, dist_dir: Path | None = None):
    argv = DF_ARGS + list(extra)
    if dist_dir is not None:
        argv.append(f"--dist_dir={dist_dir}")
    args, rest = ld.parse_args(argv)
    cfg = ld.resolve_config(args, rest, environ={} if environ is None
                            else environ)
    return cfg, ld.plan(cfg, PYPROJECT)


def test_dataflow_command_has_what_a_real_run_needs(tmp_path):
    cfg, (build, run) = dataflow_plan(
        "--source=synthetic:1000", "--target_shard_mb=50",
        "--max_num_workers=8", "--machine_type=n2-standard-4",
        "--experiments=shuffle_mode=service", "--compression=gzip",
        dist_dir=tmp_path)
    assert run[:3] == [sys.executable, "-m", "pipeline"]
    flags = flag_values(run)
    assert flags["runner"] == "DataflowRunner"
    assert flags["project"] == "proj-1"
    assert flags["region"] == "europe-west4"
    assert flags["temp_location"] == "gs://bkt/tmp"
    assert flags["staging_location"] == "gs://bkt/tmp/staging"
    assert flags["output"] == "gs://bkt/mnist"
    assert flags["job_name"] == "mnist-test"
    assert flags["source"] == "synthetic:1000"
    assert flags["target_shard_mb"] == "50"
    assert flags["max_num_workers"] == "8"
    assert flags["machine_type"] == "n2-standard-4"
    assert flags["experiments"] == "shuffle_mode=service"
    assert flags["compression"] == "gzip"  # unknown flags reach the job
    # The package reaches workers as the wheel the first command builds.
    assert flags["extra_package"] == str(tmp_path / WHEEL)
    assert flags["requirements_file"] == str(tmp_path / ld.REQUIREMENTS_NAME)
    assert flags["requirements_cache"] == "skip"
    assert "setup_file" not in flags
    assert build[:5] == [sys.executable, "-m", "pip", "wheel", "--no-deps"]
    assert build[build.index("--wheel-dir") + 1] == str(tmp_path)


def test_a_repeatable_flag_may_repeat_and_another_may_not(tmp_path, capsys):
    """--experiments collects every value (its action appends); --project twice
    is one line, exit 2, before anything is built."""
    _, (_, run) = dataflow_plan("--experiments=a", "--experiments=b", dist_dir=tmp_path)
    assert [a for a in run if a.startswith("--experiments=")] == [
        "--experiments=a", "--experiments=b"]
    with pytest.raises(SystemExit) as stopped:
        dataflow_plan("--project=other", dist_dir=tmp_path)
    assert stopped.value.code == 2
    assert capsys.readouterr().err == ("error: --project given twice (--project=proj-1, "
                                       "then --project=other); give each flag once "
                                       "(see --help)\n")
    assert not list(tmp_path.iterdir())


def test_beam_reads_the_dataflow_flags_and_stages_the_wheel(tmp_path):
    from apache_beam.options.pipeline_options import (
        DebugOptions, GoogleCloudOptions, PipelineOptions, SetupOptions,
        StandardOptions, WorkerOptions)
    from apache_beam.runners.portability.stager import Stager

    cfg, (_, run) = dataflow_plan(
        "--max_num_workers=3", "--machine_type=n2-standard-4",
        "--experiments=use_runner_v2", "--no_build_isolation",
        dist_dir=tmp_path / "dist")
    wheel = lw.build_wheel(cfg.python, cfg.dist_dir, False, PYPROJECT)
    ld.requirements_path(cfg).write_text(
        "\n".join(ld.worker_requirements(PYPROJECT)) + "\n")

    options = PipelineOptions(run[3:])
    gcp = options.view_as(GoogleCloudOptions)
    setup = options.view_as(SetupOptions)
    assert options.view_as(StandardOptions).runner == "DataflowRunner"
    assert (gcp.project, gcp.region) == ("proj-1", "europe-west4")
    assert gcp.temp_location == "gs://bkt/tmp"
    assert gcp.staging_location == "gs://bkt/tmp/staging"
    assert gcp.job_name == "mnist-test"
    assert setup.extra_packages == [str(wheel)]
    assert setup.requirements_file == str(ld.requirements_path(cfg))
    assert setup.requirements_cache == "skip"
    assert options.view_as(WorkerOptions).max_num_workers == 3
    assert options.view_as(WorkerOptions).machine_type == "n2-standard-4"
    assert "use_runner_v2" in options.view_as(DebugOptions).experiments

    staged = {r.role_payload for r in Stager.create_job_resources(
        options, tempfile.mkdtemp(dir=tmp_path))}
    names = {p.decode(errors="replace") for p in staged}
    assert any(n.endswith(WHEEL) for n in names)
    assert any(n.endswith("extra_packages.txt") for n in names)
    assert any(n.endswith("requirements.txt") for n in names)


def test_project_wheel_carries_both_packages_and_their_dependencies(tmp_path):
    wheel = lw.build_wheel(sys.executable, tmp_path, False, PYPROJECT)
    assert wheel.name == WHEEL
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
        metadata = zf.read(f"{WHEEL.split('-py3')[0]}.dist-info/METADATA")
    for package in PYPROJECT["tool"]["setuptools"]["packages"]:
        expected = {p.relative_to(REPO).as_posix() for p in
                    (REPO / package.replace(".", "/")).rglob("*.py")
                    if "__pycache__" not in p.parts}
        assert expected and expected <= names
    requires = [line.split(":", 1)[1] for line in
                metadata.decode().splitlines()
                if line.startswith("Requires-Dist:") and "extra ==" not in line]
    assert sorted(map(lw.requirement_name, requires)) == sorted(
        map(lw.requirement_name, PYPROJECT["project"]["dependencies"]))


def test_wheel_is_built_from_a_clean_copy(tmp_path):
    """Stale in-tree build output and bytecode never reach the wheel."""
    repo = tmp_path / "repo"
    (repo / "pkg" / "__pycache__").mkdir(parents=True)
    (repo / "pkg" / "__init__.py").write_text("VALUE = 1\n")
    (repo / "pkg" / "__pycache__" / "old.cpython-311.pyc").write_bytes(b"x")
    (repo / "build" / "lib" / "pkg").mkdir(parents=True)
    (repo / "build" / "lib" / "pkg" / "deleted.py").write_text("gone\n")
    (repo / "pyproject.toml").write_text(
        '[build-system]\nrequires = ["setuptools"]\n'
        'build-backend = "setuptools.build_meta"\n'
        '[project]\nname = "demo-pkg"\nversion = "1.2"\n'
        '[tool.setuptools]\npackages = ["pkg"]\n')
    pyproject = lw.load_pyproject(repo / "pyproject.toml")
    wheel = lw.build_wheel(sys.executable, tmp_path / "dist", False,
                           pyproject, repo_root=repo)
    assert wheel.name == "demo_pkg-1.2-py3-none-any.whl"
    with zipfile.ZipFile(wheel) as zf:
        files = {n for n in zf.namelist() if not n.startswith("demo_pkg-")}
    assert files == {"pkg/__init__.py"}
    # The clean copy was a staging folder of the build's own, gone with it.
    assert [p.name for p in (tmp_path / "dist").iterdir()] == [wheel.name]


def test_dist_dir_keeps_what_the_launcher_did_not_make(tmp_path):
    """--dist_dir=DIR: a DIR/src of the user's, and anything else there, stays
    as it was; the build stages in a folder of its own that it removes."""
    dist = tmp_path / "home"
    (dist / "src" / "myproject").mkdir(parents=True)
    (dist / "src" / "myproject" / "main.c").write_text("int main;\n")
    (dist / "notes.txt").write_text("mine\n")
    wheel = lw.build_wheel(sys.executable, dist, False, PYPROJECT)
    assert (dist / "src" / "myproject" / "main.c").read_text() == "int main;\n"
    assert sorted(p.name for p in dist.iterdir()) == sorted(["src", "notes.txt", wheel.name])


def test_worker_requirements_are_the_pipeline_extra_without_beam():
    reqs = ld.worker_requirements(PYPROJECT)
    extra = PYPROJECT["project"]["optional-dependencies"]["pipeline"]
    assert reqs == [r for r in extra if not r.startswith("apache-beam")]
    assert len(reqs) == len(extra) - 1


def test_dataflow_container_image_replaces_the_requirements_file(tmp_path):
    _, (_, run) = dataflow_plan(
        "--sdk_container_image=europe-docker.pkg.dev/p/r/mnist:1",
        dist_dir=tmp_path)
    flags = flag_values(run)
    assert flags["sdk_container_image"] == "europe-docker.pkg.dev/p/r/mnist:1"
    assert "requirements_file" not in flags
    assert flags["extra_package"] == str(tmp_path / WHEEL)


def test_dataflow_settings_from_environment():
    args, rest = ld.parse_args(["--job_name=j1"])
    cfg = ld.resolve_config(args, rest, environ={
        "GOOGLE_CLOUD_PROJECT": "env-proj", "DATAFLOW_REGION": "us-east1",
        "DATAFLOW_TEMP_LOCATION": "gs://e/tmp",
        "DATAFLOW_OUTPUT": "gs://e/out"})
    flags = flag_values(ld.pipeline_command(cfg, PYPROJECT))
    assert (flags["project"], flags["region"]) == ("env-proj", "us-east1")
    assert (flags["temp_location"], flags["output"]) == ("gs://e/tmp",
                                                         "gs://e/out")
    args, rest = ld.parse_args(["--project=flag-proj", "--job_name=j1"])
    cfg = ld.resolve_config(args, rest, environ={
        "GOOGLE_CLOUD_PROJECT": "env-proj", "CLOUDSDK_COMPUTE_REGION": "r2",
        "DATAFLOW_TEMP_LOCATION": "gs://e/tmp",
        "DATAFLOW_OUTPUT": "gs://e/out"})
    assert (cfg.project, cfg.region) == ("flag-proj", "r2")


def test_dataflow_dry_run_prints_commands_and_writes_nothing(tmp_path):
    dist = tmp_path / "dist"
    proc = run_program("launch.dataflow", *DF_ARGS, f"--dist_dir={dist}",
                      "--dry_run")
    assert proc.returncode == 0, proc.stderr
    lines = [shlex.split(line) for line in proc.stdout.splitlines()]
    assert lines[0] == ["cd", str(REPO)]
    assert lines[1][1:4] == ["-m", "pip", "wheel"]
    flags = flag_values(lines[2])
    assert lines[2][1:3] == ["-m", "pipeline"]
    assert flags["runner"] == "DataflowRunner"
    assert flags["extra_package"] == str(dist / WHEEL)
    assert not dist.exists()


@pytest.mark.parametrize("drop,message", [
    ("--project", "--project is required"),
    ("--region", "--region is required"),
    ("--temp_location", "--temp_location is required"),
    ("--output", "--output is required"),
])
def test_dataflow_missing_setting_is_a_clear_error(drop, message):
    args = [a for a in DF_ARGS if not a.startswith(drop + "=")]
    proc = run_program("launch.dataflow", *args, "--dry_run")
    assert proc.returncode == 2
    assert proc.stdout == ""
    assert len(proc.stderr.strip().splitlines()) == 1
    assert proc.stderr.startswith("error: " + message)


@pytest.mark.parametrize("bad,message", [
    ("--output=/tmp/mnist", "--output must be a gs:// URI"),
    ("--temp_location=/tmp/x", "--temp_location must be a gs:// URI"),
    ("--job_name=Bad_Name", "--job_name 'Bad_Name' must be lowercase"),
    ("--runner=DirectRunner", "--runner is set by this launcher"),
])
def test_dataflow_invalid_setting_is_a_clear_error(bad, message):
    key = bad.split("=", 1)[0]
    args = [a for a in DF_ARGS if not a.startswith(key + "=")] + [bad]
    proc = run_program("launch.dataflow", *args, "--dry_run")
    assert proc.returncode == 2
    assert len(proc.stderr.strip().splitlines()) == 1
    assert proc.stderr.startswith("error: " + message)


@pytest.mark.parametrize("abbreviation", ["--dry", "--max_num=3"])
def test_dataflow_abbreviated_flag_is_refused_before_anything_runs(tmp_path, abbreviation):
    """``--dry`` is not ``--dry_run``: passed on to the pipeline it would leave the
    launcher building and submitting the job."""
    python = fake_program(tmp_path / "python", f'echo "$@" >> {tmp_path}/calls\n')
    dist = tmp_path / "dist"
    proc = run_program("launch.dataflow", *DF_ARGS, f"--python={python}",
                      f"--dist_dir={dist}", abbreviation)
    assert proc.returncode == 2, proc.stderr
    name = abbreviation.split("=")[0]
    assert proc.stderr.splitlines() == [
        f"error: {name}: not a flag; flags are not abbreviated (did you mean "
        f"{'--dry_run' if name == '--dry' else '--max_num_workers'}?)"]
    assert not (tmp_path / "calls").exists() and not dist.exists()


@pytest.mark.parametrize("flag, line", [
    ("--target_shard_mb=nan", "error: --target_shard_mb=nan: must be a finite number > 0 "
                              "(see --help)"),
    ("--source=smaple", "error: --source=smaple: no such source or folder; did you mean "
                        "--source=sample?"),
    ("--compression=zip", "error: argument --compression: invalid choice: 'zip' (choose "
                          "from 'none', 'gzip') (see --help)"),
])
def test_a_flag_the_pipeline_refuses_is_refused_before_anything_runs(tmp_path, flag, line):
    """The launcher declares none of the pipeline's flags: it asks the
    pipeline's own parser, which answers with the line the pipeline itself
    prints, exit 2, before a wheel is built or a job submitted."""
    python = fake_program(tmp_path / "python", f'echo "$@" >> {tmp_path}/calls\n')
    dist = tmp_path / "dist"
    proc = run_program("launch.dataflow", *DF_ARGS, f"--python={python}",
                       f"--dist_dir={dist}", flag)
    assert (proc.returncode, proc.stdout, proc.stderr.splitlines()) == (2, "", [line])
    assert not (tmp_path / "calls").exists() and not dist.exists()
    job = run_program("pipeline", f"--output={tmp_path / 'out'}", flag)
    assert (job.returncode, job.stderr.splitlines()) == (2, [line])


@pytest.mark.parametrize("module, argv, line", [
    ("launch.tpu", ["crate"], "error: argument step: invalid choice: 'crate' (choose "
     "from 'create', 'setup', 'train', 'wait', 'delete', 'status', 'logs', 'all', 'run') "
     "(see --help)"),
    ("launch.tpu", ["all", "--poll_seconds=soon"],
     "error: argument --poll_seconds: invalid float value: 'soon' (see --help)"),
    ("launch.dataflow", ["--num_workers=many"],
     "error: argument --num_workers: invalid int value: 'many' (see --help)"),
])
def test_a_launcher_usage_error_is_one_line(module, argv, line):
    proc = run_program(module, *argv)
    assert proc.returncode == 2
    assert (proc.stdout, proc.stderr.splitlines()) == ("", [line])


# ------------------------------------------------- exit status and signals

def fake_python(tmp_path: Path) -> Path:
    """A ``python`` for the wheel build and the job. ``BUILD=fail``: the
    build exits 3; ``BUILD=hang``: it touches ``ready`` and sleeps (SIGTERM
    kills it). The job touches ``ready`` and sleeps; on SIGTERM it prints
    one line and exits 143, as `pipeline` does."""
    python = tmp_path / "python"
    python.write_text(f"""#!{sys.executable}
import os, pathlib, signal, sys, time
args, ready = sys.argv[1:], pathlib.Path({str(tmp_path / 'ready')!r})
if args[:3] == ["-m", "pip", "wheel"]:
    if os.environ.get("BUILD") == "fail":
        sys.exit(3)
    if os.environ.get("BUILD") == "hang":
        ready.touch()
        time.sleep(600)
    wheel_dir = pathlib.Path(args[args.index("--wheel-dir") + 1])
    (wheel_dir / {WHEEL!r}).write_text("wheel")
elif args[:2] == ["-m", "pipeline"]:
    def stop(signum, frame):
        pathlib.Path({str(tmp_path / 'job.signal')!r}).write_text(str(signum))
        print("error: pipeline: stopped by SIGTERM", file=sys.stderr)
        sys.exit(143)
    signal.signal(signal.SIGTERM, stop)
    ready.touch()
    time.sleep(600)
""")
    python.chmod(0o755)
    return python


def start_dataflow(tmp_path: Path, **env: str) -> subprocess.Popen:
    python = fake_python(tmp_path)
    return subprocess.Popen(
        program("launch.dataflow", *DF_ARGS, f"--python={python}",
                f"--dist_dir={tmp_path / 'dist'}"),
        cwd=REPO, env=clean_env(**env), stderr=subprocess.PIPE, text=True)


def signal_when_ready(tmp_path: Path, proc: subprocess.Popen, signum: int) -> str:
    """Sends ``signum`` to the launcher once its child said it runs; its stderr."""
    for _ in range(1200):  # a bound for a child that never starts, not a speed bar
        if (tmp_path / "ready").exists() or proc.poll() is not None:
            break
        time.sleep(0.05)
    proc.send_signal(signum)
    _, err = proc.communicate(timeout=120)
    return err


def test_a_wheel_build_that_fails_is_a_run_time_failure(tmp_path):
    proc = start_dataflow(tmp_path, BUILD="fail")
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 1
    assert err.splitlines()[-1] == "error: building the project wheel failed (exit 3)"


def test_sigterm_goes_to_the_job_and_its_status_is_the_launchers(tmp_path):
    """The job says why it stopped; the launcher adds no line of its own."""
    proc = start_dataflow(tmp_path)
    err = signal_when_ready(tmp_path, proc, signal.SIGTERM)
    assert proc.returncode == 143, err
    assert (tmp_path / "job.signal").read_text() == str(int(signal.SIGTERM))
    assert err.splitlines()[-1] == "error: pipeline: stopped by SIGTERM"
    assert "mnist-launch-dataflow" not in err and "Traceback" not in err


def test_a_child_killed_by_the_signal_leaves_the_launcher_one_line(tmp_path):
    proc = start_dataflow(tmp_path, BUILD="hang")
    err = signal_when_ready(tmp_path, proc, signal.SIGHUP)
    assert proc.returncode == 129, err
    assert err.splitlines()[-1] == "error: mnist-launch-dataflow: stopped by SIGHUP"
    assert not (tmp_path / "job.signal").exists() and "Traceback" not in err
