"""Checks of the cloud launchers and shell scripts in scripts/, offline.

Nothing here talks to Google Cloud. The launchers build their commands as
argv lists, so the tests read those lists (and the ``--dry_run`` output)
and check that a real run would have what it needs. Beam's own option
parser and stager read the Dataflow command, so a misspelt flag or a
package Beam would refuse to stage fails here, not at submission time. Real
execution paths are driven with a stand-in ``gcloud``/``python`` that only
records its arguments.
"""

from __future__ import annotations

import os
import shlex
import stat
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SCRIPTS = REPO / "scripts"
sys.path.insert(0, str(SCRIPTS))

import launch_common as lc  # noqa: E402
import launch_dataflow as ld  # noqa: E402
import launch_tpu_vm as lt  # noqa: E402

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]

PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
WHEEL = "{}-{}-py3-none-any.whl".format(
    PYPROJECT["project"]["name"].replace("-", "_"),
    PYPROJECT["project"]["version"])
SETTINGS_ENV = ("GOOGLE_CLOUD_PROJECT", "CLOUDSDK_CORE_PROJECT",
                "DATAFLOW_REGION", "CLOUDSDK_COMPUTE_REGION",
                "DATAFLOW_TEMP_LOCATION", "DATAFLOW_OUTPUT", "TPU_NAME",
                "TPU_ZONE", "CLOUDSDK_COMPUTE_ZONE", "TPU_ACCELERATOR_TYPE",
                "TPU_RUNTIME_VERSION")


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in SETTINGS_ENV}
    env.update(extra)
    return env


def run_script(name: str, *args: str, env: dict[str, str] | None = None):
    return subprocess.run(
        [sys.executable, str(SCRIPTS / name), *args], cwd=REPO,
        env=clean_env() if env is None else env, capture_output=True,
        text=True, timeout=120)


def fake_program(path: Path, body: str) -> Path:
    path.write_text("#!/usr/bin/env bash\n" + body)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def flag_values(cmd: list[str]) -> dict[str, str]:
    return dict(a[2:].split("=", 1) for a in cmd
                if a.startswith("--") and "=" in a)


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


def test_beam_reads_the_dataflow_flags_and_stages_the_wheel(tmp_path):
    from apache_beam.options.pipeline_options import (
        DebugOptions, GoogleCloudOptions, PipelineOptions, SetupOptions,
        StandardOptions, WorkerOptions)
    from apache_beam.runners.portability.stager import Stager

    cfg, (_, run) = dataflow_plan(
        "--max_num_workers=3", "--machine_type=n2-standard-4",
        "--experiments=use_runner_v2", "--no_build_isolation",
        dist_dir=tmp_path / "dist")
    wheel = lc.build_wheel(cfg.python, cfg.dist_dir, False, PYPROJECT)
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
    wheel = lc.build_wheel(sys.executable, tmp_path, False, PYPROJECT)
    assert wheel.name == WHEEL
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
        metadata = zf.read(f"{WHEEL.split('-py3')[0]}.dist-info/METADATA")
    for package in PYPROJECT["tool"]["setuptools"]["packages"]:
        expected = {p.relative_to(REPO).as_posix() for p in
                    (REPO / package).rglob("*.py")
                    if "__pycache__" not in p.parts}
        assert expected and expected <= names
    requires = [line.split(":", 1)[1] for line in
                metadata.decode().splitlines()
                if line.startswith("Requires-Dist:") and "extra ==" not in line]
    assert sorted(map(lc.requirement_name, requires)) == sorted(
        map(lc.requirement_name, PYPROJECT["project"]["dependencies"]))


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
    pyproject = lc.load_pyproject(repo / "pyproject.toml")
    wheel = lc.build_wheel(sys.executable, tmp_path / "dist", False,
                           pyproject, repo_root=repo)
    assert wheel.name == "demo_pkg-1.2-py3-none-any.whl"
    with zipfile.ZipFile(wheel) as zf:
        files = {n for n in zf.namelist() if not n.startswith("demo_pkg-")}
    assert files == {"pkg/__init__.py"}
    staged = tmp_path / "dist" / "src"
    assert (staged / "pkg" / "__init__.py").is_file()
    assert not list(staged.rglob("__pycache__"))


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
    proc = run_script("launch_dataflow.py", *DF_ARGS, f"--dist_dir={dist}",
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
    proc = run_script("launch_dataflow.py", *args, "--dry_run")
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
    proc = run_script("launch_dataflow.py", *args, "--dry_run")
    assert proc.returncode == 2
    assert len(proc.stderr.strip().splitlines()) == 1
    assert proc.stderr.startswith("error: " + message)


# ---------------------------------------------------------------- TPU VM

TPU_ARGS = ["--name=mnist-tpu", "--zone=us-central2-b",
            "--accelerator_type=v4-8", "--data=gs://bkt/mnist",
            "--model_dir=gs://bkt/runs/1"]


def tpu_plan(step: str, *extra: str, base=TPU_ARGS):
    args, rest = lt.parse_args([step, *base, *extra])
    cfg = lt.resolve_config(args, rest, environ={})
    return cfg, lt.plan(step, cfg, PYPROJECT)


def test_tpu_create_command():
    _, [cmd] = tpu_plan("create", "--spot", "--project=proj-1")
    assert cmd[:6] == ["gcloud", "compute", "tpus", "tpu-vm", "create",
                       "mnist-tpu"]
    flags = flag_values(cmd)
    assert flags["zone"] == "us-central2-b"
    assert flags["accelerator-type"] == "v4-8"
    assert flags["version"] == "tpu-ubuntu2204-base"
    assert flags["project"] == "proj-1"
    assert "--spot" in cmd


@pytest.mark.parametrize("accelerator,image", [
    ("v4-8", "tpu-ubuntu2204-base"), ("v5litepod-8", "v2-alpha-tpuv5-lite"),
    ("v5p-8", "v2-alpha-tpuv5"), ("v6e-8", "v2-alpha-tpuv6e"),
])
def test_tpu_default_runtime_per_accelerator(accelerator, image):
    base = [a for a in TPU_ARGS if not a.startswith("--accelerator_type")]
    _, [cmd] = tpu_plan("create", f"--accelerator_type={accelerator}",
                        base=base)
    assert flag_values(cmd)["version"] == image


def test_tpu_setup_copies_and_installs_on_every_worker(tmp_path):
    _, (build, scp, ssh) = tpu_plan("setup", f"--dist_dir={tmp_path}")
    assert build[1:4] == ["-m", "pip", "wheel"]
    assert scp[:5] == ["gcloud", "compute", "tpus", "tpu-vm", "scp"]
    assert "--worker=all" in scp and "--zone=us-central2-b" in scp
    assert scp[5:7] == [str(tmp_path / WHEEL), "mnist-tpu:"]
    assert ssh[:6] == ["gcloud", "compute", "tpus", "tpu-vm", "ssh",
                       "mnist-tpu"]
    assert "--worker=all" in ssh and "--zone=us-central2-b" in ssh
    script = flag_values(ssh)["command"]
    assert "tensorflow-tpu==2.20.0" in script
    assert lt.LIBTPU_FIND_LINKS in script
    assert f"--no-deps --force-reinstall {WHEEL}" in script
    subprocess.run(["bash", "-n", "-c", script], check=True)


def test_tpu_install_script_keeps_tpu_tensorflow(tmp_path):
    """Run the remote install script against a stand-in python3."""
    log = tmp_path / "calls.log"
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake_program(bin_dir / "python3", f"""
echo "$*" >> {shlex.quote(str(log))}
case "$*" in *"print(tf.__version__)"*) echo 2.20.0 ;; esac
""")
    cfg, _ = tpu_plan("setup", "--libtpu=libtpu==0.0.17")
    script = lt.install_script(cfg, PYPROJECT)
    env = dict(os.environ, HOME=str(tmp_path),
               PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    subprocess.run(["bash", "-c", script], check=True, env=env, timeout=30)
    calls = log.read_text().splitlines()
    pip = [c for c in calls if c.startswith("-m pip install")]
    assert pip[0].startswith("-m pip install --user tensorflow-tpu==2.20.0 "
                             "libtpu==0.0.17 -f ")
    # tf-keras pinned to the installed TensorFlow, and never pulling the
    # CPU-only tensorflow wheel in as its dependency.
    assert pip[1] == "-m pip install --user --no-deps tf-keras~=2.20.0"
    assert pip[2] == ("-m pip install --user --no-deps --force-reinstall "
                      + WHEEL)
    assert "import tensorflow as tf, tf_keras, trainer" in calls[-1]


def test_tpu_tf_runtime_image_keeps_its_tensorflow():
    cfg, (_, _, ssh) = tpu_plan(
        "setup", "--runtime_version=tpu-vm-tf-2.19.0-pjrt")
    assert cfg.tensorflow == lt.PREINSTALLED
    script = flag_values(ssh)["command"]
    assert "tensorflow-tpu" not in script
    assert '"tf-keras~=${TF_VERSION%.*}.0"' in script


def test_tpu_train_single_host_runs_on_all_workers_with_local_tpu():
    _, [cmd] = tpu_plan("train", "--loop=custom", "--epochs=3")
    assert cmd[:6] == ["gcloud", "compute", "tpus", "tpu-vm", "ssh",
                       "mnist-tpu"]
    assert "--worker=all" in cmd and "--zone=us-central2-b" in cmd
    remote = shlex.split(flag_values(cmd)["command"])
    assert remote[:3] == ["cd", "~", "&&"]
    trainer = remote[3:]
    assert trainer[:3] == ["python3", "-m", "trainer"]
    assert {"--strategy=tpu", "--tpu=local", "--data=gs://bkt/mnist",
            "--model_dir=gs://bkt/runs/1", "--loop=custom",
            "--epochs=3"} <= set(trainer)


def test_tpu_train_multi_host_uses_one_client_and_a_pod_image():
    base = [a for a in TPU_ARGS if not a.startswith("--accelerator_type")]
    _, [cmd] = tpu_plan("train", "--accelerator_type=v4-32",
                        "--runtime_version=tpu-vm-tf-2.19.0-pod-pjrt",
                        base=base)
    assert "--worker=0" in cmd
    remote = flag_values(cmd)["command"]
    assert "TPU_LOAD_LIBRARY=0 python3 -m trainer" in remote
    assert "--tpu=mnist-tpu" in remote and "--tpu=local" not in remote


def test_tpu_all_order_and_delete_after():
    _, cmds = tpu_plan("all", "--delete_after")
    verbs = [c[4] if c[0] == "gcloud" else "build" for c in cmds]
    assert verbs == ["create", "build", "scp", "ssh", "ssh", "delete"]
    assert cmds[-1][5:] == ["mnist-tpu", "--quiet", "--zone=us-central2-b"]
    _, cmds = tpu_plan("all")
    assert "delete" not in [c[4] for c in cmds if c[0] == "gcloud"]


def test_tpu_all_deletes_even_when_training_fails(tmp_path):
    log = tmp_path / "gcloud.log"
    gcloud = fake_program(tmp_path / "gcloud", f"""
printf '%s\\n' "$*" >> {shlex.quote(str(log))}
case "$*" in *"-m trainer"*) exit 3 ;; esac
exit 0
""")
    proc = run_script("launch_tpu_vm.py", "all", *TPU_ARGS, "--delete_after",
                      f"--gcloud={gcloud}", f"--dist_dir={tmp_path / 'd'}",
                      "--no_build_isolation")
    assert proc.returncode == 3, proc.stderr
    calls = log.read_text().splitlines()
    assert [c.split()[3] for c in calls] == ["create", "scp", "ssh", "ssh",
                                             "delete"]
    assert (tmp_path / "d" / WHEEL).is_file()  # what scp copied was built


def test_tpu_dry_run_subprocess_prints_gcloud_commands():
    proc = run_script("launch_tpu_vm.py", "all", *TPU_ARGS, "--dry_run")
    assert proc.returncode == 0, proc.stderr
    lines = [shlex.split(line) for line in proc.stdout.splitlines()]
    gcloud = [c for c in lines if c[0] == "gcloud"]
    assert [c[4] for c in gcloud] == ["create", "scp", "ssh", "ssh"]
    assert all("--worker=all" in c for c in gcloud[1:])
    assert "--version=tpu-ubuntu2204-base" in gcloud[0]
    assert "--accelerator-type=v4-8" in gcloud[0]


def test_tpu_settings_from_environment():
    args, rest = lt.parse_args(["create"])
    cfg = lt.resolve_config(args, rest, environ={
        "TPU_NAME": "env-tpu", "TPU_ZONE": "europe-west4-a",
        "TPU_ACCELERATOR_TYPE": "v5litepod-8",
        "TPU_RUNTIME_VERSION": "tpu-vm-tf-2.19.0-pjrt"})
    [cmd] = lt.create_commands(cfg)
    flags = flag_values(cmd)
    assert cmd[5] == "env-tpu"
    assert flags["zone"] == "europe-west4-a"
    assert flags["accelerator-type"] == "v5litepod-8"
    assert flags["version"] == "tpu-vm-tf-2.19.0-pjrt"


@pytest.mark.parametrize("step,drop,message", [
    ("create", "--name", "--name is required"),
    ("create", "--zone", "--zone is required"),
    ("create", "--accelerator_type", "--accelerator_type is required"),
    ("train", "--data", "--data is required"),
    ("train", "--model_dir", "--model_dir is required"),
    ("delete", "--zone", "--zone is required"),
])
def test_tpu_missing_setting_is_a_clear_error(step, drop, message):
    args = [a for a in TPU_ARGS if not a.startswith(drop + "=")]
    proc = run_script("launch_tpu_vm.py", step, *args, "--dry_run")
    assert proc.returncode == 2
    assert proc.stdout == ""
    assert len(proc.stderr.strip().splitlines()) == 1
    assert proc.stderr.startswith("error: " + message)


@pytest.mark.parametrize("extra,message", [
    (["--data=/local/mnist"], "--data must be a gs:// URI"),
    (["--accelerator_type=v4-32"], "v4-32 spans several hosts"),
    (["--accelerator_type=v4-32", "--runtime_version=tpu-ubuntu2204-base"],
     "v4-32 spans several hosts and needs a TensorFlow pod image"),
    (["--accelerator_type=tpu9-8"], "--accelerator_type 'tpu9-8' is not"),
    (["--tpu=other"], "--tpu is set by this launcher"),
])
def test_tpu_invalid_setting_is_a_clear_error(extra, message):
    keys = {e.split("=", 1)[0] for e in extra}
    args = [a for a in TPU_ARGS if a.split("=", 1)[0] not in keys]
    proc = run_script("launch_tpu_vm.py", "train", *args, *extra, "--dry_run")
    assert proc.returncode == 2
    assert len(proc.stderr.strip().splitlines()) == 1
    assert proc.stderr.startswith("error: " + message)


# ------------------------------------------------------------ shell scripts

@pytest.mark.parametrize("script", ["run_local.sh", "run_tests.sh"])
def test_shell_scripts_parse(script):
    subprocess.run(["bash", "-n", str(SCRIPTS / script)], check=True)


def _fake_python(tmp_path: Path) -> tuple[Path, Path]:
    log = tmp_path / "python.log"
    fake = fake_program(tmp_path / "python", f"""
printf '%s\\n' "$*" >> {shlex.quote(str(log))}
env | grep -E '^TF_CPP_MIN_LOG_LEVEL=' >> {shlex.quote(str(log))} || true
""")
    return fake, log


@pytest.mark.parametrize("loop", ["keras", "custom"])
def test_run_local_runs_pipeline_then_trainer(tmp_path, loop):
    fake, log = _fake_python(tmp_path)
    data, model = tmp_path / "data", tmp_path / "model"
    model.mkdir()
    (model / "stale").write_text("old run")
    env = clean_env(PYTHON=str(fake), LOOP=loop, DATA=str(data),
                    MODEL_DIR=str(model))
    subprocess.run(["bash", str(SCRIPTS / "run_local.sh"), "--epochs=1"],
                   check=True, env=env, capture_output=True, timeout=30)
    calls = [c for c in log.read_text().splitlines()
             if not c.startswith("TF_CPP")]
    assert calls[0].split() == [
        "-m", "pipeline", "--source=sample", f"--output={data}",
        "--runner=DirectRunner", "--overwrite"]
    assert calls[1].split() == [
        "-m", "trainer", f"--data={data}", f"--model_dir={model}",
        "--model=small", f"--loop={loop}", "--epochs=8", "--epochs=1"]
    assert not model.exists()  # a fresh run unless RESUME=1


def test_run_local_rejects_unknown_loop(tmp_path):
    fake, log = _fake_python(tmp_path)
    proc = subprocess.run(["bash", str(SCRIPTS / "run_local.sh")],
                          env=clean_env(PYTHON=str(fake), LOOP="fast"),
                          capture_output=True, text=True, timeout=30)
    assert proc.returncode == 2
    assert "LOOP must be keras or custom" in proc.stderr
    assert not log.exists()


def test_run_tests_calls_pytest_with_arguments(tmp_path):
    fake, log = _fake_python(tmp_path)
    env = clean_env(PYTHON=str(fake))
    env.pop("TF_CPP_MIN_LOG_LEVEL", None)
    subprocess.run(["bash", str(SCRIPTS / "run_tests.sh"), "-k", "x y"],
                   check=True, env=env, timeout=30)
    lines = log.read_text().splitlines()
    assert lines[0] == "-m pytest -q -k x y"
    assert "TF_CPP_MIN_LOG_LEVEL=2" in lines
