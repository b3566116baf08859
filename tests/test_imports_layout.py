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


# Deletes and moves: only mnist_common/local_paths.py calls the functions
# that delete or move a file or folder (it never follows a symbolic link);
# every other module of the programs goes through it, or through
# pipeline/storage.py's wrappers of it.
PROGRAM_PACKAGES = ("pipeline", "trainer", "launch", "mnist_common")
SAFE_MODULE = Path("mnist_common/local_paths.py")
ROUTED = {"local_paths", "storage"}  # receivers that route through SAFE_MODULE
ALWAYS = {"rmtree", "unlink", "rename", "renames", "removedirs", "rmdir", "move"}


def _chain(node: ast.AST) -> str:
    """``a.b.c`` of an attribute chain (calls in it as ``f()``), for matching."""
    if isinstance(node, ast.Attribute):
        return f"{_chain(node.value)}.{node.attr}"
    if isinstance(node, ast.Call):
        return f"{_chain(node.func)}()"
    return node.id if isinstance(node, ast.Name) else "?"


def _deletes_or_moves(call: ast.Call) -> bool:
    """Whether ``call`` deletes or moves a file: ``os.remove``, ``shutil.rmtree``,
    ``tf.io.gfile.rename``, ``Path.unlink``/``Path.replace``, Beam's
    ``FileSystems.delete``, ... (``list.remove``, ``str.replace`` and
    ``dataclasses.replace`` are not)."""
    if not isinstance(call.func, ast.Attribute):
        return False
    name, receiver = call.func.attr, _chain(call.func.value)
    if receiver.split(".")[0] in ROUTED:
        return False
    if name in ALWAYS:
        return True
    if name == "remove":
        return receiver == "os" or "gfile" in receiver
    if name == "replace":  # Path.replace(target): one argument, no keywords
        return receiver == "os" or (len(call.args) == 1 and not call.keywords)
    return name == "delete" and ("FileSystems" in receiver or "file_systems" in receiver)


def _findings(node: ast.AST, where: str, function: str = "") -> list[str]:
    """The deleting or moving calls and imports under ``node`` (in ``function``)."""
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        function = node.name
    found = []
    if isinstance(node, ast.Call) and _deletes_or_moves(node):
        found.append(f"{where}:{node.lineno} {_chain(node.func)}")
    elif isinstance(node, ast.ImportFrom) and node.module in ("os", "shutil"):
        found += [f"{where}:{node.lineno} from {node.module} import {a.name}"
                  for a in node.names if a.name in ALWAYS | {"remove", "replace"}]
    for child in ast.iter_child_nodes(node):
        found += _findings(child, where, function)
    return found


def _calls_outside_safe_module() -> list[str]:
    found = []
    for package in PROGRAM_PACKAGES:
        for path in _sources(REPO / package):
            relative = path.relative_to(REPO)
            if relative != SAFE_MODULE:
                found += _findings(ast.parse(path.read_text(), str(path)),
                                   relative.as_posix())
    return found


def test_only_local_paths_deletes_or_moves():
    """No module of the programs deletes or moves a file except through
    `mnist_common.local_paths`, which never does it through a symbolic link."""
    assert _calls_outside_safe_module() == []


def test_the_delete_scan_finds_each_kind_of_call():
    """The scan above sees every spelling it is meant to refuse."""
    source = ("import os, shutil\nos.remove(p)\nos.unlink(p)\nos.replace(a, b)\n"
              "shutil.rmtree(p)\nshutil.move(a, b)\ntf.io.gfile.rmtree(p)\n"
              "tf.io.gfile.remove(p)\ntf.io.gfile.rename(a, b, overwrite=True)\n"
              "Path(p).unlink()\npath.replace(target)\nFileSystems.delete([p])\n"
              "_file_systems().rename([a], [b])\n"
              "items.remove(x)\ntext.replace('a', 'b')\ndataclasses.replace(x, y=1)\n"
              "local_paths.remove_tree(p)\nstorage.rename([a], [b])\n")
    calls = [n for n in ast.walk(ast.parse(source)) if isinstance(n, ast.Call)]
    flagged = sorted(_chain(c.func) for c in calls if _deletes_or_moves(c))
    assert flagged == sorted([
        "os.remove", "os.unlink", "os.replace", "shutil.rmtree", "shutil.move",
        "tf.io.gfile.rmtree", "tf.io.gfile.remove", "tf.io.gfile.rename",
        "Path().unlink", "path.replace", "FileSystems.delete", "_file_systems().rename"])
