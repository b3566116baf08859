"""The commands README.md and docs/launch.md show, read as a user reads them.

Each command of their ``bash`` blocks (and README's inline ``.venv/bin/...``
command) must name something that exists: a console script of
pyproject.toml, a module or script of the checkout, an extra, the checkout's
``.venv`` or a venv made in the same block. The launcher commands run, in
this process, with ``--dry_run`` (exit 0): their flags parse and their
settings resolve. Nothing else runs: a command this file does not know
fails the test, so a new kind of command gets a check here."""

from __future__ import annotations

import importlib
import re
import shlex

from tests.helpers import REPO
from tests.launch.helpers import PYPROJECT, SETTINGS_ENV

PAGES = ("README.md", "docs/launch.md")
SCRIPTS = PYPROJECT["project"]["scripts"]
EXTRAS = PYPROJECT["project"]["optional-dependencies"]
LAUNCHERS = {"mnist-launch-dataflow", "mnist-launch-tpu"}


def shown_blocks(page: str) -> list[list[str]]:
    """Each bash block of ``page`` (and README's inline commands with flags)
    as its commands: continuation lines joined, comments dropped, ``&&``
    chains split."""
    text = (REPO / page).read_text()
    blocks = re.findall(r"^```(?:bash|sh)\n(.*?)^```", text, re.S | re.M)
    if page == "README.md":
        blocks += re.findall(r"`((?:\.venv/bin/)?(?:python|mnist-)[^`]* --[^`]+)`", text)
    found = []
    for block in blocks:
        commands = []
        for line in block.replace("\\\n", " ").splitlines():
            line = re.split(r"\s#", line)[0].strip()
            commands += [c.strip() for c in line.split("&&") if c.strip()]
        found.append(commands)
    return found


def module_exists(name: str) -> bool:
    path = REPO / name.replace(".", "/")
    return path.with_suffix(".py").is_file() or (path / "__main__.py").is_file()


def check(argv: list[str], venvs: set[str], env: dict[str, str]) -> list[str] | None:
    """None when ``argv`` names what exists; a launcher's argv (to run dry) or
    raises AssertionError with what is wrong. ``python``, ``pip`` and the
    project's commands are found in a new shell only in a venv: one the block
    activated (``env["active"]``), or spelled ``.venv/bin/...``."""
    head, rest = argv[0], argv[1:]
    if head in ("python", "pip", *SCRIPTS):
        assert env.get("active"), f"not on PATH in a new shell: {shlex.join(argv)}"
    if head == "source":
        assert rest[0].endswith("/bin/activate") and rest[0][:-13] in venvs, argv
        env["active"] = rest[0]
    elif head == "export":
        env.update(a.split("=", 1) for a in rest)
    elif argv[:3] == ["python3", "-m", "venv"]:
        venvs.add(rest[2])
    elif head == "bash":
        assert (REPO / rest[0]).is_file(), argv
    elif head == "pip" and rest[0] == "install":
        [extras] = re.fullmatch(r"\.\[([a-z,]+)\]", rest[-1]).groups()
        assert set(extras.split(",")) <= set(EXTRAS), argv
    elif head.removeprefix(".venv/bin/") in ("python", "python3"):
        if rest[0] == "-m":
            assert module_exists(rest[1]), argv
        else:
            assert (REPO / rest[0]).is_file(), argv
    elif head.removeprefix(".venv/bin/") in SCRIPTS:
        if head.removeprefix(".venv/bin/") in LAUNCHERS:
            return [head.removeprefix(".venv/bin/"), *rest]
    else:
        raise AssertionError(f"a command this test does not check: {shlex.join(argv)}")
    return None


def launcher_commands() -> list[tuple[str, list[str], dict[str, str]]]:
    shown = []
    for page in PAGES:
        for block in shown_blocks(page):
            venvs, env = {".venv"}, {}  # .venv: made by the README's two commands
            for command in block:
                argv = [a for a in shlex.split(command)
                        if not (a.startswith("[") and a.endswith("]"))]
                launcher = check(argv, venvs, env)
                if launcher:
                    shown.append((page, launcher, {k: v for k, v in env.items()
                                                   if k != "active"}))
    return shown


def test_the_commands_shown_exist_and_the_launchers_run_dry(monkeypatch, tmp_path, capsys):
    shown = launcher_commands()
    assert {argv[0] for _, argv, _ in shown} >= {"mnist-launch-dataflow", "mnist-launch-tpu"}
    for name in SETTINGS_ENV:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.chdir(tmp_path)
    for page, argv, env in shown:
        module, _, function = SCRIPTS[argv[0]].partition(":")
        main = getattr(importlib.import_module(module), function)
        with monkeypatch.context() as m:
            for key, value in env.items():
                m.setenv(key, value)
            dry = argv[1:] + ([] if "--dry_run" in argv else ["--dry_run"])
            code = main(dry)
        out = capsys.readouterr()
        assert code == 0, (page, shlex.join(argv), out.err)
        assert out.out.strip(), (page, shlex.join(argv))
    assert list(tmp_path.iterdir()) == []
