"""The job's only file I/O: local paths and ``gs://`` through Beam's FileSystems.

Sources, shards, spill files, metadata and the publish all read, write,
list and remove files through these functions, so each is written once and
bytes are always read and written as stored (no decompression by file
extension). Only the output's lock (`pipeline.publish.lock`) goes to the
disk or the GCS client itself: it needs conditional creates and rewrites,
which FileSystems does not offer. Reading a local file (opening, listing,
testing, sizing) goes straight to the operating system, and Beam is imported
on first use only, so a reader of local output (``pipeline.verify``) starts
without loading Beam. So do local writes of large files written once
(`open_uncached`: the file shuffle's spill files and the shards).

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
import threading
import time
from typing import Iterable

from mnist_common import local_paths
from mnist_common.flags import SECONDS, environ_number
from mnist_contract import join_path

from pipeline import _compat

_MIME = "application/octet-stream"
RETRY_DEADLINE_ENV = "MNIST_GCS_RETRY_DEADLINE_S"


def configure_gcs() -> None:
    """Called by the driver and by each worker before touching gs://."""
    apply_gcs_retry_deadline()
    use_anonymous_gcs_for_emulator()


def gcs_retry_deadline():
    """``$MNIST_GCS_RETRY_DEADLINE_S`` in seconds, None when unset; a value that
    is no `mnist_common.flags.SECONDS`: `mnist_common.flags.EnvironmentValueError`
    (the command line checks it before anything runs: `pipeline.options`)."""
    return environ_number(RETRY_DEADLINE_ENV, SECONDS, None)


def apply_gcs_retry_deadline() -> None:
    """Gives Beam's GCS retries the deadline ``$MNIST_GCS_RETRY_DEADLINE_S``, if set."""
    deadline = gcs_retry_deadline()
    if deadline is not None:
        _compat.set_gcs_retry_deadline(deadline)


def use_anonymous_gcs_for_emulator() -> None:
    """Skips Google's credential lookup when a local GCS API server stands in."""
    if os.environ.get("STORAGE_EMULATOR_HOST"):
        _compat.skip_beam_credential_lookup()


def raise_open_file_limit(wanted: int) -> int:
    """Raises this process's soft limit on open files to ``wanted``, as far as
    the hard limit allows; returns the soft limit now in force.

    Many systems start processes at a soft limit of 1,024 under a far higher
    hard limit; child processes inherit the raised limit.
    """
    import resource
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft >= wanted:
        return wanted if soft == resource.RLIM_INFINITY else soft
    raised = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (raised, hard))
    except (ValueError, OSError):
        return soft
    return raised


def is_remote(path: str) -> bool:
    return "://" in path


def _file_systems():
    """Beam's ``FileSystems``, imported when a remote path or a write needs it."""
    from apache_beam.io.filesystems import FileSystems
    return FileSystems


def _uncompressed():
    from apache_beam.io.filesystem import CompressionTypes
    return CompressionTypes.UNCOMPRESSED


NotAFile = local_paths.NotAFile  # a folder, FIFO, socket or device where a file should be
_check_is_file = local_paths.check_is_file


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
_DIRECT_BLOCK = 8 << 20  # bytes an uncached file gathers before it writes
# Buffers of closed uncached files, for the next ones: memory the process has
# already touched (a fresh mapping costs a page fault per 4 KiB).
_spare_buffers: list = []
_spare_lock = threading.Lock()


def _take_buffer() -> mmap.mmap:
    with _spare_lock:
        return _spare_buffers.pop() if _spare_buffers else mmap.mmap(-1, _DIRECT_BLOCK)


def _give_back(buffer: mmap.mmap) -> None:
    with _spare_lock:
        _spare_buffers.append(buffer)


class _UncachedFile:
    """A new local file written past the page cache (``O_DIRECT``), in aligned
    blocks gathered in a buffer it holds until closed; written as `open_write`
    writes when the file system refuses the first block."""

    def __init__(self, path: str, fd: int):
        self._path, self._fd, self._buffered = path, fd, None
        self._buffer = _take_buffer()
        self._view = memoryview(self._buffer)
        self._fill = self._written = 0

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def write(self, data) -> None:
        if self._buffered is not None:
            self._buffered.write(data)
            return
        data = memoryview(data).cast("B")
        while len(data):
            take = min(len(data), _DIRECT_BLOCK - self._fill)
            self._view[self._fill:self._fill + take] = data[:take]
            self._fill += take
            data = data[take:]
            if self._fill == _DIRECT_BLOCK:
                self._flush(_DIRECT_BLOCK)
                if self._buffered is not None:  # the file system refused it
                    self._buffered.write(data)
                    return

    def _flush(self, length: int) -> None:
        """Writes the buffer's first ``length`` bytes (a multiple of the alignment)."""
        done = 0
        while done < length:
            try:
                done += os.write(self._fd, self._view[done:length])
            except OSError as e:
                if e.errno != errno.EINVAL or self._written or done:
                    raise
                self._fall_back()
                return
        self._written += length
        self._fill = 0

    def _fall_back(self) -> None:
        os.close(self._fd)
        self._fd = None
        self._buffered = open_write(self._path)
        self._buffered.write(self._view[:self._fill])

    def _flush_last(self) -> None:
        """Writes the last block, zero-padded to the alignment, then cuts the
        file to its length (unless that write fell back to a buffered file)."""
        size = self._written + self._fill
        padded = -(-self._fill // _DIRECT_ALIGN) * _DIRECT_ALIGN
        self._view[self._fill:padded] = bytes(padded - self._fill)
        self._flush(padded)
        if self._fd is not None:
            os.ftruncate(self._fd, size)

    def close(self) -> None:
        if self._fd is None and self._buffered is None:
            return
        try:
            if self._buffered is None:
                self._flush_last()
            if self._buffered is not None:
                self._buffered.close()
        finally:
            if self._fd is not None:
                os.close(self._fd)
            self._fd = self._buffered = None
            self._view.release()
            _give_back(self._buffer)


def open_uncached(path: str):
    """A new binary file at ``path``, written past the page cache where the
    local file system allows (``O_DIRECT``); elsewhere (gs://, a file system
    without it) `open_write`'s file.

    For large files written once: copying them into the page cache costs more
    CPU than the write itself when the cache must take pages the kernel has
    not used lately (docs/benchmarks.md, the conversion job).
    """
    flag = getattr(os, "O_DIRECT", 0)  # Linux only
    if is_remote(path) or not flag:
        return open_write(path)
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC | flag,
                     0o666)  # less the umask, as open() creates files
    except OSError as e:
        if e.errno != errno.EINVAL:
            raise
        return open_write(path)
    return _UncachedFile(path, fd)


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


def is_link(path: str) -> bool:
    """Whether ``path`` is a local symbolic link (gs:// has none)."""
    return local_paths.is_link(path)


def make_dirs(directory: str) -> None:
    if not is_remote(directory):
        os.makedirs(directory, exist_ok=True)


def delete(paths: Iterable[str]) -> None:
    """Removes files; a local symbolic link is removed as a link (`mnist_common.local_paths`)."""
    local_paths.remove_files(paths, via=local_paths.BEAM)


def delete_tree(directory: str, attempts: int = 5) -> None:
    """Removes a directory (local) or every object under a prefix (GCS).

    A local folder is removed again, up to ``attempts`` times 0.2 s apart,
    while it is still there after a failure: a stopped job's in-process
    workers may add a file before they notice the stop. A symbolic link
    there is removed as a link (`mnist_common.local_paths`).
    """
    if is_remote(directory):
        delete(list_dir(directory))
        return
    for attempt in range(attempts):
        if not os.path.lexists(directory):
            return
        try:
            local_paths.remove_tree(directory)
            return
        except Exception:
            if attempt == attempts - 1:
                raise
            time.sleep(0.2)


def rename(sources: list[str], destinations: list[str]) -> None:
    """Moves files over what is at their destinations; a local symbolic link
    as a source is refused (`mnist_common.local_paths.SymlinkRefused`)."""
    local_paths.move_all(sources, destinations, overwrite=True, via=local_paths.BEAM)


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
