"""Every numeric flag and environment variable of every command goes through
one finite-and-range type, `mnist_common.flags.Number`.

Data-driven: the flags come from each command's own parser (`PROGRAMS`), so a
new flag is checked as it is added. One test refuses a flag whose type is a
bare ``int`` or ``float`` (and the source scan below, one added in a new
parser); the others give each `Number` flag ``nan``, ``inf``, ``-inf`` and a
value just outside its range through the command's entry point, which must
answer with one line naming the flag and exit status 2, before anything runs.
"""

from __future__ import annotations

import argparse
import ast
import importlib
import os
import re
import subprocess
import sys

import pytest

from mnist_common.flags import (SECONDS, EnvironmentValueError, Number, NumberError,
                                environ_number, number)
from tests.helpers import REPO

# command -> (module, its parser factory, its entry point, the other arguments
# a run needs, "{tmp}" standing for a fresh folder).
PROGRAMS = {
    "python -m pipeline": ("pipeline.options", "build_parser", "pipeline.__main__:main",
                           ["--source=synthetic:10", "--output={tmp}/out"]),
    "python -m pipeline.verify": ("pipeline.verify", "build_parser", "pipeline.verify:main",
                                  ["{tmp}"]),
    "python -m trainer": ("trainer.config", "flag_parser", "trainer.__main__:main",
                          ["--data={tmp}/data", "--model_dir={tmp}/m"]),
    "python -m trainer.predict": ("trainer.predict", "build_parser", "trainer.predict:main",
                                  ["--model_dir={tmp}/m", "--data={tmp}/data"]),
    "mnist-launch-dataflow": ("launch.dataflow", "build_parser", "launch.dataflow:main",
                              ["--dry_run"]),
    "mnist-launch-tpu": ("launch.tpu.cli", "build_parser", "launch.tpu.cli:main",
                         ["run", "--name=vm", "--zone=z", "--dry_run"]),
}
# The packages of the commands (benchmarks/ is not one: its scripts are tools).
PRODUCT = ("pipeline", "trainer", "launch", "mnist_common", "mnist_contract", "scripts")


def test_the_shared_type_takes_finite_numbers_in_range_only():
    rate = number(float, min=0, max=1, max_inclusive=False)
    assert (rate("0"), rate("0.5")) == (0.0, 0.5)
    for text in ("nan", "inf", "-inf", "1", "-0.1", "1e400"):
        with pytest.raises(NumberError):
            rate(text)
    with pytest.raises(ValueError) as caught:
        rate("half")
    assert not isinstance(caught.value, NumberError)  # argparse: "invalid float value"
    assert rate.requirement == "a finite number >= 0 and < 1"
    assert number(int, min=1).requirement == ">= 1"
    with pytest.raises(ValueError):
        number(int, min=0)("1e3")  # an int is written as one


def test_an_environment_number_is_its_default_when_unset_else_checked():
    assert environ_number("X", SECONDS, 5.0, environ={}) == 5.0
    assert environ_number("X", SECONDS, 5.0, environ={"X": " 2 "}) == 2.0
    with pytest.raises(EnvironmentValueError, match=r"^X='abc': must be a finite number "
                                                    r"> 0 and <= 1000000000$"):
        environ_number("X", SECONDS, 5.0, environ={"X": "abc"})


def _parser(program: str) -> argparse.ArgumentParser:
    module, factory, _, _ = PROGRAMS[program]
    return getattr(importlib.import_module(module), factory)()


def _actions(parser: argparse.ArgumentParser):
    """Every action of ``parser`` and of its sub-commands' parsers."""
    for action in parser._actions:  # pylint: disable=protected-access
        if isinstance(action, argparse._SubParsersAction):  # pylint: disable=protected-access
            for sub in action.choices.values():
                yield from _actions(sub)
        else:
            yield action


def _flag(action) -> str:
    return max(action.option_strings, key=len, default=action.dest)


def _numbers(program: str) -> dict[str, Number]:
    return {_flag(a): a.type for a in _actions(_parser(program)) if isinstance(a.type, Number)}


def _outside(spec: Number) -> list[str]:
    """Values just outside ``spec``'s range."""
    step = 1 if spec.kind is int else 0.5
    values = []
    if spec.min is not None:
        values.append(spec.min - (step if spec.min_inclusive else 0))
    if spec.max is not None:
        values.append(spec.max + (step if spec.max_inclusive else 0))
    return [str(spec.kind(v)) for v in values]


def _cases():
    for program in PROGRAMS:
        for flag, spec in sorted(_numbers(program).items()):
            for value in ["nan", "inf", "-inf", *_outside(spec)]:
                yield pytest.param(program, flag, value, id=f"{program}:{flag}={value}")


@pytest.mark.parametrize("program", PROGRAMS)
def test_every_numeric_flag_has_the_shared_type(program):
    actions = list(_actions(_parser(program)))
    bare = [_flag(a) for a in actions if a.type in (int, float)]
    assert not bare, f"{program}: {bare} typed int/float: use mnist_common.flags.number"
    assert any(isinstance(a.type, Number) for a in actions), program


def _product_files():
    for package in PRODUCT:
        yield from sorted((REPO / package).rglob("*.py"))


def _reads_environment(node: ast.AST) -> bool:
    return any(isinstance(n, ast.Attribute) and n.attr in ("environ", "getenv")
               for n in ast.walk(node))


def test_no_source_parses_a_number_around_the_shared_type():
    """A flag typed int/float in any parser, or ``int()``/``float()`` of an
    environment variable, anywhere in the commands' packages."""
    found = []
    for path in _product_files():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not isinstance(node, ast.Call):
                continue
            where = f"{path.relative_to(REPO)}:{node.lineno}"
            if any(k.arg == "type" and isinstance(k.value, ast.Name)
                   and k.value.id in ("int", "float") for k in node.keywords):
                found.append(f"{where}: type={ast.unparse(node.keywords[0].value)}")
            if isinstance(node.func, ast.Name) and node.func.id in ("int", "float") \
                    and any(_reads_environment(arg) for arg in node.args):
                found.append(f"{where}: {node.func.id}() of an environment variable")
    assert not found, found


def _run(program: str, argv: list[str], capsys) -> tuple[int, list[str]]:
    module, _, entry = PROGRAMS[program][2].partition(":")
    main = getattr(importlib.import_module(module), entry)
    try:
        code = main(argv)
    except SystemExit as e:
        code = e.code
    captured = capsys.readouterr()
    return code, captured.err.strip().splitlines()


@pytest.mark.parametrize("program, flag, value", list(_cases()))
def test_a_number_not_finite_or_out_of_range_is_a_one_line_usage_error(
        program, flag, value, tmp_path, capsys):
    rest = [arg.format(tmp=tmp_path) for arg in PROGRAMS[program][3]]
    code, lines = _run(program, [*rest, f"{flag}={value}"], capsys)
    assert code == 2, (code, lines)
    assert len(lines) == 1 and lines[0].startswith("error: ") and flag in lines[0], lines
    assert sorted(os.listdir(tmp_path)) == []  # nothing ran


# Every environment variable a command reads as a number, with the commands
# that read it.
ENVIRONMENT = {
    "MNIST_LOCK_HEARTBEAT_SECONDS": ("pipeline", "trainer"),
    "MNIST_LOCK_STALE_SECONDS": ("pipeline", "trainer"),
    "MNIST_GCS_RETRY_DEADLINE_S": ("pipeline",),
    "MNIST_DOWNLOAD_DEADLINE_S": ("pipeline",),
}
# The others: host names, not numbers.
NOT_NUMBERS = {"MNIST_LOCK_DEAD_HOSTS"}
COMMAND_ARGS = {"pipeline": ["--source=synthetic:10", "--output={tmp}/out"],
                "trainer": ["--data={tmp}/data", "--model_dir={tmp}/m"]}


@pytest.mark.parametrize("name, module", [(n, m) for n, ms in ENVIRONMENT.items()
                                          for m in ms])
@pytest.mark.parametrize("value", ["abc", "nan", "-inf", "0", "1e300"])
def test_an_environment_number_is_read_like_a_flag(name, module, value, tmp_path):
    env = {**os.environ, name: value, "TF_CPP_MIN_LOG_LEVEL": "2"}
    args = [a.format(tmp=tmp_path) for a in COMMAND_ARGS[module]]
    proc = subprocess.run([sys.executable, "-m", module, *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert proc.stderr.splitlines() == [
        f"error: {name}={value!r}: must be a finite number > 0 and <= 1000000000"], proc.stderr
    assert sorted(os.listdir(tmp_path)) == []


def test_every_environment_variable_of_the_code_is_listed():
    """Each ``MNIST_*`` name in the code is in `ENVIRONMENT` (a number, tested
    above) or in `NOT_NUMBERS`: a new variable fails here until it is listed."""
    names = set()
    for path in _product_files():
        names |= {n.value for n in ast.walk(ast.parse(path.read_text()))
                  if isinstance(n, ast.Constant) and isinstance(n.value, str)
                  and re.fullmatch(r"MNIST_[A-Z_]+", n.value)}
    assert names == set(ENVIRONMENT) | NOT_NUMBERS
