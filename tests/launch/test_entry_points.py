"""Each program starts two ways, its console script and ``python -m MODULE``,
both running the same ``main``; no other form exists (no dispatcher, no
script in scripts/, no module that runs itself besides these), and the
usage line names the command typed."""

from __future__ import annotations

import ast
import importlib
import subprocess
import sys

import pytest

from tests.helpers import REPO
from tests.launch.helpers import PYPROJECT, clean_env, run_program

# console script -> (the module ``python -m`` runs, the function both run)
PROGRAMS = {
    "mnist-pipeline": ("pipeline", "pipeline.__main__:main"),
    "mnist-verify": ("pipeline.verify", "pipeline.verify:main"),
    "mnist-trainer": ("trainer", "trainer.__main__:main"),
    "mnist-predict": ("trainer.predict", "trainer.predict:command"),
    "mnist-check-trainer-flags": ("trainer.check_flags", "trainer.check_flags:main"),
    "mnist-launch-dataflow": ("launch.dataflow", "launch.dataflow:main"),
    "mnist-launch-tpu": ("launch.tpu", "launch.tpu.cli:main"),
}
# The packages of the programs (benchmarks/ is not one: its scripts are tools).
PACKAGES = ("pipeline", "trainer", "launch", "mnist_common", "mnist_contract")


def _function(entry: str):
    module, _, name = entry.partition(":")
    return getattr(importlib.import_module(module), name)


def test_the_console_scripts_are_the_programs():
    assert PYPROJECT["project"]["scripts"] == {
        script: entry for script, (_, entry) in PROGRAMS.items()}


def _runs_itself(path) -> bool:
    """``__main__.py``, or a module with an ``if __name__ == "__main__":`` block."""
    if path.name == "__main__.py":
        return True
    return any(isinstance(node, ast.Compare) and isinstance(node.left, ast.Name)
               and node.left.id == "__name__"
               and any(isinstance(c, ast.Constant) and c.value == "__main__"
                       for c in node.comparators)
               for node in ast.walk(ast.parse(path.read_text(), str(path))))


def test_the_modules_that_run_are_the_programs_python_m_modules():
    """The modules ``python -m`` runs are exactly the programs' own: not
    ``launch`` (a dispatcher) nor ``launch.tpu.cli``; and scripts/ holds
    shell scripts only."""
    runnable = set()
    for package in PACKAGES:
        for path in sorted((REPO / package).rglob("*.py")):
            if "__pycache__" not in path.parts and _runs_itself(path):
                parts = path.relative_to(REPO).with_suffix("").parts
                runnable.add(".".join(parts[:-1] if parts[-1] == "__main__" else parts))
    assert runnable == {module for module, _ in PROGRAMS.values()}
    assert sorted(p.name for p in (REPO / "scripts").iterdir() if p.suffix != ".sh") == []


@pytest.mark.parametrize("module", ["launch", "launch.tpu.cli"])
def test_a_removed_form_runs_nothing(module):
    proc = run_program(module, "--help")
    assert proc.stdout == "" and "usage:" not in proc.stderr, proc.stderr


@pytest.mark.parametrize("module, first", [
    ("launch.tpu", "error: argument step: invalid choice: 'crate'"),
    ("launch.dataflow", "error: --project is required")])
def test_python_m_runs_the_launcher_and_its_usage_names_it(module, first):
    proc = run_program(module, "crate" if module == "launch.tpu" else "--dry_run")
    assert proc.returncode == 2
    assert proc.stderr.startswith(first), proc.stderr
    usage = subprocess.run([sys.executable, "-m", module, "--help"], cwd=REPO,
                           env=clean_env(), capture_output=True, text=True, timeout=120)
    assert usage.returncode == 0 and usage.stdout.startswith(f"usage: python -m {module} ")


@pytest.mark.parametrize("script", ["mnist-launch-dataflow", "mnist-launch-tpu"])
def test_a_launchers_console_script_names_itself_in_its_usage(script, monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", [f"/somewhere/bin/{script}", "--help"])
    with pytest.raises(SystemExit) as done:
        _function(PROGRAMS[script][1])()
    assert done.value.code == 0
    assert capsys.readouterr().out.startswith(f"usage: {script} ")
