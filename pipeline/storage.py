"""File access for local paths and ``gs://`` through Beam's FileSystems.

Beam's GCS client works against a local GCS API server when
``STORAGE_EMULATOR_HOST`` is set. Such a server takes no Google credentials,
so in that case Beam's credential lookup (which retries for ~25 s when none
exist) is skipped and the client connects anonymously.

Beam's GCS I/O retries a failing request for 120 s (google-api-core's
default ``Retry`` timeout) before it gives up. ``MNIST_GCS_RETRY_DEADLINE_S``
sets that deadline in seconds for this job (driver and local workers), e.g.
small in tests that stop the storage server on purpose.
"""

from __future__ import annotations

import errno
import os
import re
from typing import Iterable, Optional

from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems

from mnist_contract import join_path

_MIME = "application/octet-stream"
RETRY_DEADLINE_ENV = "MNIST_GCS_RETRY_DEADLINE_S"


def configure_gcs() -> None:
    """Called by the driver and by each worker before touching gs://."""
    apply_gcs_retry_deadline()
    use_anonymous_gcs_for_emulator()


def apply_gcs_retry_deadline() -> None:
    """Gives Beam's GCS retries the deadline ``$MNIST_GCS_RETRY_DEADLINE_S``, if set.

    Every ``GcsIO`` takes its retry policy from `gcsio_retry.get_retry`,
    which returns one of two module-level ``google.api_core.retry.Retry``
    objects; they are replaced by copies with the deadline
    (``Retry.with_timeout``).
    """
    value = os.environ.get(RETRY_DEADLINE_ENV)
    if not value:
        return
    deadline = float(value)
    if not deadline > 0:
        raise ValueError(f"{RETRY_DEADLINE_ENV}={value}: expected seconds > 0")
    from apache_beam.io.gcp import gcsio_retry
    gcsio_retry.DEFAULT_RETRY = gcsio_retry.DEFAULT_RETRY.with_timeout(deadline)
    gcsio_retry.DEFAULT_RETRY_WITH_THROTTLING_COUNTER = (
        gcsio_retry.DEFAULT_RETRY_WITH_THROTTLING_COUNTER.with_timeout(deadline))


def use_anonymous_gcs_for_emulator() -> None:
    """Skips Google's credential lookup when a local GCS API server stands in."""
    if not os.environ.get("STORAGE_EMULATOR_HOST"):
        return
    from apache_beam.internal.gcp import auth
    with auth._Credentials._credentials_lock:  # pylint: disable=protected-access
        auth._Credentials._credentials = None  # pylint: disable=protected-access
        auth._Credentials._credentials_init = True  # pylint: disable=protected-access


def is_remote(path: str) -> bool:
    return "://" in path


def read_bytes(path: str) -> bytes:
    """The file's bytes exactly as stored (no decompression by extension)."""
    with FileSystems.open(path, mime_type=_MIME,
                          compression_type=CompressionTypes.UNCOMPRESSED) as f:
        return f.read()


def open_read(path: str):
    """A binary stream over ``path`` (local or gs://), read as stored (no decompression)."""
    return FileSystems.open(path, mime_type=_MIME,
                            compression_type=CompressionTypes.UNCOMPRESSED)


def write_bytes(path: str, data: bytes) -> None:
    with FileSystems.create(path, mime_type=_MIME,
                            compression_type=CompressionTypes.UNCOMPRESSED) as f:
        f.write(data)


def exists(path: str) -> bool:
    return FileSystems.exists(path)


def list_dir(directory: str) -> list[str]:
    """Full paths of the files directly or indirectly under ``directory``."""
    pattern = join_path(directory, "**")
    result = FileSystems.match([pattern])[0]
    return sorted(m.path for m in result.metadata_list)


def size_of(path: str) -> int:
    return FileSystems.match([path])[0].metadata_list[0].size_in_bytes


def make_dirs(directory: str) -> None:
    if not is_remote(directory):
        os.makedirs(directory, exist_ok=True)


def delete(paths: Iterable[str]) -> None:
    paths = list(paths)
    if paths:
        FileSystems.delete(paths)


def delete_tree(directory: str) -> None:
    """Removes a directory (local) or every object under a prefix (GCS)."""
    if is_remote(directory):
        delete(list_dir(directory))
    elif os.path.isdir(directory):
        FileSystems.delete([directory])


def rename(sources: list[str], destinations: list[str]) -> None:
    if sources:
        FileSystems.rename(sources, destinations)


def list_top(directory: str) -> list[str]:
    """Names directly under ``directory``: files and folders, empty folders included.

    On GCS a folder exists only through the objects under it.
    """
    if not is_remote(directory):
        try:
            return sorted(os.listdir(directory))
        except FileNotFoundError:
            return []
    prefix = directory.rstrip("/") + "/"
    return sorted({p[len(prefix):].split("/", 1)[0] for p in list_dir(directory)
                   if p.startswith(prefix)})


def tree_size(directory: str) -> str:
    """Bytes under ``directory`` as text, for warnings ("unknown" if it cannot be listed)."""
    try:
        if is_remote(directory):
            matched = FileSystems.match([join_path(directory, "**")])[0].metadata_list
            total = sum(m.size_in_bytes for m in matched)
        else:
            total = sum(os.path.getsize(os.path.join(root, name))
                        for root, _, names in os.walk(directory) for name in names)
    except Exception:  # storage failing: the size is what we cannot know
        return "size unknown"
    return f"{total:,} bytes"


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
