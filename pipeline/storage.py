"""The job's only file I/O: local paths and ``gs://`` through Beam's FileSystems.

Sources, shards, spill files, metadata and the publish all read, write,
list and remove files through these functions, so each is written once and
bytes are always read and written as stored (no decompression by file
extension). Only the output's lock (`pipeline.publish.lock`) goes to the
disk or the GCS client itself: it needs conditional creates and rewrites,
which FileSystems does not offer. Reading a local file (opening, listing,
testing, sizing) goes straight to the operating system, and Beam is imported
on first use only, so a reader of local output (``pipeline.verify``) starts
without loading Beam. So do local writes of files that are read back once
and deleted (`write_uncached`, the file shuffle's spill files).

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
import mmap
import os
import stat
import threading
import time
from typing import Iterable

from mnist_contract import join_path

from pipeline import _compat

_MIME = "application/octet-stream"
RETRY_DEADLINE_ENV = "MNIST_GCS_RETRY_DEADLINE_S"


def configure_gcs() -> None:
    """Called by the driver and by each worker before touching gs://."""
    apply_gcs_retry_deadline()
    use_anonymous_gcs_for_emulator()


def apply_gcs_retry_deadline() -> None:
    """Gives Beam's GCS retries the deadline ``$MNIST_GCS_RETRY_DEADLINE_S``, if set."""
    value = os.environ.get(RETRY_DEADLINE_ENV)
    if not value:
        return
    deadline = float(value)
    if not deadline > 0:
        raise ValueError(f"{RETRY_DEADLINE_ENV}={value}: expected seconds > 0")
    _compat.set_gcs_retry_deadline(deadline)


def use_anonymous_gcs_for_emulator() -> None:
    """Skips Google's credential lookup when a local GCS API server stands in."""
    if os.environ.get("STORAGE_EMULATOR_HOST"):
        _compat.skip_beam_credential_lookup()


def is_remote(path: str) -> bool:
    return "://" in path


def _file_systems():
    """Beam's ``FileSystems``, imported when a remote path or a write needs it."""
    from apache_beam.io.filesystems import FileSystems
    return FileSystems


def _uncompressed():
    from apache_beam.io.filesystem import CompressionTypes
    return CompressionTypes.UNCOMPRESSED


class NotAFile(OSError):
    """A local path that is a folder, FIFO, socket or device where a file should be."""


_KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"),
          (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a device"), (stat.S_ISBLK, "a device"))


def _check_is_file(path: str) -> None:
    """Raises `NotAFile` unless ``path`` is a regular file: opening a FIFO would
    wait for a writer forever, reading a folder fails deep inside a reader."""
    mode = os.stat(path).st_mode
    if not stat.S_ISREG(mode):
        kind = next((name for test, name in _KINDS if test(mode)), "of another kind")
        raise NotAFile(errno.EINVAL, f"is {kind}, not a file", path)


def open_read(path: str):
    """A binary stream over ``path`` (local or gs://), read as stored (no decompression).

    A local path that is not a regular file raises `NotAFile`.
    """
    if not is_remote(path):
        _check_is_file(path)
        return open(path, "rb")
    return _file_systems().open(path, mime_type=_MIME, compression_type=_uncompressed())


def open_write(path: str):
    """A new binary file at ``path`` (local or gs://), written as given (no compression)."""
    return _file_systems().create(path, mime_type=_MIME, compression_type=_uncompressed())


_DIRECT_ALIGN = 4096  # O_DIRECT's alignment of buffer, file offset and length (ext4, xfs)
_direct_buffers = threading.local()


def _aligned_buffer(size: int) -> memoryview:
    """A page-aligned buffer of at least ``size`` bytes, kept for reuse by this thread."""
    buffer = getattr(_direct_buffers, "buffer", None)
    if buffer is None or len(buffer) < size:
        buffer = mmap.mmap(-1, max(size, 2 * len(buffer)) if buffer else size)
        _direct_buffers.buffer = buffer
    return memoryview(buffer)


def _write_direct(path: str, parts: Iterable) -> bool:
    """Writes ``parts`` to a new local file with ``O_DIRECT``; False, with the
    file absent or empty, where the file system does not take it."""
    flag = getattr(os, "O_DIRECT", 0)  # Linux only
    if not flag:
        return False
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC | flag, 0o644)
    except OSError as e:
        if e.errno == errno.EINVAL:
            return False
        raise
    try:
        parts = [memoryview(part).cast("B") for part in parts]
        total = sum(len(part) for part in parts)
        padded = -(-total // _DIRECT_ALIGN) * _DIRECT_ALIGN
        view, at = _aligned_buffer(padded), 0
        for part in parts:
            view[at:at + len(part)] = part
            at += len(part)
        view[total:padded] = bytes(padded - total)
        done = 0
        while done < padded:
            try:
                done += os.write(fd, view[done:padded])
            except OSError as e:
                if e.errno == errno.EINVAL and not done:  # alignment it does not take
                    return False
                raise
        os.ftruncate(fd, total)
        return True
    finally:
        os.close(fd)


def write_uncached(path: str, parts: Iterable) -> None:
    """Writes ``parts`` (bytes-like, back to back) to a new file at ``path``,
    past the page cache where the local file system allows (``O_DIRECT``).

    For files read back once and deleted: copying them into the page cache
    costs more CPU than the write itself when the cache must take pages the
    kernel has not used lately, so the file shuffle's 10x spill cost 1.2 s
    of the job's sys time (docs/benchmarks.md). Elsewhere (gs://, a file
    system without ``O_DIRECT``) the file is written as `open_write` writes.
    """
    parts = list(parts)
    if is_remote(path) or not _write_direct(path, parts):
        with open_write(path) as f:
            for part in parts:
                f.write(part)


def read_bytes(path: str) -> bytes:
    """The file's bytes exactly as stored (no decompression by extension)."""
    with open_read(path) as f:
        return f.read()


def write_bytes(path: str, data: bytes) -> None:
    with open_write(path) as f:
        f.write(data)


def exists(path: str) -> bool:
    if not is_remote(path):
        return os.path.exists(path)
    return _file_systems().exists(path)


def _match_under(directory: str):
    """Metadata of every file directly or indirectly under ``directory``."""
    return _file_systems().match([join_path(directory, "**")])[0].metadata_list


def list_dir(directory: str) -> list[str]:
    """Full paths of the files directly or indirectly under ``directory``."""
    if not is_remote(directory):
        return sorted(os.path.join(root, name)
                      for root, _, names in os.walk(directory) for name in names)
    return sorted(m.path for m in _match_under(directory))


def sizes_under(directory: str) -> dict[str, int]:
    """{path relative to ``directory``, with ``/``: bytes} of every file under it.

    A local file removed while the folder is listed is left out.
    """
    if is_remote(directory):
        prefix = directory.rstrip("/") + "/"
        return {m.path[len(prefix):]: m.size_in_bytes for m in _match_under(directory)}
    sizes = {}
    for root, _, files in os.walk(directory):
        for name in files:
            path = os.path.join(root, name)
            try:
                sizes[os.path.relpath(path, directory).replace(os.sep, "/")] = \
                    os.stat(path).st_size
            except OSError:
                pass  # removed while listing
    return sizes


def size_of(path: str) -> int:
    if not is_remote(path):
        return os.path.getsize(path)
    return _file_systems().match([path])[0].metadata_list[0].size_in_bytes


def make_dirs(directory: str) -> None:
    if not is_remote(directory):
        os.makedirs(directory, exist_ok=True)


def delete(paths: Iterable[str]) -> None:
    paths = list(paths)
    if paths:
        _file_systems().delete(paths)


def delete_tree(directory: str, attempts: int = 5) -> None:
    """Removes a directory (local) or every object under a prefix (GCS).

    A local folder is removed again, up to ``attempts`` times 0.2 s apart,
    while it is still there after a failure: a stopped job's in-process
    workers may add a file before they notice the stop.
    """
    if is_remote(directory):
        delete(list_dir(directory))
        return
    for attempt in range(attempts):
        if not os.path.isdir(directory):
            return
        try:
            _file_systems().delete([directory])
            return
        except Exception:
            if attempt == attempts - 1:
                raise
            time.sleep(0.2)


def rename(sources: list[str], destinations: list[str]) -> None:
    if sources:
        _file_systems().rename(sources, destinations)


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


def top_level(directory: str) -> set[str]:
    """Names of the files directly in ``directory`` (not in its subfolders)."""
    prefix = directory.rstrip("/") + "/"
    return {p[len(prefix):] for p in list_dir(directory)
            if p.startswith(prefix) and "/" not in p[len(prefix):]}


def tree_size(directory: str) -> str:
    """Bytes under ``directory`` as text, for warnings ("unknown" if it cannot be listed)."""
    try:
        if is_remote(directory):
            total = sum(m.size_in_bytes for m in _match_under(directory))
        else:
            total = sum(os.path.getsize(os.path.join(root, name))
                        for root, _, names in os.walk(directory) for name in names)
    except Exception:  # storage failing: the size is what we cannot know
        return "size unknown"
    return f"{total:,} bytes"
