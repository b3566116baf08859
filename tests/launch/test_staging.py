"""What the launchers stage (`launch.staging`), and what they may delete.

In a checkout the launcher builds the checkout's wheel, in a staging folder
of its own inside ``--dist_dir`` that it removes; ``--source_dir`` builds
another checkout; installed from a wheel into a venv outside any checkout,
it packs the installed files back into that wheel. One line says which.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from launch import errors as le
from launch import wheel as lw
from launch.tpu import commands as tc
from tests.helpers import REPO
from tests.launch.helpers import (PYPROJECT, RUN_ID, TPU_ARGS, WHEEL, clean_env, fake_program,
                                  run_program, tpu_plan)

DF_ARGS = ["--project=p", "--region=us-central1", "--temp_location=gs://my-bucket/tmp",
           "--output=gs://my-bucket/mnist"]
CHECKOUT_LINE = f"staging: mnist-tpu 0.1.0, a wheel built from the checkout {REPO}"


def recording_python(tmp_path: Path) -> Path:
    """A ``--python`` that, for ``pip wheel``, notes the folder it builds
    from (and whether it holds pyproject.toml) and writes a wheel; any other
    command succeeds."""
    return fake_program(tmp_path / "python", f"""
if [ "$2 $3" = "pip wheel" ]; then
  for arg; do src="$arg"; done
  echo "$src $([ -f "$src/pyproject.toml" ] && echo staged)" >> {tmp_path}/builds
  while [ "$1" != --wheel-dir ]; do shift; done
  echo wheel > "$2/{WHEEL}"
fi
""")


@pytest.mark.parametrize("launcher", ["dataflow", "tpu"])
@pytest.mark.parametrize("kind", ["folder", "symlink"])
def test_dist_dir_src_of_the_users_is_never_deleted(tmp_path, launcher, kind):
    """--dist_dir=DIR with a DIR/src of the user's (a folder, or a symlink to
    one): it stays as it was; the build stages in DIR/src-XXXXXXXX, made for
    it and removed after it."""
    dist = tmp_path / "home"
    mine = tmp_path / "elsewhere" if kind == "symlink" else dist / "src"
    (mine / "myproject").mkdir(parents=True)
    (mine / "myproject" / "main.c").write_text("int main;\n")
    if kind == "symlink":
        dist.mkdir()
        (dist / "src").symlink_to(mine)
    python = recording_python(tmp_path)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    marked = json.dumps({"state": "READY", "labels": {tc.MARK_KEY: RUN_ID}})
    fake_program(bin_dir / "gcloud",
                 f"case \"$*\" in *describe*) echo '{marked}';; esac\nexit 0\n")
    env = clean_env(PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    if launcher == "dataflow":
        proc = run_program("launch.dataflow", *DF_ARGS, f"--python={python}",
                          f"--dist_dir={dist}", env=env)
    else:
        proc = run_program("launch.tpu", "setup", *TPU_ARGS, f"--python={python}",
                          f"--dist_dir={dist}", env=env)
    assert proc.returncode == 0, proc.stderr
    assert (dist / "src" / "myproject" / "main.c").read_text() == "int main;\n"
    assert (dist / "src").is_symlink() == (kind == "symlink")
    [build] = (tmp_path / "builds").read_text().splitlines()
    staged, note = build.split()
    assert Path(staged).parent == dist and Path(staged).name.startswith("src-")
    assert note == "staged" and not Path(staged).exists()
    assert CHECKOUT_LINE in proc.stderr.splitlines()


def test_source_dir_builds_that_checkout(tmp_path):
    """--source_dir=CHECKOUT: its pyproject.toml names the wheel and its files
    are staged; the line names it."""
    checkout = tmp_path / "co"
    checkout.mkdir()
    (checkout / "pyproject.toml").write_text(
        (REPO / "pyproject.toml").read_text().replace('version = "0.1.0"', 'version = "9.9"'))
    cfg, _ = tpu_plan("setup", f"--source_dir={checkout}", f"--dist_dir={tmp_path / 'd'}")
    assert cfg.wheel_source.root == checkout.resolve() and not cfg.wheel_source.installed
    pyproject = cfg.wheel_source.project()
    _describe, build, scp, _ = tc.plan("setup", cfg, pyproject)
    assert build[1:4] == ["-m", "pip", "wheel"]
    assert scp[5] == str(tmp_path / "d" / "mnist_tpu-9.9-py3-none-any.whl")
    assert cfg.wheel_source.line(pyproject) == (
        f"staging: mnist-tpu 9.9, a wheel built from the checkout {checkout.resolve()}")
    with pytest.raises(le.RunFailure, match="package folder .*co/launch is missing"):
        lw.build_wheel(sys.executable, tmp_path / "d", False, pyproject, checkout)
    assert not (checkout / "launch").exists() and list((tmp_path / "d").iterdir()) == []


@pytest.mark.parametrize("module, argv", [
    ("launch.dataflow", DF_ARGS), ("launch.tpu", ["setup", *TPU_ARGS])])
def test_source_dir_without_pyproject_is_one_line(tmp_path, module, argv):
    proc = run_program(module, *argv, f"--source_dir={tmp_path}", "--dry_run")
    assert (proc.returncode, proc.stdout) == (2, "")
    assert proc.stderr.splitlines() == [f"error: --source_dir={tmp_path}: no pyproject.toml "
                                        "there; name a checkout of the project"]


# ------------------------------------------- installed in a venv of its own

@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """The project's wheel (built as the launchers build it, offline),
    installed with --no-deps into a new venv outside the checkout: the
    launchers need only the standard library and the project's own packages."""
    tmp = tmp_path_factory.mktemp("installed")
    wheel = lw.build_wheel(sys.executable, tmp / "wheelhouse", False, PYPROJECT)
    venv = tmp / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True,
                   timeout=300)
    subprocess.run([sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"),
                    "install", "-q", "--no-deps", "--no-index", str(wheel)], check=True,
                   capture_output=True, timeout=300)
    (tmp / "elsewhere").mkdir()
    (tmp / "home").mkdir()
    env = {k: v for k, v in clean_env(HOME=str(tmp / "home")).items()
           if k not in ("PYTHONPATH", "XDG_CACHE_HOME", "VIRTUAL_ENV")}
    site = subprocess.run([str(venv / "bin" / "python"), "-c",
                           "import launch, pathlib; print(pathlib.Path(launch.__file__)"
                           ".resolve().parent.parent)"],
                          cwd=tmp / "elsewhere", env=env, capture_output=True, text=True,
                          check=True, timeout=120).stdout.strip()
    return tmp, venv, wheel, Path(site), env


def run_installed(installed, *argv: str) -> subprocess.CompletedProcess:
    tmp, venv, _, _, env = installed
    return subprocess.run([str(venv / "bin" / argv[0]), *argv[1:]], cwd=tmp / "elsewhere",
                          env=env, capture_output=True, text=True, timeout=120)


@pytest.mark.slow
@pytest.mark.parametrize("argv", [
    ["mnist-launch-dataflow", *DF_ARGS, "--dry_run"],
    ["mnist-launch-tpu", "setup", *TPU_ARGS, "--dry_run"],
    ["mnist-launch-tpu", "run", "--spot", *TPU_ARGS, "--dry_run"],
    ["mnist-launch-tpu", "all", *TPU_ARGS, "--delete_after", "--dry_run"]])
def test_an_installed_launcher_stages_the_installed_distribution(installed, argv):
    """From a folder outside the checkout, with no pyproject.toml anywhere:
    exit 0, one line saying the installed files are staged, the wheel in the
    user's cache, no build command and nothing written."""
    tmp, _, _, site, _ = installed
    assert not str(site).startswith(str(REPO))
    proc = run_installed(installed, *argv)
    assert proc.returncode == 0, proc.stderr
    assert (f"staging: mnist-tpu 0.1.0 as installed in {site} (its files, packed into a "
            "wheel)") in proc.stderr.splitlines()
    assert "pip wheel" not in proc.stdout
    cache = tmp / "home" / ".cache" / "mnist-tpu" / "dist"
    assert str(cache / ("dataflow" if "dataflow" in argv[0] else "tpu_vm") / WHEEL) in proc.stdout
    assert not (tmp / "home" / ".cache").exists()


@pytest.mark.slow
def test_an_installed_tpu_status_needs_no_checkout(installed):
    proc = run_installed(installed, "mnist-launch-tpu", "status", "--name=mnist-tpu",
                         "--zone=us-central2-b", "--run_id=test-run-1", "--dry_run")
    assert proc.returncode == 0, proc.stderr
    describe, ssh = proc.stdout.splitlines()[:2]
    assert describe.startswith("gcloud compute tpus tpu-vm describe mnist-tpu ")
    assert ssh.startswith("gcloud compute tpus tpu-vm ssh mnist-tpu ")


@pytest.mark.slow
def test_an_installed_launcher_stages_the_wheel_it_was_installed_from(installed, tmp_path):
    """A real run (the job's python a stand-in): the wheel staged holds every
    file of the wheel installed, byte for byte, with a RECORD that lists them."""
    _, _, wheel, _, _ = installed
    python = fake_program(tmp_path / "python", f'echo "$@" > {tmp_path}/job\n')
    proc = run_installed(installed, "mnist-launch-dataflow", *DF_ARGS, f"--python={python}",
                         f"--dist_dir={tmp_path / 'dist'}")
    assert proc.returncode == 0, proc.stderr
    staged = tmp_path / "dist" / WHEEL
    assert f"--extra_package={staged}" in (tmp_path / "job").read_text().split()
    record = f"{WHEEL.split('-py3')[0]}.dist-info/RECORD"
    with zipfile.ZipFile(wheel) as want, zipfile.ZipFile(staged) as got:
        assert sorted(got.namelist()) == sorted(want.namelist())
        for name in want.namelist():
            if name != record:
                assert got.read(name) == want.read(name), name
        listed = {line.split(",")[0] for line in got.read(record).decode().splitlines()}
    assert listed == set(want.namelist())
    requirements = (tmp_path / "dist" / "dataflow-requirements.txt").read_text().split()
    assert "tensorflow==2.21.0" in requirements
    assert not any(r.startswith("apache-beam") for r in requirements)


@pytest.mark.slow
def test_python_m_of_an_installed_copy_says_what_it_stages(installed):
    """``python -m launch.dataflow`` with an interpreter that has a plain copy
    installed, outside the checkout, runs that copy and says so;
    ``--source_dir`` names the checkout to stage instead."""
    tmp, venv, _, site, env = installed
    script = [str(venv / "bin" / "python"), "-m", "launch.dataflow", *DF_ARGS, "--dry_run"]
    for extra, line in [([], f"staging: mnist-tpu 0.1.0 as installed in {site} (its files, "
                            "packed into a wheel)"),
                        ([f"--source_dir={REPO}"], CHECKOUT_LINE)]:
        proc = subprocess.run(script + extra, cwd=tmp / "elsewhere", env=env,
                              capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr
        assert line in proc.stderr.splitlines()
