"""Helpers shared by the cloud launchers in this folder.

Both launchers ship this project to machines that do not have its source: the
Dataflow launcher stages a wheel for Beam workers, the TPU VM launcher copies
one to every TPU host. The project is configured only by ``pyproject.toml``
(no ``setup.py``), so the wheel is built with ``pip wheel``, which runs the
PEP 517 backend named there. The build runs on a clean copy of the sources
because setuptools reuses an in-tree ``build/`` folder, and files left there
by an older build (a module since deleted, for example) would end up in the
wheel.

Every launcher turns its settings into a list of argv lists first, so tests
can check the exact commands without running anything, and ``--dry_run``
prints them with ``shlex.join``.

Exit statuses (`mnist_common.console`): a `ConfigError` (bad settings) is 2,
a `RunFailure` (the wheel did not build) 1. A launcher stopped by SIGINT,
SIGTERM or SIGHUP exits 128 + N; while `run_command` runs a child, the
signal goes to the child first (`Stopped` carries its status).
"""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Callable, Iterable, Iterator, Mapping, Sequence

from mnist_common import console, local_paths
from mnist_common.flags import OneLineParser

# The folder that holds the `launch` package: a checkout's root (with its
# pyproject.toml), or the site-packages folder of an installed copy
# (`launch.staging` tells which).
REPO_ROOT = Path(__file__).resolve().parent.parent
PYPROJECT = REPO_ROOT / "pyproject.toml"

Command = list[str]


class LaunchError(Exception):
    """The launch cannot go on; the message is one line, ``code`` the exit
    status (`mnist_common.console`)."""
    code = console.FAILURE


class ConfigError(LaunchError, ValueError):
    """A required setting is missing or invalid (bad input: exit 2)."""
    code = console.BAD_INPUT


class LauncherParser(OneLineParser):
    """The launchers' parser: a number its `mnist_common.flags.Number` type
    refuses is a `ConfigError` ``--flag must be REQUIREMENT`` (exit 2), as
    the launchers' other settings are."""

    number_style = "{flag} must be {requirement}"
    number_error = ConfigError


class RunFailure(LaunchError):
    """Something the launch runs failed (a run-time failure: exit 1)."""
    code = console.FAILURE


class Stopped(Exception):
    """SIGINT, SIGTERM or SIGHUP stopped the launch; ``status`` is the exit
    status (128 + N, or a stopped child's own), ``reported``: the child
    already printed why it stopped."""

    def __init__(self, signum: int, status: int | None = None, reported: bool = False):
        super().__init__(signal.Signals(signum).name)
        self.signum = int(signum)
        self.status = console.stopped_by(signum) if status is None else status
        self.reported = reported

    def line(self, program: str) -> str:
        return f"error: {program}: stopped by {self}"


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


def first_setting(*values: str | None) -> str | None:
    """The first non-empty value: a flag first, then environment variables."""
    for value in values:
        if value:
            return value
    return None


def env(*names: str, environ: Mapping[str, str] | None = None) -> str | None:
    environ = os.environ if environ is None else environ
    return first_setting(*(environ.get(n) for n in names))


def require_gs(value: str | None, what: str) -> str:
    if not value:
        raise ConfigError(f"{what} is required")
    if not value.startswith("gs://") or len(value) <= len("gs://"):
        raise ConfigError(f"{what} must be a gs:// URI, got {value!r}")
    return value.rstrip("/")


@contextlib.contextmanager
def raising_on_signals() -> Iterator[None]:
    """Inside the block SIGINT, SIGTERM and SIGHUP raise `Stopped`, so the
    launcher's ``finally`` blocks run (``all --delete_after`` deletes the
    VM) before it exits 128 + N; a child that `run_command` runs then gets
    the signal instead (`forwarding_signals`). Outside the main thread, or
    for a signal the process was started ignoring, nothing changes."""
    def handle(signum, frame):
        raise Stopped(signum)
    with console.on_stop_signals(handle):
        yield


class _Child:
    """The child `run_command` runs, and the first stop signal that came."""

    def __init__(self):
        self.proc: subprocess.Popen | None = None
        self.signum = 0

    def forward(self, signum, frame) -> None:
        """Passes SIGTERM and SIGHUP on to the child, which stops as it stops
        on one (the pipeline keeps nothing half written and exits 128 + N).
        SIGINT is only noted: a Ctrl-C at the terminal reaches the child as
        well, and a second one may cut its own stopping short."""
        self.signum = self.signum or signum
        if signum == signal.SIGINT:
            return
        if self.proc is not None and self.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.proc.pid, signum)

    def status(self, rc: int) -> int:
        """``rc``, or, when a signal came while the child ran, raises
        `Stopped`: with the child's own non-zero status (it said why it
        stopped or failed), else 128 + N."""
        if not self.signum:
            return rc
        if rc > 0:
            raise Stopped(self.signum, rc, reported=True)
        raise Stopped(-rc if rc < 0 else self.signum)


def _run_child(cmd: Sequence[str], cwd: Path | None, **popen) -> tuple[int, str]:
    """Runs ``cmd`` with SIGTERM and SIGHUP passed on to it and SIGINT noted
    (`_Child.forward`); its exit status and captured stdout (if piped)."""
    child = _Child()
    with console.on_stop_signals(child.forward):
        child.proc = subprocess.Popen(list(cmd), cwd=cwd, **popen)
        if child.signum:  # came before the child was there to take it
            child.forward(child.signum, None)
        out, _ = child.proc.communicate()
    return child.status(child.proc.returncode), out or ""


def format_commands(commands: Iterable[Sequence[str]]) -> str:
    return "\n".join(shlex.join(list(cmd)) for cmd in commands)


def run_command(cmd: Sequence[str], cwd: Path | None = None) -> int:
    """Shows and runs ``cmd``; its exit status. A stop signal meanwhile goes
    to it, and then `Stopped` is raised once it ended."""
    print("+ " + shlex.join(list(cmd)), file=sys.stderr, flush=True)
    try:
        return _run_child(cmd, cwd)[0]
    except FileNotFoundError:
        print(f"error: {cmd[0]}: command not found", file=sys.stderr)
        return 127


def run_command_output(cmd: Sequence[str],
                       cwd: Path | None = None) -> tuple[int, str]:
    """Like ``run_command``, but return stdout (as text) instead of showing it."""
    print("+ " + shlex.join(list(cmd)), file=sys.stderr, flush=True)
    try:
        return _run_child(cmd, cwd, stdout=subprocess.PIPE, text=True, errors="replace")
    except FileNotFoundError:
        print(f"error: {cmd[0]}: command not found", file=sys.stderr)
        return 127, ""


def fail(message: str, code: int) -> int:
    print(f"error: {message}", file=sys.stderr)
    return code


def stopped(exc: Stopped, program: str) -> int:
    """The one line of a launcher stopped by a signal (unless its child
    printed its own), and the exit status."""
    if not exc.reported:
        print(exc.line(program), file=sys.stderr, flush=True)
    return exc.status
