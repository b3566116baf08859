"""The job deletes and moves nothing through a symbolic link: a publish journal
names only plain children of the output that the job makes, a temp folder or
staged file that is a link is refused, and a lock that is a link is named."""

from __future__ import annotations

import hashlib
import json
import os

import pytest

import mnist_contract as contract
from pipeline.__main__ import main
from tests.helpers import run_job

FLAGS = ["--runner=DirectRunner", "--min_shards=2", "--allow_extreme_sharding"]
SHARD = "mnist-train.tfrecord-00000-of-00002"


def files(folder) -> dict:
    """{name: bytes} of the files at the top of ``folder`` (no journal, no lock)."""
    return {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file()
            and p.name not in (contract.PUBLISH_JOURNAL_FILE, ".lock")}


@pytest.fixture
def published(tmp_path, idx_dir):
    """(args, output, its files): a published dataset with a file of the user's."""
    out = tmp_path / "out"
    args = [f"--source={idx_dir}", f"--output={out}", *FLAGS]
    run_job(args)
    (out / "NOTES.txt").write_text("the user's notes\n")
    return args, out, files(out)


def write_journal(out, **fields) -> str:
    plan = {"version": 1, "run_id": "r1", "temp_name": ".incomplete-r1", "shards": [],
            "metadata": [], "deletes": [], "options": {},
            "manifest_sha256": hashlib.sha256(
                (out / contract.MANIFEST_FILE).read_bytes()).hexdigest(), **fields}
    path = out / contract.PUBLISH_JOURNAL_FILE
    path.write_text(json.dumps(plan))
    return str(path)


def outside_folder(tmp_path):
    """A folder the job does not own, holding a file named like a shard."""
    folder = tmp_path / "outside"
    folder.mkdir()
    (folder / SHARD).write_bytes(b"not the job's")
    return folder


def test_a_journal_naming_the_output_itself_is_refused(published, capsys):
    args, out, before = published
    journal = write_journal(out, temp_name=".", deletes=["NOTES.txt"],
                            metadata=list(contract.TFDS_METADATA_FILES))
    assert main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == (f"error: {journal}: publish journal names '.', not a file or "
                       "folder this job makes in the output; pass --overwrite to "
                       "replace what is there")
    assert files(out) == before
    assert main(args + ["--overwrite"]) == 0
    assert (out / "NOTES.txt").read_text() == "the user's notes\n"


@pytest.mark.parametrize("fields", [
    {"deletes": ["NOTES.txt"]}, {"shards": [["NOTES.txt", 17]]},
    {"metadata": ["manifest.json"]}, {"temp_name": ".incomplete-r2"},
    {"run_id": "..", "temp_name": ".incomplete-.."},
])
def test_a_journal_naming_what_the_job_does_not_make_is_refused(published, capsys, fields):
    args, out, before = published
    write_journal(out, **fields)
    assert main(args) == 2
    assert "not a file or folder this job makes" in capsys.readouterr().err
    assert files(out) == before


def test_a_temp_folder_that_is_a_symlink_is_refused_and_removed_as_a_link(
        published, capsys, tmp_path):
    args, out, before = published
    outside = outside_folder(tmp_path)
    os.symlink(outside, out / ".incomplete-r1")
    write_journal(out, shards=[[SHARD, len(b"not the job's")]])
    assert main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == (f"error: {out}/.incomplete-r1: a symbolic link, not the folder "
                       "this job made; nothing is moved out of it; pass --overwrite to "
                       "replace what is there")
    assert files(out) == before
    assert main(args + ["--overwrite"]) == 0
    assert not os.path.lexists(out / ".incomplete-r1")
    assert files(outside) == {SHARD: b"not the job's"}


def test_a_staged_file_that_is_a_symlink_is_not_moved(published, capsys, tmp_path):
    args, out, before = published
    outside = outside_folder(tmp_path)
    (out / ".incomplete-r1").mkdir()
    os.symlink(outside / SHARD, out / ".incomplete-r1" / SHARD)
    write_journal(out, shards=[[SHARD, len(b"not the job's")]])
    assert main(args) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        f"error: {out}/.incomplete-r1/{SHARD}: a symbolic link, not a file this job "
        "wrote; not moved into the output; pass --overwrite to replace what is there")
    assert files(out) == before
    assert files(outside) == {SHARD: b"not the job's"}


def test_a_lock_that_is_a_dangling_symlink_is_named(tmp_path, idx_dir, capsys):
    out = tmp_path / "out"
    out.mkdir()
    os.symlink(tmp_path / "nowhere", out / ".lock")
    assert main([f"--source={idx_dir}", f"--output={out}", *FLAGS]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        f"error: {out}/.lock: a symbolic link to {tmp_path / 'nowhere'}, not a lock file; "
        "remove it; nothing there was changed")
    assert os.path.islink(out / ".lock") and os.listdir(out) == [".lock"]


def test_a_journal_that_is_a_fifo_is_named_not_read(published, capsys):
    args, out, before = published
    os.mkfifo(out / contract.PUBLISH_JOURNAL_FILE)
    assert main(args) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        f"error: {out / contract.PUBLISH_JOURNAL_FILE}: is a FIFO, not a file; pass "
        "--overwrite to replace what is there")
    assert files(out) == before
