"""Errors the job reports as one line: bad input, and storage that fails."""


class PipelineError(Exception):
    """A failure `python -m pipeline` prints as one line, exiting non-zero."""


class PipelineInputError(PipelineError):
    """Bad input or output location. The message names the file and the problem.

    Raised inside a Beam worker, it carries the same message out of the runner.
    """


class StorageError(PipelineError):
    """The output storage failed (unreachable, refusing writes) during the run."""
