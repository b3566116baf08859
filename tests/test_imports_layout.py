"""How modules find each other: from the repository's root, as packages.

No module edits the module search path (the benchmarks run as ``python -m
benchmarks.NAME``, the tests through pytest's ``pythonpath``), and no test
module imports another: what tests share lives in helper modules
(tests/helpers.py, tests/trainer_data.py, tests/<part>/*helpers*.py, ...).
"""

from __future__ import annotations

import ast
from pathlib import Path

from tests.helpers import REPO

SKIPPED = {".venv", "build", "__pycache__", ".git"}


def _sources(root: Path) -> list[Path]:
    return [p for p in root.rglob("*.py") if not SKIPPED & set(p.relative_to(REPO).parts)]


def _is_test_module(name: str) -> bool:
    return name.split(".")[-1].startswith("test_")


def test_no_module_edits_sys_path():
    found = []
    for path in _sources(REPO):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if (isinstance(node, ast.Attribute) and node.attr == "path"
                    and isinstance(node.value, ast.Name) and node.value.id == "sys"):
                found.append(f"{path.relative_to(REPO)}:{node.lineno}")
    assert found == []


def test_no_test_module_imports_another():
    found = []
    for path in _sources(REPO / "tests"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("tests"):
                names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level:  # relative: from .x
                names = [node.module or ""] + [a.name for a in node.names]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names if a.name.startswith("tests")]
            else:
                continue
            if any(_is_test_module(name) for name in names):
                found.append(f"{path.relative_to(REPO)}:{node.lineno}")
    assert found == []
