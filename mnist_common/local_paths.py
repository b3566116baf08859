"""Every delete and move the programs make, none through a symbolic link.

The job, the trainer and the launchers delete and move only what they made,
and only through these functions (tests/test_imports_layout.py fails on a
direct ``rmtree``, ``remove``, ``unlink``, ``rename``, ``replace`` or
``move`` anywhere else in their packages). On local disk:

* `remove_tree` removes a folder and everything under it; a symbolic link
  inside it is removed as a link (the walk opens no link). A symbolic link
  where the folder is expected is removed as a link, with a warning naming
  its target, which is left as it is; a file there is removed.
* `remove_files` removes files; a symbolic link is removed as a link, never
  its target.
* `move` renames a file or folder; a symbolic link as the source is refused
  (`SymlinkRefused`: what a program moves it made itself). A rename never
  follows the target: with ``overwrite`` a link there is replaced as a link;
  without it anything there is refused (``FileExistsError``).
* `check_is_file` refuses a folder, FIFO, socket or device where a data
  file is read (`NotAFile`): opening a FIFO waits for a writer forever.

Other schemes (``gs://``, ``ram://``) have no symbolic links: such paths go
to the caller's store, `GFILE` (``tf.io.gfile``, the trainer's) or `BEAM`
(Beam's ``FileSystems``, the job's), each imported at its first use, so
this module imports with the standard library alone.
"""

from __future__ import annotations

import errno
import logging
import os
import shutil
import stat
from typing import Iterable, Sequence

log = logging.getLogger(__name__)


class SymlinkRefused(OSError):
    """A symbolic link where a program was to move what it made."""


class NotAFile(OSError):
    """A local path that is a folder, FIFO, socket or device where a file should be."""


def is_local(path: str) -> bool:
    return "://" not in path


def is_link(path: str) -> bool:
    """Whether ``path`` is a local symbolic link (never on other schemes)."""
    return is_local(path) and os.path.islink(path)


def _link_target(path: str) -> str:
    try:
        return os.readlink(path)
    except OSError:
        return "?"


class _Gfile:
    """``tf.io.gfile`` for non-local paths (TensorFlow imported at first use)."""

    @staticmethod
    def _io():
        import tensorflow as tf
        return tf.io.gfile

    def delete(self, paths: Sequence[str]) -> None:
        for path in paths:
            self._io().remove(path)

    def delete_tree(self, path: str) -> None:
        self._io().rmtree(path)

    def rename(self, sources: Sequence[str], targets: Sequence[str],
               overwrite: bool) -> None:
        for source, target in zip(sources, targets):
            self._io().rename(source, target, overwrite=overwrite)


class _Beam:
    """Beam's ``FileSystems`` for non-local paths (Beam imported at first use)."""

    @staticmethod
    def _fs():
        from apache_beam.io.filesystems import FileSystems
        return FileSystems

    def delete(self, paths: Sequence[str]) -> None:
        if paths:
            self._fs().delete(list(paths))

    def delete_tree(self, path: str) -> None:
        pattern = path.rstrip("/") + "/**"
        self.delete([m.path for m in self._fs().match([pattern])[0].metadata_list])

    def rename(self, sources: Sequence[str], targets: Sequence[str],
               overwrite: bool) -> None:
        if not overwrite:
            raise ValueError("Beam's FileSystems renames over what is there")
        if sources:
            self._fs().rename(list(sources), list(targets))


GFILE = _Gfile()
BEAM = _Beam()


def remove_tree(path: str, via=GFILE) -> None:
    """Removes the folder ``path`` and everything under it (see the module
    docstring for a link or a file there); nothing there raises
    ``FileNotFoundError`` (locally) or the store's not-found error."""
    if not is_local(path):
        via.delete_tree(path)
        return
    mode = os.lstat(path).st_mode
    if stat.S_ISLNK(mode):
        target = _link_target(path)
        os.unlink(path)
        log.warning("%s: a symbolic link (to %s) where a folder was expected; "
                        "removed the link, %s is left as it is", path, target, target)
    elif stat.S_ISDIR(mode):
        shutil.rmtree(path)  # fd-based on Linux: opens no link, even one swapped in
    else:
        os.unlink(path)


def remove_files(paths: Iterable[str], via=GFILE) -> None:
    """Removes each file; a local symbolic link is removed as a link, a local
    folder raises ``IsADirectoryError`` (nothing under it is touched)."""
    paths = list(paths)
    for path in paths:
        if is_local(path):
            if stat.S_ISDIR(os.lstat(path).st_mode):
                raise IsADirectoryError(errno.EISDIR, "a folder, not a file", path)
            os.unlink(path)
    via.delete([p for p in paths if not is_local(p)])


def remove_file(path: str, via=GFILE) -> None:
    remove_files([path], via)


def move(source: str, target: str, *, overwrite: bool, via=GFILE) -> None:
    """Renames ``source`` to ``target`` (see the module docstring)."""
    move_all([source], [target], overwrite=overwrite, via=via)


def move_all(sources: Sequence[str], targets: Sequence[str], *, overwrite: bool,
             via=GFILE) -> None:
    """`move` for each pair; non-local pairs go to ``via`` in one call."""
    if len(sources) != len(targets):
        raise ValueError("move_all: as many targets as sources")
    remote = [(s, t) for s, t in zip(sources, targets) if not is_local(s)]
    for source, target in zip(sources, targets):
        if is_local(source):
            _move_local(source, target, overwrite)
    if remote:
        via.rename([s for s, _ in remote], [t for _, t in remote], overwrite)


def _move_local(source: str, target: str, overwrite: bool) -> None:
    if stat.S_ISLNK(os.lstat(source).st_mode):
        raise SymlinkRefused(errno.ELOOP, f"a symbolic link (to {_link_target(source)}) "
                             "where this program's own file or folder was expected; "
                             "not moved", source)
    if not overwrite and os.path.lexists(target):
        raise FileExistsError(errno.EEXIST, "already exists", target)
    os.rename(source, target)


_KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"),
          (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a device"), (stat.S_ISBLK, "a device"))


def check_is_file(path: str) -> None:
    """Raises `NotAFile` unless the local ``path`` is a regular file (a link to
    one counts): opening a FIFO would wait for a writer forever, reading a
    folder fails deep inside a reader. Non-local paths pass."""
    if not is_local(path):
        return
    mode = os.stat(path).st_mode
    if not stat.S_ISREG(mode):
        kind = next((name for test, name in _KINDS if test(mode)), "of another kind")
        raise NotAFile(errno.EINVAL, f"is {kind}, not a file", path)
