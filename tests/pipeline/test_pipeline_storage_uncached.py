"""`storage.open_uncached`, how spill files and shards are written: past the page
cache where the local file system takes ``O_DIRECT``, buffered elsewhere, the same
bytes either way."""

import errno
import os
import subprocess

import numpy as np
import pytest

from pipeline import storage
from tests.helpers import mount


def _o_direct_taken(folder) -> bool:
    try:
        fd = os.open(folder / ".probe", os.O_WRONLY | os.O_CREAT | os.O_DIRECT, 0o644)
    except OSError:
        return False
    os.close(fd)
    os.unlink(folder / ".probe")
    return True


@pytest.fixture
def direct_dir(tmp_path):
    if not hasattr(os, "O_DIRECT") or not _o_direct_taken(tmp_path):
        pytest.skip("this file system does not take O_DIRECT")
    return tmp_path


def _parts(size: int) -> list:
    data = np.random.default_rng(size).integers(0, 256, size, np.uint8)
    return [data, data[:size // 3].tobytes(), b"tail", *[b"x" * 700] * 20]


def _write(path, parts) -> None:
    with storage.open_uncached(str(path)) as f:
        for part in parts:
            f.write(part)


@pytest.mark.parametrize("size", [0, 1, 4095, 4096, 4097, (3 << 20) + 5, (8 << 20) * 2 + 5])
def test_parts_are_written_back_to_back_with_o_direct(direct_dir, monkeypatch, size):
    flags, real_open = [], os.open
    monkeypatch.setattr(os, "open", lambda path, flag, *rest: flags.append(flag)
                        or real_open(path, flag, *rest))
    path = direct_dir / "spill" / "run"
    parts = _parts(size)
    _write(path, parts)
    assert path.read_bytes() == b"".join(bytes(part) for part in parts)
    assert len(flags) == 1 and flags[0] & os.O_DIRECT


def test_a_reused_buffer_leaves_nothing_of_a_longer_file(direct_dir):
    _write(direct_dir / "long", _parts(1 << 20))
    _write(direct_dir / "short", [b"abc"])
    assert (direct_dir / "short").read_bytes() == b"abc"


def test_without_o_direct_the_file_is_written_buffered(tmp_path, monkeypatch):
    real_open = os.open

    def refuse_direct(path, flag, *rest):
        if flag & getattr(os, "O_DIRECT", 0):
            raise OSError(errno.EINVAL, os.strerror(errno.EINVAL), path)
        return real_open(path, flag, *rest)
    monkeypatch.setattr(os, "open", refuse_direct)
    parts = _parts(5000)
    _write(tmp_path / "run", parts)
    assert (tmp_path / "run").read_bytes() == b"".join(bytes(part) for part in parts)


@pytest.mark.parametrize("size", [5000, (8 << 20) * 2 + 5])
def test_a_write_the_file_system_refuses_as_unaligned_is_written_buffered(direct_dir,
                                                                         monkeypatch, size):
    def refuse(fd, data):
        raise OSError(errno.EINVAL, os.strerror(errno.EINVAL))
    monkeypatch.setattr(os, "write", refuse)
    parts = _parts(size)
    _write(direct_dir / "run", parts)
    assert (direct_dir / "run").read_bytes() == b"".join(bytes(part) for part in parts)


def test_a_full_disk_raises_enospc(tmp_path):
    disk = tmp_path / "disk"
    disk.mkdir()
    mount("-t", "tmpfs", "-o", "size=1m", "tmpfs", str(disk))
    try:
        with pytest.raises(OSError) as raised:
            _write(disk / "run", [bytes(2 << 20)])
        assert raised.value.errno == errno.ENOSPC
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False)


def test_the_file_mode_is_what_open_gives(direct_dir):
    umask = os.umask(0o002)  # a group-writable umask, as on shared machines
    try:
        _write(direct_dir / "direct", [b"abc"])
        with open(direct_dir / "buffered", "wb") as f:
            f.write(b"abc")
    finally:
        os.umask(umask)
    assert (direct_dir / "direct").stat().st_mode == (direct_dir / "buffered").stat().st_mode
