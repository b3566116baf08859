"""Errors the job reports as one line: bad input, a missing credential, and
storage that fails; each with its exit status (`mnist_common.console`).

Also the classifiers that find such an error inside whatever a runner
raised: `failure_summary` (`mnist_common.storage_errors`'s) for storage
failures, `as_pipeline_error` for every error the job reports.
"""

from __future__ import annotations

import re

from mnist_common import console
from mnist_common.storage_errors import failure_summary


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
    """A signal (SIGINT, SIGTERM, SIGHUP) stopped the job: its report of a
    `mnist_common.stop.Stopped`, printed as any error of the job. The message
    says what the output holds, the exit status is 128 + the signal's number."""

    def __init__(self, message: str, exit_status: int = console.INTERRUPTED):
        super().__init__(message)
        self.exit_status = exit_status

    @classmethod
    def by(cls, stopped, where: str, state: str) -> "Interrupted":
        """For `mnist_common.stop.Stopped` ``stopped``: ``where`` and what it holds."""
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
