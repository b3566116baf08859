"""Where the launchers' settings come from: their flag parser, a flag
first and then environment variables, and the gs:// URIs they require."""

from __future__ import annotations

import os
from typing import Mapping

from launch.errors import ConfigError
from mnist_common.flags import OneLineParser


class LauncherParser(OneLineParser):
    """The launchers' parser: a number its `mnist_common.flags.Number` type
    refuses is a `ConfigError` ``--flag must be REQUIREMENT`` (exit 2), as
    the launchers' other settings are."""

    number_style = "{flag} must be {requirement}"
    number_error = ConfigError


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
