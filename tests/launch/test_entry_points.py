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


def _launch(*args):
    return subprocess.run([sys.executable, "-m", "launch", *args], cwd=REPO, env=clean_env(),
                          capture_output=True, text=True, timeout=120)


def test_python_m_launch_runs_either_launcher():
    from launch.__main__ import main
    module, _, name = PYPROJECT["project"]["scripts"]["mnist-launch"].partition(":")
    assert getattr(importlib.import_module(module), name) is main
    tpu = _launch("tpu", "crate")
    assert tpu.returncode == 2
    assert tpu.stderr.startswith("error: argument step: invalid choice: 'crate'"), tpu.stderr
    for name in ("tpu", "dataflow"):
        usage = _launch(name, "--help")
        assert usage.returncode == 0
        assert usage.stdout.startswith(f"usage: python -m launch {name} "), usage.stdout
    dry = _launch("dataflow", "--dry_run", "--project=p", "--region=r",
                  "--temp_location=gs://b/tmp", "--output=gs://b/mnist")
    assert dry.returncode == 0 and "--runner=DataflowRunner" in dry.stdout, dry.stderr


@pytest.mark.parametrize("args, status, first", [
    ((), 2, "usage: python -m launch {dataflow,tpu} [ARGS]"),
    (("--help",), 0, "usage: python -m launch {dataflow,tpu} [ARGS]"),
    (("tpus",), 2, "error: python -m launch: no launcher 'tpus' (one of: dataflow, tpu)")])
def test_python_m_launch_names_its_launchers(args, status, first):
    proc = _launch(*args)
    assert proc.returncode == status
    assert (proc.stdout or proc.stderr).splitlines()[0] == first
