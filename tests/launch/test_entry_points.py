"""The launchers' commands: the installed entry points name the package's
``main`` functions, and ``python -m launch.tpu`` runs the TPU VM launcher."""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest

from launch.dataflow import main as dataflow_main
from launch.tpu.cli import main as tpu_main
from tests.helpers import REPO
from tests.launch.helpers import PYPROJECT, clean_env


@pytest.mark.parametrize("command, main", [("mnist-launch-dataflow", dataflow_main),
                                           ("mnist-launch-tpu", tpu_main)])
def test_entry_point_is_the_launchers_main(command, main):
    module, _, name = PYPROJECT["project"]["scripts"][command].partition(":")
    assert getattr(importlib.import_module(module), name) is main


def test_python_m_launch_tpu_runs_the_launcher():
    proc = subprocess.run([sys.executable, "-m", "launch.tpu", "crate"], cwd=REPO,
                          env=clean_env(), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.startswith("error: argument step: invalid choice: 'crate'"), proc.stderr
    usage = subprocess.run([sys.executable, "-m", "launch.tpu", "--help"], cwd=REPO,
                           env=clean_env(), capture_output=True, text=True, timeout=120)
    assert usage.returncode == 0 and usage.stdout.startswith("usage: python -m launch.tpu ")
