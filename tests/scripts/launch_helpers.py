"""What the launcher tests share: the project's pyproject and wheel name, the
scripts run as a user runs them (without the caller's cloud settings),
stand-in programs on PATH, the flags of a planned command, and a TPU VM host
that answers ``wait``'s status checks from a script.

The launchers build their commands as argv lists, so the tests read those
lists; ``scripts/`` goes on ``sys.path`` so they import the launchers'
modules as the scripts do.
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

from tests.helpers import REPO

SCRIPTS = REPO / "scripts"
sys.path.insert(0, str(SCRIPTS))

import launch_tpu_vm as lt  # noqa: E402
import tpu_vm_commands as tc  # noqa: E402

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


# --------------------------------------------------------------- TPU VM

TPU_ARGS = ["--name=mnist-tpu", "--zone=us-central2-b",
            "--accelerator_type=v4-8", "--data=gs://bkt/mnist",
            "--model_dir=gs://bkt/runs/1"]


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


def wait_with(host: FakeHost, *extra: str) -> int:
    cfg, [cmd] = tpu_plan("wait", "--poll_seconds=30", *extra)
    return lt.wait_for_trainer(cfg, cmd, run=host.run, sleep=host.sleep,
                               clock=lambda: host.now)


RUNNING = (0, status_line("running pid=12") + "\n")
