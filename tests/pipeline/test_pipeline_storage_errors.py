"""Disk full and a read-only output at every phase: one `error:` line, exit 2, the truth.

Real faults where the machine allows: a 3 MB tmpfs fills up, a read-only bind
mount refuses writes (chmod does not stop root). Where mounting is not
permitted those tests skip, and the in-process injections below still run.
"""

import errno
import os
import subprocess
import sys

import pytest

from mnist_common import storage_lock
from pipeline import storage
from pipeline.__main__ import main
from pipeline.verify import verify
from tests.helpers import REPO, mount, read_only, run_job


@pytest.fixture
def small_disk(tmp_path):
    disk = tmp_path / "disk"
    disk.mkdir()
    mount("-t", "tmpfs", "-o", "size=3m", "tmpfs", str(disk))
    yield disk
    subprocess.run(["umount", "-l", str(disk)], check=False)


def one_error_line(stderr):
    errors = [line for line in stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "Traceback" not in stderr, stderr[-3000:]
    return errors[0]


@pytest.mark.slow
@pytest.mark.parametrize("earlier", [False, True])
def test_disk_full_during_the_run(small_disk, idx_dir, earlier):
    out = small_disk / "out"
    if earlier:
        run_job([f"--source={idx_dir}", f"--output={out}"])
    before = {p.name: p.read_bytes() for p in out.iterdir()} if earlier else {}
    process = subprocess.run(
        [sys.executable, "-m", "pipeline", "--source=synthetic:30000", f"--output={out}",
         "--runner=DirectRunner", "--overwrite"], cwd=REPO, capture_output=True,
        text=True, timeout=600)
    assert process.returncode == 1, process.stderr[-3000:]  # a failure at run time
    line = one_error_line(process.stderr)
    state = "the earlier dataset there is intact" if earlier else "no dataset was there"
    assert line.startswith(f"error: {out}: storage failed during the run (OSError: "
                           "[Errno 28] No space left on device)"), line
    assert state in line, line
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before  # temp and lock gone
    if earlier:
        verify(str(out))


def test_disk_full_before_the_lock(small_disk, idx_dir, capsys):
    out = small_disk / "out"
    out.mkdir()
    with open(small_disk / "filler", "wb") as f:
        try:
            while True:
                f.write(b"\0" * (1 << 16))
                f.flush()
        except OSError as e:
            assert e.errno == errno.ENOSPC
    assert main([f"--source={idx_dir}", f"--output={out}"]) == 2
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert line.startswith(f"error: {out}: output is not writable (OSError: [Errno 28]"), line
    assert os.listdir(out) == []


@pytest.fixture
def read_only_output(tmp_path, idx_dir):
    """A dataset plus a stale temp folder, then the folder mounted read-only."""
    out = tmp_path / "out"
    run_job([f"--source={idx_dir}", f"--output={out}"])
    (out / ".incomplete-deadrun" / "spill").mkdir(parents=True)
    (out / ".incomplete-deadrun" / "spill" / "x").write_bytes(b"12345")
    before = {p.name for p in out.iterdir()}
    with read_only(out):
        yield out, before


def test_read_only_output_with_a_stale_temp_folder(read_only_output, idx_dir, capsys):
    out, before = read_only_output
    assert main([f"--source={idx_dir}", f"--output={out}", "--overwrite"]) == 2
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert line == (f"error: {out}: output is not writable (OSError: [Errno 30] "
                    "Read-only file system); nothing there was changed"), line
    assert {p.name for p in out.iterdir()} == before
    verify(str(out))


# Injected faults: no mount needed.

@pytest.mark.parametrize("code, text", [(errno.ENOSPC, "No space left on device"),
                                        (errno.EROFS, "Read-only file system")])
def test_storage_failure_taking_the_lock(tmp_path, idx_dir, monkeypatch, capsys, code, text):
    def refuse(self, data):
        raise OSError(code, os.strerror(code), self.path)
    monkeypatch.setattr(storage_lock.LocalLockFile, "create", refuse)
    assert main([f"--source={idx_dir}", f"--output={tmp_path / 'out'}"]) == 2
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert line == (f"error: {tmp_path / 'out'}: output is not writable (OSError: "
                    f"[Errno {code}] {text}); nothing there was changed")


def test_disk_full_inside_a_worker_is_one_line(tmp_path, idx_dir, monkeypatch, capsys):
    """ENOSPC raised in a Beam worker reaches the CLI as one line; temp and lock removed."""
    out = tmp_path / "out"
    run_job([f"--source={idx_dir}", f"--output={out}"])
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    real = storage.write_bytes

    def full(path, data):
        if "/spill/" in path or path.endswith("shards.json"):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), path)
        real(path, data)
    monkeypatch.setattr(storage, "write_bytes", full)
    assert main([f"--source={idx_dir}", f"--output={out}", "--overwrite"]) == 1
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert line == (f"error: {out}: storage failed during the run (OSError: [Errno 28] "
                    "No space left on device); the earlier dataset there is intact")
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before


def test_leftover_temp_folder_is_named_with_its_size(tmp_path, idx_dir, monkeypatch, caplog):
    out = tmp_path / "out"
    real_write, real_delete = storage.write_bytes, storage.delete_tree

    def full(path, data):
        if "/spill/" in path or path.endswith("shards.json"):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), path)
        real_write(path, data)

    def stuck(directory):
        if ".incomplete-" in directory:
            raise OSError(errno.EIO, os.strerror(errno.EIO), directory)
        real_delete(directory)
    monkeypatch.setattr(storage, "write_bytes", full)
    monkeypatch.setattr(storage, "delete_tree", stuck)
    with pytest.raises(Exception, match="No space left on device"):
        run_job([f"--source={idx_dir}", f"--output={out}"])
    left = [p for p in out.iterdir() if p.name.startswith(".incomplete-")]
    assert len(left) == 1
    assert f"Could not remove {left[0]} (" in caplog.text
    assert " bytes)" in caplog.text
