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


# Subpackages: no two subpackages of one package import each other, directly
# or through others (launch.tpu and a launch.spot beside it, trainer.run and
# trainer.loop, ...). A subpackage may use its parent's modules, and the
# parent its subpackages.
CYCLE_FREE = ("launch", "pipeline", "trainer")


def _module_name(path: Path, root: Path) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imported(path: Path, module: str) -> set[str]:
    """The modules ``path`` (the module ``module``) imports, absolute."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join(parts + ([base] if base else []))
            found.add(base)
            found.update(f"{base}.{a.name}" for a in node.names)
    return found


def _sibling_cycles(root: Path, package: str) -> list[list[str]]:
    """Each group of sibling subpackages under ``package`` (in the tree at
    ``root``) that import each other in a cycle, sorted."""
    packages = sorted(_module_name(p, root) for p in (root / package).rglob("__init__.py"))
    edges: dict[str, set[str]] = {p: set() for p in packages}
    for path in (root / package).rglob("*.py"):
        module = _module_name(path, root)
        for name in _imported(path, module):
            for source, target in _sibling_pair(module, name, packages):
                edges[source].add(target)
    return _cycles(edges)


def _sibling_pair(module: str, name: str, packages: list[str]) -> list[tuple[str, str]]:
    """(A, B) when ``module`` is inside subpackage A and ``name`` inside its
    sibling B (the same parent), else nothing."""
    def within(dotted: str, package: str) -> bool:
        return dotted == package or dotted.startswith(package + ".")
    return [(a, b) for a in packages for b in packages
            if a != b and a.rpartition(".")[0] == b.rpartition(".")[0]
            and "." in a and within(module, a) and within(name, b)]


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected groups of more than one node."""
    def reach(start: str) -> set[str]:
        seen, todo = set(), [start]
        while todo:
            for nxt in edges[todo.pop()] - seen:
                seen.add(nxt)
                todo.append(nxt)
        return seen
    reached = {node: reach(node) for node in edges}
    groups = {tuple(sorted({node} | {o for o in reached[node] if node in reached[o]}))
              for node in edges}
    return sorted(list(g) for g in groups if len(g) > 1)


def test_no_two_subpackages_import_each_other():
    assert {package: _sibling_cycles(REPO, package) for package in CYCLE_FREE} == {
        package: [] for package in CYCLE_FREE}


def test_the_cycle_scan_finds_a_cycle_through_a_third_subpackage(tmp_path):
    """The scan above sees a cycle of three siblings, a relative import, and
    leaves a subpackage's use of its parent (and the parent's of it) alone."""
    files = {"app/__init__.py": "", "app/base.py": "from app.a import x\n",
             "app/a/__init__.py": "", "app/a/x.py": "from app import base\nfrom app.b import y\n",
             "app/b/__init__.py": "", "app/b/y.py": "from ..c import z\n",
             "app/c/__init__.py": "", "app/c/z.py": "import app.a.x\n",
             "app/d/__init__.py": "from app import a\n"}
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    assert _sibling_cycles(tmp_path, "app") == [["app.a", "app.b", "app.c"]]


# Stopping on a signal: one mechanism, in mnist_common/stop.py (its `Stopped`,
# the handlers set and put back, `deferred`); each program builds its policy
# on it. One class of each name a stop is known by, and only that module
# sets a signal's handler.
STOP_MODULE = Path("mnist_common/stop.py")
STOP_CLASSES = {"Stopped", "Interrupted"}


def _stop_findings(tree: ast.AST, where: str) -> tuple[list[str], list[str]]:
    """(the stop classes defined in ``tree``, its ``signal.signal`` calls)."""
    classes = [f"{node.name} {where}:{node.lineno}" for node in ast.walk(tree)
               if isinstance(node, ast.ClassDef) and node.name in STOP_CLASSES]
    handlers = [f"{where}:{node.lineno}" for node in ast.walk(tree)
                if isinstance(node, ast.Call) and _chain(node.func) == "signal.signal"]
    return classes, handlers


def test_one_stop_mechanism():
    """Each stop class is defined once, and only `mnist_common.stop` calls
    ``signal.signal``."""
    classes, handlers = [], []
    for package in (*PROGRAM_PACKAGES, "mnist_contract"):
        for path in _sources(REPO / package):
            relative = path.relative_to(REPO)
            found = _stop_findings(ast.parse(path.read_text(), str(path)), relative.as_posix())
            classes += found[0]
            if relative != STOP_MODULE:
                handlers += found[1]
    names = [entry.split()[0] for entry in classes]
    assert sorted(set(names)) == sorted(names) and "Stopped" in names, classes
    assert handlers == []


def test_the_stop_scan_finds_classes_and_handlers():
    """The scan above sees a nested class and a handler set inside a function."""
    source = ("import signal\nclass Stopped(BaseException): pass\n"
              "def f():\n    class Interrupted(Exception): pass\n"
              "    signal.signal(signal.SIGTERM, h)\nsignal.getsignal(signal.SIGINT)\n")
    classes, handlers = _stop_findings(ast.parse(source), "m.py")
    assert classes == ["Stopped m.py:2", "Interrupted m.py:4"]
    assert handlers == ["m.py:5"]
