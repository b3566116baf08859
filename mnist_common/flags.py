"""Command-line usage errors as one line, with a misspelled flag named.

argparse answers a bad flag with its whole usage text (30 lines for the
trainer) and, when a required flag is missing, names only the missing one:
``--dat=x`` reads as "--data is required". `OneLineParser` ends a usage error
with one line ``error: PROBLEM (see --help)`` and exit status 2, and when a
flag it does not know is close to one it knows, the line says so:
``...; did you mean --data, not --dat? (see --help)``.

argparse also takes a flag given twice, the last value silently winning
(``--output=a --output=b`` writes to ``b``). `OneLineParser` refuses that
(`repeated_flag`), except for flags whose action collects every occurrence
(``action="append"``, ``"count"``, ``"extend"``).

A numeric flag or environment variable is read through `Number`, the one
finite-and-range type (``number(int, min=1)``): ``nan``, ``inf`` and a value
outside the range are refused while the command line is parsed, before
anything runs. `OneLineParser` words that refusal ``--flag=VALUE: must be
REQUIREMENT`` (`OneLineParser.number_style`); `environ_number` reads an
environment variable through the same type.

Python 3.10-3.12 argparse: a parser's option strings are the keys of its
``_option_string_actions``; `parse_known_args` is the one path every parse
takes, `_get_value` converts each value with its action's ``type``, and
`error` is what it calls on a usage error.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import math
import os
import sys
from typing import Iterable, Mapping, Optional, Sequence

from mnist_common import console


def misspelling(given: Sequence[str], known: Iterable[str]) -> str:
    """``"; did you mean --data, not --dat?"`` for the first flag in
    ``given`` that is not in ``known`` but close to one of them; else ``""``.

    A flag that begins exactly one known flag (``--res``: ``--restart``) is
    taken as that one's abbreviation, which the parsers refuse (a guessed
    ``--restart`` would delete checkpoints); otherwise the closest by
    `difflib` similarity, if at least 0.75 (``--outptu``: ``--output``).
    """
    known = sorted(set(known))
    for arg in given:
        if arg == "--":
            break
        name = arg.split("=", 1)[0]
        if not name.startswith("--") or name in known:
            continue
        close = [k for k in known if k.startswith(name)]
        if len(close) != 1:
            close = difflib.get_close_matches(name, known, n=1, cutoff=0.75)
        if close:
            return f"; did you mean {close[0]}, not {name}?"
    return ""


def option_strings(parser: argparse.ArgumentParser) -> list[str]:
    """Every option string ``parser`` takes (``--data``, ``-h``, ...)."""
    return list(parser._option_string_actions)  # pylint: disable=protected-access


class NumberError(argparse.ArgumentTypeError, ValueError):
    """A number `Number` refuses: not finite, or outside its range."""

    def __init__(self, number: "Number", value):
        self.number, self.value = number, value
        self.requirement = number.refusal(value)
        super().__init__(f"must be {self.requirement}, not {value}")


@dataclasses.dataclass(frozen=True)
class Number:
    """A flag's (or environment variable's) number: ``kind`` (int or float)
    parsed from its text, finite, and within ``min``/``max`` (each inclusive
    unless ``min_inclusive``/``max_inclusive`` say not; None: no bound).
    ``words``, when given, is the requirement as refusals say it
    (``"positive"``), else it is derived from the bounds (`requirement`).

    An argparse ``type``: text that is no ``kind`` raises ValueError (argparse:
    ``invalid int value: 'x'``), a value out of range `NumberError`.
    """

    kind: type
    min: Optional[float] = None
    max: Optional[float] = None
    min_inclusive: bool = True
    max_inclusive: bool = True
    words: Optional[str] = None

    def __post_init__(self):
        if self.kind not in (int, float):
            raise TypeError(f"Number: kind must be int or float, not {self.kind!r}")

    @property
    def __name__(self) -> str:  # argparse names the type in "invalid int value"
        return self.kind.__name__

    def __call__(self, text: str):
        value = self.kind(text)
        if not self.accepts(value):
            raise NumberError(self, value)
        return value

    def accepts(self, value) -> bool:
        """Whether ``value`` is finite and within the range."""
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return False
        if not math.isfinite(value):
            return False
        low = self.min is None or (value >= self.min if self.min_inclusive
                                   else value > self.min)
        high = self.max is None or (value <= self.max if self.max_inclusive
                                    else value < self.max)
        return low and high

    @property
    def range_text(self) -> str:
        """``">= 0 and < 1"``: the bounds alone ("" without any)."""
        parts = []
        if self.min is not None:
            parts.append(f"{'>=' if self.min_inclusive else '>'} {_bound(self.min)}")
        if self.max is not None:
            parts.append(f"{'<=' if self.max_inclusive else '<'} {_bound(self.max)}")
        return " and ".join(parts)

    def refusal(self, value) -> str:
        """What a refused ``value`` must be: ``words`` (past the ``max`` of a
        spec with words: ``"at most MAX"``); for an int, the bound it breaks
        (``">= 1"``); else `requirement`."""
        broken = self._broken_bound(value)
        if self.words:
            return f"at most {_bound(self.max)}" if broken.startswith("<") else self.words
        return broken if self.kind is int and broken else self.requirement

    def bound_text(self, value) -> str:
        """The bounds as a refusal of ``value`` names them: an int's broken
        bound, else `range_text`."""
        broken = self._broken_bound(value)
        return broken if self.kind is int and broken else self.range_text

    def _broken_bound(self, value) -> str:
        """``">= 1"`` or ``"<= 9"``: the bound a finite ``value`` breaks, else ""."""
        if isinstance(value, bool) or not isinstance(value, (int, float)) \
                or not math.isfinite(value):
            return ""
        low, high = Number(self.kind, min=self.min, min_inclusive=self.min_inclusive), \
            Number(self.kind, max=self.max, max_inclusive=self.max_inclusive)
        for part in (low, high):
            if not part.accepts(value):
                return part.range_text
        return ""

    @property
    def requirement(self) -> str:
        """``"a finite number > 0"`` (float) or ``">= 1"`` (int): what the
        value must be, as a refusal words it (``words`` when given)."""
        if self.words:
            return self.words
        if self.kind is int:
            return self.range_text or "an integer"
        return " ".join(filter(None, ("a finite number", self.range_text)))


def _bound(value: float) -> str:
    """A bound as written: ``4294967295``, ``0.5``."""
    return str(int(value)) if float(value).is_integer() else f"{value:g}"


def number(kind: type = float, *, min: Optional[float] = None,  # pylint: disable=redefined-builtin
           max: Optional[float] = None, min_inclusive: bool = True,  # pylint: disable=redefined-builtin
           max_inclusive: bool = True, words: Optional[str] = None) -> Number:
    """`Number`: the type of every numeric flag and environment variable."""
    return Number(kind, min, max, min_inclusive, max_inclusive, words)


# Seconds a program waits for: finite, > 0 and at most 10**9 (31 years), which
# every sleep and timeout of the platform holds (a longer one overflows).
SECONDS = number(float, min=0, min_inclusive=False, max=10**9)


class EnvironmentValueError(ValueError):
    """An environment variable's value refused: the message is one line
    naming the variable (``error: NAME='abc': must be ...``), for exit 2."""


def environ_number(name: str, spec: Number, default,
                   environ: Optional[Mapping[str, str]] = None):
    """The environment variable ``name`` read through ``spec`` (``default``
    when unset or empty), or `EnvironmentValueError` naming it."""
    text = (os.environ if environ is None else environ).get(name, "")
    if not text.strip():
        return default
    try:
        return spec(text.strip())
    except ValueError:  # NumberError too: not a number, or out of range
        kind = "an integer" if spec.kind is int else "a finite number"
        raise EnvironmentValueError(
            f"{name}={text!r}: must be {kind} {spec.range_text}".rstrip()) from None


# Actions that collect every occurrence of their flag: repeating one is its use.
_REPEATABLE = (argparse._AppendAction,  # pylint: disable=protected-access
               argparse._AppendConstAction,  # pylint: disable=protected-access
               argparse._CountAction,  # pylint: disable=protected-access
               argparse._ExtendAction)  # pylint: disable=protected-access


def repeated_flag(given: Sequence[str], parser: argparse.ArgumentParser) -> str:
    """``"--output given twice (--output=a, then --output=b)"`` for the first
    flag of ``parser`` that ``given`` holds twice (by any of its names), else
    ``""``. Flags of `_REPEATABLE` actions may repeat; arguments after
    ``--`` are not flags. A value never reads as a flag: argparse takes no
    value that looks like one of its flags (``--splits --output`` is an error
    of its own), and ``--flag=VALUE`` is read by its name."""
    actions = parser._option_string_actions  # pylint: disable=protected-access
    first: dict = {}
    for arg in given:
        if arg == "--":
            break
        name = arg.split("=", 1)[0]
        action = actions.get(name)
        if action is None or isinstance(action, _REPEATABLE):
            continue
        if action in first:
            return f"{name} given twice ({first[action]}, then {arg})"
        first[action] = arg
    return ""


class OneLineParser(argparse.ArgumentParser):
    """An argparse parser whose usage errors are one line (`usage_error`) and
    that refuses a flag given twice (`repeated_flag`).

    A value its `Number` type refuses is worded by ``number_style`` (fields
    ``flag``, ``value``, ``requirement``) and raised as ``number_error``:
    None, a usage error; an exception class, raised with the line for the
    program to report (the trainer: its `TrainerError`).
    """

    number_style = "{flag}={value}: must be {requirement}"
    number_error: Optional[type] = None

    def _get_value(self, action, arg_string):
        if not isinstance(action.type, Number):
            return super()._get_value(action, arg_string)
        try:
            return action.type(arg_string)
        except NumberError as e:
            flag = max(action.option_strings, key=len, default=action.dest)
            line = self.number_style.format(flag=flag, value=e.value,
                                            requirement=e.requirement)
        except ValueError:
            return super()._get_value(action, arg_string)  # "invalid int value: 'x'"
        if self.number_error is not None:
            raise self.number_error(line)
        raise argparse.ArgumentError(None, line)

    def parse_known_args(self, args=None, namespace=None):
        self._given = list(sys.argv[1:] if args is None else args)
        parsed = super().parse_known_args(args, namespace)
        repeated = repeated_flag(self._given, self)
        if repeated:
            self.usage_error(f"{repeated}; give each flag once (see --help)")
        return parsed

    def error(self, message):
        hint = misspelling(getattr(self, "_given", ()), option_strings(self))
        self.usage_error(f"{message}{hint} (see --help)")

    def usage_error(self, message: str):
        """Ends the process: ``error: MESSAGE`` on stderr, exit status 2.
        A program that reports its errors itself raises here instead."""
        self.exit(console.BAD_INPUT, f"error: {message}\n")
