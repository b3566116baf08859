"""What the launcher tests share: the project's pyproject and wheel name, the
launchers run as a user runs them (``python -m``, without the caller's cloud settings),
stand-in programs on PATH, the flags of a planned command, and a TPU VM host
that answers ``wait``'s status checks from a script.

The launchers build their commands as argv lists, so the tests read those
lists from the `launch` package's modules.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import stat
import subprocess
import sys
import time
from pathlib import Path

from launch import wheel as lw
from launch.tpu import cli as lt
from launch.tpu import cloud as tpu_cloud
from launch.tpu import commands as tc
from launch.tpu.config import TpuConfig
from launch.tpu import states as ts
from tests.helpers import REPO

SCRIPTS = REPO / "scripts"
FAKE_GCLOUD = Path(__file__).resolve().parent / "fake_gcloud.py"

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


def program(module: str, *args: str) -> list[str]:
    """The command line of ``python -m MODULE ARGS`` in this Python."""
    return [sys.executable, "-m", module, *args]


def run_program(module: str, *args: str, env: dict[str, str] | None = None):
    """``python -m MODULE ARGS`` from the checkout's root, finished."""
    return subprocess.run(
        program(module, *args), cwd=REPO,
        env=clean_env() if env is None else env, capture_output=True,
        text=True, timeout=120)


def write_fake_gcloud(bin_dir: Path) -> Path:
    """``bin_dir/gcloud``: `tests.launch.fake_gcloud` run by this Python, with
    the checkout on its PYTHONPATH for its ``tests.launch`` imports."""
    gcloud = bin_dir / "gcloud"
    gcloud.write_text(f'#!/bin/sh\nPYTHONPATH={REPO} exec {sys.executable} {FAKE_GCLOUD} "$@"\n')
    gcloud.chmod(0o755)
    return gcloud


def fake_gcloud_env(tmp_path: Path, cloud_root: Path, **extra: str) -> dict[str, str]:
    """`clean_env` with the fake gcloud (written to ``tmp_path/bin``) first on
    PATH, answering from the fake cloud at ``cloud_root``."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    write_fake_gcloud(bin_dir)
    return clean_env(FAKE_CLOUD=str(cloud_root), PATH=f"{bin_dir}:{os.environ['PATH']}",
                     **extra)


def as_planned(text: str) -> str:
    """``text`` with the wheel build's staging folder (named by mkdtemp when
    the build runs) as ``--dry_run`` prints it (`lw.STAGING_PLACEHOLDER`)."""
    return re.sub(rf"/{lw.STAGING_PREFIX}[a-z0-9_]{{8}}(?=[\s']|$)",
                  f"/{lw.STAGING_PLACEHOLDER}", text, flags=re.MULTILINE)


def fake_program(path: Path, body: str) -> Path:
    path.write_text("#!/usr/bin/env bash\n" + body)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def flag_values(cmd: list[str]) -> dict[str, str]:
    return dict(a[2:].split("=", 1) for a in cmd
                if a.startswith("--") and "=" in a)


# --------------------------------------------------------------- TPU VM

# The run id (label mnist-run) the VM of TPU_ARGS is made with and checked for.
RUN_ID = "test-run-1"
TPU_ARGS = ["--name=mnist-tpu", "--zone=us-central2-b",
            "--accelerator_type=v4-8", "--data=gs://bkt/mnist",
            "--model_dir=gs://bkt/runs/1", f"--run_id={RUN_ID}"]


def tpu_plan(step: str, *extra: str, base=TPU_ARGS):
    args, rest = lt.parse_args([step, *base, *extra])
    cfg = lt.resolve_config(args, rest, environ={})
    return cfg, tc.plan(step, cfg, PYPROJECT)


def status_line(state: str, host: str = "t1-w-0") -> str:
    return f"{tc.STATUS_PREFIX} {state} on {host}"


class FakeHost:
    """Answers status checks from a script of ``(exit code, output)``."""

    def __init__(self, answers):
        self.answers = list(answers)
        self.calls = 0
        self.slept = []
        self.now = 0.0

    def run(self, cmd):
        self.calls += 1
        return self.answers.pop(0)

    def sleep(self, seconds):
        self.slept.append(seconds)
        self.now += seconds


def described(cfg: TpuConfig, state: str = "READY") -> str:
    """``describe --format=json``'s answer for ``cfg``'s VM, marked as its."""
    return json.dumps({"name": cfg.name, "state": state,
                       "labels": {tc.MARK_KEY: cfg.run_id}})


def wait_with(host: FakeHost, *extra: str) -> int:
    """``wait`` (its describe answered READY, with the mark) against ``host``."""
    cfg, [describe, cmd] = tpu_plan("wait", "--poll_seconds=30", *extra)
    cloud = tpu_cloud.Cloud(cfg, PYPROJECT, {"describe": [describe], "wait": [cmd]},
                            run=lambda cmd: (*host.run(cmd), ""))
    cloud.ask = lambda cmd: (0, described(cfg), "") if cmd == describe else cloud.run(cmd)
    assert cloud.check() == 0
    return tpu_cloud.wait_for_trainer(cloud, sleep=host.sleep, clock=lambda: host.now)


RUNNING = (0, status_line("running pid=12") + "\n")


def release_trainer(tmp_path: Path, status: int) -> None:
    """Lets `host_env`'s trainer exit with ``status``: the file appears
    whole (renamed into place), never empty to a trainer polling for it."""
    partial = tmp_path / "release.partial"
    partial.write_text(str(status))
    partial.rename(tmp_path / "release")


def host_env(tmp_path: Path) -> dict[str, str]:
    """A stand-in TPU host: HOME in tmp_path, a python3 that plays trainer.

    The trainer records its arguments, prints a line, then waits for the
    file ``release`` and exits with the status written in it.
    """
    home = tmp_path / "home"
    bin_dir = tmp_path / "bin"
    home.mkdir()
    bin_dir.mkdir()
    release = shlex.quote(str(tmp_path / "release"))
    fake_program(bin_dir / "python3", f"""
printf '%s\\n' "$@" > {shlex.quote(str(tmp_path / 'trainer.args'))}
echo "trainer says hello"
echo "to stderr" >&2
for _ in $(seq 6000); do [ -f {release} ] && exit "$(cat {release})"; sleep 0.05; done
exit 99
""")
    return dict(os.environ, HOME=str(home),
                PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}")


def run_remote(script: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "-c", script], env=env, capture_output=True,
                          text=True, timeout=60)


def remote_state(env: dict[str, str]) -> tuple[str, int | None]:
    proc = run_remote(tc.status_script(), env)
    assert proc.returncode == 0, proc.stderr
    [state] = ts.parse_status(proc.stdout)
    return state


def wait_remote_exit(env: dict[str, str]) -> tuple[str, int | None]:
    for _ in range(600):  # a bound for a broken script, not a speed bar
        state = remote_state(env)
        if state[0] != "running":
            return state
        time.sleep(0.1)
    raise AssertionError("the trainer never finished")
