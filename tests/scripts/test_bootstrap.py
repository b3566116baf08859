"""scripts/bootstrap.sh keeps .venv's project this checkout, installed
editable: a plain copy put over it (``pip install .``, the notebook's
install cell) or an editable install of another checkout is reinstalled,
though pyproject.toml, and so the stamp, did not change."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import REPO
from tests.launch.helpers import SCRIPTS, clean_env, fake_program


@pytest.fixture
def checkout(tmp_path):
    """A checkout with bootstrap.sh, pyproject.toml and a `launch` package,
    and a real .venv whose ``python -m pip`` only records its arguments;
    bootstrap has run once (the stamp is there)."""
    root = tmp_path / "co"
    (root / "scripts").mkdir(parents=True)
    shutil.copy2(SCRIPTS / "bootstrap.sh", root / "scripts")
    shutil.copy2(REPO / "pyproject.toml", root)
    (root / "launch").mkdir()
    (root / "launch" / "__init__.py").write_text("")
    venv = root / ".venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True,
                   timeout=300)
    python = venv / "bin" / "python"
    (venv / "bin" / "real-python").symlink_to(os.readlink(python))
    python.unlink()
    fake_program(python, f"""
if [ "$1 $2" = "-m pip" ]; then echo "$*" >> {tmp_path}/pip.log; exit 0; fi
exec {venv}/bin/real-python "$@"
""")
    bootstrap(root)
    (tmp_path / "pip.log").unlink()
    [site] = venv.glob("lib/python*/site-packages")
    return root, site, tmp_path / "pip.log"


def bootstrap(root: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in clean_env().items() if k not in ("PYTHON", "PYTHONPATH", "EXTRAS")}
    proc = subprocess.run(["bash", "-c", 'source "$1" && echo "$PYTHON"', "_",
                           str(root / "scripts" / "bootstrap.sh")], cwd=root, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == f"{root / '.venv' / 'bin' / 'python'}\n"
    return proc


def test_an_editable_install_of_this_checkout_is_kept(checkout):
    root, site, log = checkout
    (site / "_editable.pth").write_text(f"{root}\n")
    proc = bootstrap(root)
    assert not log.exists() and proc.stderr == ""


@pytest.mark.parametrize("where", ["a plain copy", "another checkout"])
def test_a_project_that_is_not_this_checkout_is_reinstalled_editable(checkout, tmp_path,
                                                                      where):
    root, site, log = checkout
    if where == "a plain copy":
        (site / "launch").mkdir()
        (site / "launch" / "__init__.py").write_text("")
    else:
        (tmp_path / "old" / "launch").mkdir(parents=True)
        (tmp_path / "old" / "launch" / "__init__.py").write_text("")
        (site / "_editable.pth").write_text(f"{tmp_path / 'old'}\n")
    proc = bootstrap(root)
    assert f"== {root / '.venv'}: the project there is not this checkout installed " \
           "editable" in proc.stderr
    assert log.read_text().splitlines()[-1] == (
        f"-m pip install -q -e {root}[pipeline,trainer,test]")
