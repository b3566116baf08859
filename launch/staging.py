"""Which project a launcher stages, and the wheel it stages.

A launcher ships the project it is part of. In a checkout (an editable
install, or ``python -m launch.tpu`` run from the root) that is the
checkout: its wheel is built with ``pip wheel``
(`launch.wheel.build_in_staging`). Installed
from a wheel (``pip install '.[pipeline]'``), there is no pyproject.toml
beside the package, so the installed distribution's own files, the ones its
RECORD lists, are packed back into the wheel they came from, with no build
and no network. ``--source_dir=CHECKOUT`` builds that checkout instead.
Each launch says which in one line (`Source.line`).
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import os
import re
import sys
import tempfile
import zipfile
from importlib import metadata
from pathlib import Path
from typing import Callable, Mapping

from launch import errors as le
from launch import processes as lp
from launch import wheel as lw
from mnist_common import local_paths

# dist-info files that belong to one installation, not to the wheel.
_INSTALL_ONLY = {"RECORD", "INSTALLER", "REQUESTED", "direct_url.json"}
_EXTRA_MARKER = re.compile(r"""^(?P<req>.*?)\s*;\s*(?:(?P<rest>.*?)\s+and\s+)?"""
                           r"""extra\s*==\s*['"](?P<extra>[^'"]+)['"]\s*$""")


@dataclasses.dataclass(frozen=True)
class Source:
    """Where the staged wheel comes from: the checkout ``root`` (built with
    pip), or ``distribution``, installed in ``root`` (packed from its files)."""
    root: Path
    distribution: metadata.Distribution | None = None

    @property
    def installed(self) -> bool:
        return self.distribution is not None

    def project(self) -> dict:
        """The project's settings as pyproject.toml has them (for an installed
        distribution: name, version and requirements from its METADATA)."""
        if not self.installed:
            return lw.load_pyproject(self.root / "pyproject.toml")
        return installed_project(self.distribution)

    def dist_dir(self, name: str) -> Path:
        """Where the wheel goes without ``--dist_dir``: the checkout's
        ``dist/NAME``; installed, the user's cache (not site-packages)."""
        if not self.installed:
            return self.root / "dist" / name
        cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
        return Path(cache).resolve() / "mnist-tpu" / "dist" / name

    def line(self, pyproject: Mapping) -> str:
        name, version = lw.project_name_version(pyproject)
        if self.installed:
            return (f"staging: {name} {version} as installed in {self.root} "
                    "(its files, packed into a wheel)")
        return f"staging: {name} {version}, a wheel built from the checkout {self.root}"


def find_source(source_dir: Path | None = None,
                launch_root: Path = lw.REPO_ROOT) -> Source:
    """``--source_dir``, else the checkout the `launch` package sits in, else
    the installed distribution it belongs to; ConfigError if none."""
    if source_dir is not None:
        root = Path(source_dir).expanduser().resolve()
        if not (root / "pyproject.toml").is_file():
            raise le.ConfigError(f"--source_dir={source_dir}: no pyproject.toml there; "
                                 "name a checkout of the project")
        return Source(root)
    if (launch_root / "pyproject.toml").is_file():
        return Source(launch_root)
    dist = owning_distribution(launch_root)
    if dist is None:
        raise le.ConfigError(
            f"{launch_root / 'launch'}: neither in a checkout (no pyproject.toml beside "
            "it) nor part of an installed distribution; pass --source_dir=CHECKOUT")
    return Source(launch_root, dist)


def owning_distribution(folder: Path) -> metadata.Distribution | None:
    """The distribution installed in ``folder`` whose files hold this
    `launch` package, or None."""
    mine = (folder / "launch" / "__init__.py").resolve()
    for dist in metadata.distributions(path=[str(folder)]):
        for file in dist.files or ():
            if file.as_posix() == "launch/__init__.py" and \
                    Path(dist.locate_file(file)).resolve() == mine:
                return dist
    return None


def installed_project(dist: metadata.Distribution) -> dict:
    """A pyproject-like mapping from an installed distribution's METADATA."""
    base: list[str] = []
    extras: dict[str, list[str]] = {e: [] for e in dist.metadata.get_all("Provides-Extra") or ()}
    for line in dist.requires or ():
        match = _EXTRA_MARKER.match(line)
        if not match:
            base.append(line)
            continue
        req = match["req"] + (f"; {match['rest']}" if match["rest"] else "")
        extras.setdefault(match["extra"], []).append(req)
    return {"project": {"name": dist.metadata["Name"], "version": dist.version,
                        "dependencies": base, "optional-dependencies": extras}}


def _record_hash(data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=")
    return "sha256=" + digest.decode()


def _wheel_members(dist: metadata.Distribution) -> list[tuple[str, Path]]:
    """(name in the wheel, installed file) for every file RECORD lists that a
    wheel carries: not the scripts pip wrote, bytecode or install records."""
    members = []
    for file in dist.files or ():
        name = file.as_posix()
        parts = name.split("/")
        if parts[0] == ".." or "__pycache__" in parts or name.endswith((".pyc", ".pyo")):
            continue
        if parts[0].endswith(".dist-info") and parts[-1] in _INSTALL_ONLY:
            continue
        path = Path(dist.locate_file(file))
        if not path.is_file():
            raise le.RunFailure(f"{path}: listed in the installed {dist.metadata['Name']}'s "
                                "RECORD but missing; reinstall it, or pass "
                                "--source_dir=CHECKOUT")
        members.append((name, path))
    return members


def pack_installed(dist: metadata.Distribution, wheel: Path) -> Path:
    """Writes the installed distribution's files as the wheel ``wheel`` (a
    new RECORD with their hashes), renamed into place once whole."""
    members = _wheel_members(dist)
    info = next((n.split("/")[0] for n, _ in members
                 if n.endswith(".dist-info/METADATA")), None)
    if info is None:
        raise le.RunFailure(f"the installed {dist.metadata['Name']} has no METADATA "
                            "in its RECORD; pass --source_dir=CHECKOUT")
    members.sort(key=lambda m: (m[0].startswith(info), m[0]))  # dist-info last
    wheel.parent.mkdir(parents=True, exist_ok=True)
    fd, partial = tempfile.mkstemp(prefix=".wheel-", suffix=".partial", dir=wheel.parent)
    try:
        with os.fdopen(fd, "wb") as raw, zipfile.ZipFile(raw, "w", zipfile.ZIP_DEFLATED) as zf:
            record = []
            for name, path in members:
                data = path.read_bytes()
                zf.writestr(name, data)
                record.append(f"{name},{_record_hash(data)},{len(data)}")
            record.append(f"{info}/RECORD,,")
            zf.writestr(f"{info}/RECORD", "\n".join(record) + "\n")
        os.chmod(partial, 0o644)  # mkstemp's 0600 would keep it from other users
        local_paths.move(partial, str(wheel), overwrite=True)
    except BaseException:
        local_paths.remove_file(partial)  # made above by mkstemp, this launch's own
        raise
    return wheel


def build_commands(source: Source, python: str, dist_dir: Path,
                   build_isolation: bool) -> list[lp.Command]:
    """The commands that make the wheel: ``pip wheel`` for a checkout, none
    for an installed distribution (packed here, `pack_installed`)."""
    if source.installed:
        return []
    return [lw.planned_build_command(python, dist_dir, build_isolation)]


def make_wheel(source: Source, dist_dir: Path, pyproject: Mapping,
               builds: list[lp.Command],
               run: Callable[[lp.Command], int] | None = None) -> Path:
    """Says what is staged (`Source.line`) and makes its wheel in ``dist_dir``
    (``builds``: `build_commands`); the wheel's path."""
    print(source.line(pyproject), file=sys.stderr, flush=True)
    if source.installed:
        return pack_installed(source.distribution,
                              dist_dir / lw.wheel_filename(*lw.project_name_version(pyproject)))
    [build] = builds
    return lw.build_in_staging(build, dist_dir, pyproject, source.root, run)
