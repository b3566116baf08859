"""Errors the job reports as one line: bad input, and storage that fails.

Also the classifier that finds such an error inside whatever a runner raised.
"""

from __future__ import annotations


class PipelineError(Exception):
    """A failure `python -m pipeline` prints as one line, exiting non-zero."""


class PipelineInputError(PipelineError):
    """Bad input or output location. The message names the file and the problem.

    Raised inside a Beam worker, it carries the same message out of the runner.
    """


class StorageError(PipelineError):
    """The output storage failed (unreachable, refusing writes) during the run."""


def as_pipeline_error(error: BaseException, output: str,
                      earlier: str = "") -> PipelineError | None:
    """The one-line error inside whatever the runner raised, or None if unknown.

    A PipelineInputError raised in a worker is found by type or, when the
    runner passed it on as text, by name. Storage failures (`pipeline.storage.
    failure_summary`: disk full, read-only, unreachable...) name the output and
    end with ``earlier``, what is left of the earlier dataset.
    """
    import re

    from pipeline.storage import failure_summary
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
