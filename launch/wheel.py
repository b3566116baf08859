"""The project's wheel: ``pyproject.toml`` read, and the wheel built from it.

Both launchers ship this project to machines that do not have its source: the
Dataflow launcher stages a wheel for Beam workers, the TPU VM launcher copies
one to every TPU host (`launch.staging` picks what to stage: this wheel, or
an installed copy's). The project is configured only by ``pyproject.toml``
(no ``setup.py``), so the wheel is built with ``pip wheel``, which runs the
PEP 517 backend named there. The build runs on a clean copy of the sources
because setuptools reuses an in-tree ``build/`` folder, and files left there
by an older build (a module since deleted, for example) would end up in the
wheel.
"""

from __future__ import annotations

import re
import shutil
import tempfile
from pathlib import Path
from typing import Callable, Mapping

from launch.errors import ConfigError, RunFailure
from launch.processes import Command, run_command
from mnist_common import local_paths


# The folder that holds the `launch` package: a checkout's root (with its
# pyproject.toml), or the site-packages folder of an installed copy
# (`launch.staging` tells which).
REPO_ROOT = Path(__file__).resolve().parent.parent
PYPROJECT = REPO_ROOT / "pyproject.toml"


def load_pyproject(path: Path = PYPROJECT) -> dict:
    """Parse ``pyproject.toml`` (tomllib on 3.11+, tomli on 3.10)."""
    try:
        import tomllib  # type: ignore[import-not-found]
    except ModuleNotFoundError:  # Python 3.10
        try:
            import tomli as tomllib  # type: ignore[no-redef]
        except ModuleNotFoundError as exc:
            raise ConfigError(
                "reading pyproject.toml on Python 3.10 needs the 'tomli' "
                "package (pip install tomli)") from exc
    try:
        with open(path, "rb") as fh:
            return tomllib.load(fh)
    except FileNotFoundError as exc:
        raise ConfigError(f"{path}: not found") from exc


def project_name_version(pyproject: Mapping) -> tuple[str, str]:
    project = pyproject.get("project", {})
    try:
        return project["name"], project["version"]
    except KeyError as exc:
        raise ConfigError(
            f"pyproject.toml: [project] has no {exc.args[0]!r}") from exc


def project_packages(pyproject: Mapping) -> list[str]:
    """The import packages the wheel carries ([tool.setuptools] packages)."""
    packages = (pyproject.get("tool", {}).get("setuptools", {})
                .get("packages"))
    if not packages or not isinstance(packages, list):
        raise ConfigError(
            "pyproject.toml: [tool.setuptools] packages is not a list")
    return list(packages)


def extra_requirements(pyproject: Mapping, extra: str) -> list[str]:
    extras = pyproject.get("project", {}).get("optional-dependencies", {})
    if extra not in extras:
        raise ConfigError(
            f"pyproject.toml: no optional dependency group {extra!r}")
    return list(extras[extra])


def requirement_name(requirement: str) -> str:
    """Normalized distribution name of a PEP 508 requirement string."""
    match = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", requirement)
    if not match:
        raise ConfigError(f"cannot read requirement {requirement!r}")
    return re.sub(r"[-_.]+", "-", match.group(1)).lower()


def wheel_filename(name: str, version: str) -> str:
    """File name ``pip wheel`` gives a pure-Python wheel of this project."""
    return f"{re.sub(r'[-_.]+', '_', name).lower()}-{version}-py3-none-any.whl"


def wheel_build_command(python: str, source_dir: Path | str,
                        wheel_dir: Path | str,
                        build_isolation: bool = True) -> Command:
    """``pip wheel`` for this project alone (dependencies install later).

    With build isolation (the default) pip fetches the build backend that
    pyproject.toml requires (setuptools>=68); ``build_isolation=False`` uses
    the setuptools already installed, for machines without an index.
    """
    cmd = [python, "-m", "pip", "wheel", "--no-deps"]
    if not build_isolation:
        cmd.append("--no-build-isolation")
    cmd += ["--wheel-dir", str(wheel_dir), str(source_dir)]
    return cmd


def stage_sources(dest: Path, pyproject: Mapping,
                  repo_root: Path = REPO_ROOT) -> Path:
    """Copy what the wheel is built from into ``dest``, an empty folder the
    caller just made (`build_in_staging`): nothing is deleted here."""
    shutil.copy2(repo_root / "pyproject.toml", dest / "pyproject.toml")
    readme = pyproject.get("project", {}).get("readme")
    if isinstance(readme, str) and (repo_root / readme).is_file():
        shutil.copy2(repo_root / readme, dest / readme)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.pyo")
    for package in project_packages(pyproject):
        top = package.split(".")[0]
        if not (repo_root / top).is_dir():
            raise RunFailure(f"package folder {repo_root / top} is missing")
        if not (dest / top).exists():
            shutil.copytree(repo_root / top, dest / top, ignore=ignore)
    return dest


# The staging folder a planned build names: `build_in_staging` makes it with
# tempfile.mkdtemp (this prefix and 8 random characters) when the build runs.
STAGING_PREFIX = "src-"
STAGING_PLACEHOLDER = STAGING_PREFIX + "XXXXXXXX"


def planned_build_command(python: str, dist_dir: Path, build_isolation: bool) -> Command:
    """The ``pip wheel`` of a checkout as planned (and printed by ``--dry_run``):
    its source, the last argument, is the staging folder made when it runs."""
    return wheel_build_command(python, dist_dir / STAGING_PLACEHOLDER, dist_dir,
                               build_isolation)


def build_in_staging(build: Command, dist_dir: Path, pyproject: Mapping,
                     repo_root: Path = REPO_ROOT,
                     run: Callable[[Command], int] | None = None) -> Path:
    """Runs the planned ``build`` on a clean copy of ``repo_root``; the wheel.

    The copy goes to a folder of the launch's own, made by mkdtemp inside
    ``dist_dir`` and removed after the build: nothing else in ``dist_dir``
    (a ``src`` folder of the user's) is touched but the wheel's own name.
    """
    run = run or run_command
    wheel = dist_dir / wheel_filename(*project_name_version(pyproject))
    dist_dir.mkdir(parents=True, exist_ok=True)
    if wheel.is_file() or wheel.is_symlink():
        local_paths.remove_file(str(wheel))
    staging = Path(tempfile.mkdtemp(prefix=STAGING_PREFIX, dir=dist_dir))
    try:
        stage_sources(staging, pyproject, repo_root)
        rc = run([*build[:-1], str(staging)])
    finally:
        local_paths.remove_tree(str(staging))  # made above by mkdtemp, this launch's own
    check_wheel_build(rc, wheel)
    return wheel


def check_wheel_build(rc: int, wheel: Path) -> None:
    if rc != 0:
        raise RunFailure(f"building the project wheel failed (exit {rc})")
    if not wheel.is_file():
        raise RunFailure(f"the wheel build did not produce {wheel}")


def build_wheel(python: str, dist_dir: Path, build_isolation: bool,
                pyproject: Mapping, repo_root: Path = REPO_ROOT) -> Path:
    """Build the project wheel of the checkout ``repo_root`` into ``dist_dir``
    and return its path."""
    return build_in_staging(planned_build_command(python, dist_dir, build_isolation),
                            dist_dir, pyproject, repo_root)
