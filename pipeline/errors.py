"""Errors the job reports as one line: bad input, a missing credential, and
storage that fails; each with its exit status (`mnist_common.console`).

Also the classifiers that find such an error inside whatever a runner
raised: `failure_summary` for storage failures, `as_pipeline_error` for
every error the job reports.
"""

from __future__ import annotations

import errno
import re
from typing import Optional

from mnist_common import console


class PipelineError(Exception):
    """A failure the command line prints as one line, exiting with `exit_status`
    (a failure at run time, unless a subclass says)."""

    exit_status = console.FAILURE


class PipelineInputError(PipelineError):
    """Bad input or output location. The message names the file and the problem.

    Raised inside a Beam worker, it carries the same message out of the runner.
    """

    exit_status = console.BAD_INPUT


class MissingCredentials(PipelineError):
    """No Google credentials for a gs:// path or Dataflow: the environment
    fails the run, the flags and input are fine."""


class StorageError(PipelineError):
    """The output storage failed (unreachable, refusing writes) during the run."""


class Interrupted(PipelineError):
    """A signal (SIGINT, SIGTERM, SIGHUP) stopped the job; the message says what
    the output holds, the exit status is 128 + the signal's number."""

    def __init__(self, message: str, exit_status: int = console.INTERRUPTED):
        super().__init__(message)
        self.exit_status = exit_status

    @classmethod
    def by(cls, stopped, where: str, state: str) -> "Interrupted":
        """For `pipeline.stop.Stopped` ``stopped``: ``where`` and what it holds."""
        return cls(f"{where}: interrupted ({stopped.name}); {state}", stopped.exit_status)


def as_pipeline_error(error: BaseException, output: str,
                      earlier: str = "") -> PipelineError | None:
    """The one-line error inside whatever the runner raised, or None if unknown.

    A PipelineInputError raised in a worker is found by type or, when the
    runner passed it on as text, by name. Storage failures (`failure_summary`:
    disk full, read-only, unreachable...) name the output and
    end with ``earlier``, what is left of the earlier dataset.
    """
    seen = error
    while seen is not None:
        if isinstance(seen, PipelineInputError):
            return PipelineInputError(str(seen.args[0]).splitlines()[0])
        seen = seen.__cause__ or seen.__context__
    text = str(error)
    marker = "PipelineInputError: "
    if marker in text:
        return PipelineInputError(text.split(marker, 1)[1].splitlines()[0])
    failure = failure_summary(error)
    if failure:
        failure = re.sub(r" \[while running '[^']*'\]", "", failure)
        return StorageError(f"{output}: storage failed during the run ({failure})"
                            + (f"; {earlier}" if earlier else ""))
    return None


_STORAGE_ERRNOS = {errno.ENOSPC: "disk full", errno.EROFS: "read-only",
                   errno.EDQUOT: "quota exceeded", errno.EACCES: "permission denied",
                   errno.EPERM: "permission denied", errno.EIO: "I/O error"}
_STORAGE_TEXTS = ("No space left on device", "Read-only file system",
                  "Disk quota exceeded", "Errno 28", "Errno 30", "Errno 122",
                  "RetryError", "ConnectionError", "ServiceUnavailable", "BeamIOError",
                  "Max retries exceeded", "PreconditionFailed", "TooManyRequests",
                  "InternalServerError", "Forbidden")


def failure_summary(error: BaseException) -> Optional[str]:
    """One line describing a storage failure inside ``error``, or None if it is not one.

    Runners re-raise a worker's OSError in other wrappers (a RuntimeError
    carrying its text, a BeamIOError holding a dict of them), so the chain of
    causes and the text are both searched.
    """
    seen, depth = error, 0
    while seen is not None and depth < 50:
        if isinstance(seen, OSError) and seen.errno in _STORAGE_ERRNOS:
            return f"OSError: [Errno {seen.errno}] {seen.strerror}"
        seen, depth = seen.__cause__ or seen.__context__, depth + 1
    text = str(error)
    match = re.search(r"(\w+Error): \[Errno (\d+)\] ([^\]\n'\"\[]+)", text)
    if match and int(match.group(2)) in _STORAGE_ERRNOS:
        return f"{match.group(1)}: [Errno {match.group(2)}] {match.group(3).strip()}"
    marker = next((m for m in _STORAGE_TEXTS if m in text), None)
    if marker is None and (isinstance(error, OSError) or _is_google_api_error(error)):
        marker = type(error).__name__
    if marker is None:
        return None
    first = text.strip().splitlines()[0] if text.strip() else type(error).__name__
    return first[:200] if marker in first else f"{marker}: {first[:200]}"


def _is_google_api_error(error: BaseException) -> bool:
    try:
        from google.api_core import exceptions
    except ImportError:
        return False
    return isinstance(error, exceptions.GoogleAPIError)
