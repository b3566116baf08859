"""Storage failures in a few words, for the job's and the trainer's one-line errors.

`failure_summary` finds a storage failure (disk full, read-only, GCS
unreachable or refusing) inside whatever a runner or a client raised and
names it in one line, or says it is not one; `storage_reason` gives the
reason of an error already known to be the store's (``Connection
refused``, ``404 Not Found: ...``). Standard library alone; google-api-core
is looked for only when it is installed.
"""

from __future__ import annotations

import errno
import json
import re
from http import HTTPStatus
from typing import Callable, Optional

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


def storage_reason(error: BaseException, retry_seconds: float,
                   otherwise: Callable[[BaseException], str]) -> str:
    """A store's failure in a few words: the OS's reason for a connection
    (``Connection refused``), the HTTP status of a refused request (``404
    Not Found: ...``), else ``otherwise(error)``. ``retry_seconds``: how
    long the client retried before giving up (google-api-core's RetryError)."""
    cause = getattr(error, "cause", None)  # google-api-core's RetryError: the last try's
    if isinstance(cause, BaseException):
        return (f"{storage_reason(cause, retry_seconds, otherwise)}; gave up after "
                f"{retry_seconds:.0f}s of retries")
    if isinstance(error, OSError) and error.strerror:
        return error.strerror
    status = _http_status(error)
    if status:
        return f"{status.value} {status.phrase}{_server_message(error)}"
    found = re.search(r"\[Errno -?\d+\] ([^'\")]+)|(\w+ timed out)", str(error))
    if found:
        return found.group(1) or found.group(2)
    return otherwise(error)


def _http_status(error) -> HTTPStatus | None:
    """The HTTP status of a refused request (google-api-core's ``code``), if any."""
    code = getattr(error, "code", None)
    try:
        return HTTPStatus(code) if isinstance(code, int) else None
    except ValueError:
        return None


def _server_message(error) -> str:
    """``: MESSAGE`` from a GCS JSON error body (``{"error": {"message": ...}}``), else ""."""
    try:
        message = json.loads(error.response.text)["error"]["message"]
    except (AttributeError, ValueError, KeyError, TypeError):
        return ""
    return f": {message}" if isinstance(message, str) and message else ""
