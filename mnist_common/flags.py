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

Python 3.10-3.12 argparse: a parser's option strings are the keys of its
``_option_string_actions``; `parse_known_args` is the one path every parse
takes, and `error` is what it calls on a usage error.
"""

from __future__ import annotations

import argparse
import difflib
import sys
from typing import Iterable, Sequence

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
    that refuses a flag given twice (`repeated_flag`)."""

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
