"""The trainer's expected failures (each with its exit status), and how a
TensorFlow error becomes one line.

Imports neither TensorFlow nor Keras, so the configuration (`trainer.config`)
can raise `TrainerError` while ``--help`` and bad flags answer at once.
"""

from __future__ import annotations

import re

from mnist_common import console


class TrainerError(Exception):
    """An expected failure (bad input, missing file, no TPU...).

    The message is one line that names the file or setting at fault; the
    command line prints it without a traceback and exits with `exit_status`
    (`mnist_common.console`: a failure at run time, unless a subclass says).
    `trainer.train` sets ``after_training_began`` on one raised while the
    model is built, trained or exported: the command line then ends the
    process right after the line (`trainer.__main__`).
    """

    exit_status = console.FAILURE
    after_training_began = False


class TrainerInputError(TrainerError):
    """A bad flag or bad input: the command as given cannot work, exit status 2."""

    exit_status = console.BAD_INPUT


def summarize_error(error: BaseException, limit: int = 160) -> str:
    """The gist of a (TensorFlow) exception, fit for one line.

    Drops TF's ``{{function_node ...}}`` prefixes and ``[Op:...]`` suffixes
    and keeps the first sentence of the first line.
    """
    text = getattr(error, "message", None) or str(error) or type(error).__name__
    line = text.strip().splitlines()[0] if text.strip() else type(error).__name__
    line = re.sub(r"\{\{[^}]*\}\}\s*", "", line)
    line = re.sub(r"\s*\[Op:.*$", "", line).strip()
    # TF's GCS client: the reason is the last failure's, not the count of retries.
    line = re.sub(r"^All \d+ retry attempts failed\. The last failure: ", "", line)
    line = line.split(". ")[0]
    return line[:limit] or type(error).__name__


def os_reason(error: BaseException) -> str:
    """The operating system's reason that ends a TensorFlow file error
    (``PATH; No space left on device``), else `summarize_error`: the caller
    names the path itself, and TF's is often a temporary file's. An
    ``OSError`` gives its own reason (``Is a directory``)."""
    if isinstance(error, OSError) and error.strerror:
        return error.strerror
    text = summarize_error(error, limit=1000)
    return text.rsplit("; ", 1)[1].strip() if "; " in text else summarize_error(error)
