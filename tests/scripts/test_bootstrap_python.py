"""``scripts/bootstrap.sh`` checks the interpreter it would make ``.venv`` from
against pyproject.toml's ``requires-python`` before it creates anything.

A stand-in ``python3`` (on PATH, or named by BOOTSTRAP_PYTHON) answers the
version query with the version the test gives it, and makes a stand-in
``.venv`` if it is asked to (``-m venv``). Outside the range the demo ends
with one line naming the Python to install, exit 1, and no ``.venv``.
"""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from tests.helpers import REPO
from tests.launch.helpers import fake_program

# Answers --version; ``-m venv DIR`` makes DIR/bin/python, a stand-in that
# records its arguments and does nothing.
STAND_IN = """
here="$(dirname "$0")"
echo "$*" >> "$here/../calls"
case "$1" in
  --version) echo "Python {version}" ;;
  -m) if [ "$2" = venv ]; then
        mkdir -p "$3/bin" && printf '#!/bin/sh\\necho "$*" >> %s\\n' "$here/../calls" \\
          > "$3/bin/python" && chmod +x "$3/bin/python"
      fi ;;
esac
"""


def make_repo(tmp_path):
    """A copy of the demo's scripts and pyproject.toml: its .venv goes there."""
    repo = tmp_path / "repo"
    (repo / "scripts").mkdir(parents=True)
    for name in ("run_local.sh", "bootstrap.sh"):
        shutil.copy(REPO / "scripts" / name, repo / "scripts" / name)
    shutil.copy(REPO / "pyproject.toml", repo / "pyproject.toml")
    return repo


def bootstrap(tmp_path, version: str, how: str) -> subprocess.CompletedProcess:
    repo = make_repo(tmp_path)
    (tmp_path / "bin").mkdir()
    fake_program(tmp_path / "bin" / "python3", STAND_IN.format(version=version))
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHON", "EXTRAS", "BOOTSTRAP_PYTHON")}
    env.update(DATA=str(tmp_path / "data"), MODEL_DIR=str(tmp_path / "model"))
    if how == "PATH":
        env["PATH"] = f"{tmp_path / 'bin'}{os.pathsep}{env['PATH']}"
    else:
        env["BOOTSTRAP_PYTHON"] = str(tmp_path / "bin" / "python3")
    return subprocess.run(["bash", str(repo / "scripts" / "run_local.sh")], env=env,
                          capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("how", ["PATH", "BOOTSTRAP_PYTHON"])
@pytest.mark.parametrize("version", ["3.13.1", "3.9.18"])
def test_a_python_outside_requires_python_is_named_before_anything_is_made(
        tmp_path, version, how):
    result = bootstrap(tmp_path, version, how)
    assert result.returncode == 1, result.stderr
    named = "python3" if how == "PATH" else f"BOOTSTRAP_PYTHON={tmp_path / 'bin' / 'python3'}"
    assert result.stderr.splitlines() == [
        f"error: {named} is Python {version}; the project needs Python >=3.10,<3.13 "
        "(pyproject.toml's requires-python): install Python 3.12 and set "
        "BOOTSTRAP_PYTHON=python3.12, or set PYTHON to an interpreter that has the project"]
    assert sorted(p.name for p in (tmp_path / "repo").iterdir()) == [
        "pyproject.toml", "scripts"]  # no .venv
    assert (tmp_path / "calls").read_text().splitlines() == ["--version"]
    assert not (tmp_path / "data").exists() and not (tmp_path / "model").exists()


def test_a_python_in_the_range_makes_the_venv(tmp_path):
    result = bootstrap(tmp_path, "3.12.7", "BOOTSTRAP_PYTHON")
    assert result.returncode == 0, result.stderr
    venv = tmp_path / "repo" / ".venv"
    made = (tmp_path / "calls").read_text().splitlines()
    assert made[:2] == ["--version", f"-m venv {venv}"]
    assert any(line.startswith("-m pip install -q -e ") for line in made)
    assert any(line.startswith("-m trainer ") for line in made)  # the demo went on


def test_an_interpreter_that_does_not_run_is_named(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHON", "EXTRAS")}
    env["BOOTSTRAP_PYTHON"] = str(tmp_path / "no-such-python")
    repo = make_repo(tmp_path)
    result = subprocess.run(["bash", "-c", "source scripts/bootstrap.sh"], env=env,
                            capture_output=True, text=True, timeout=60, cwd=repo)
    assert result.returncode == 1
    assert result.stderr.splitlines() == [
        f"error: BOOTSTRAP_PYTHON={tmp_path / 'no-such-python'}: not a Python interpreter "
        "that runs here; install Python >=3.10,<3.13 and set BOOTSTRAP_PYTHON to it"]
    assert not (repo / ".venv").exists()
