"""`python -m pipeline.verify` on a damaged manifest.json: one line naming it, exit 1."""

import pytest

from pipeline.verify import main

DEEP = b"[" * 100_000 + b"]" * 100_000


@pytest.mark.parametrize("content, problem", [
    (b"[]", "top level must be a JSON object, not list"),
    (b"null", "top level must be a JSON object, not NoneType"),
    (b'"a string"', "top level must be a JSON object, not str"),
    (b'{"format_version": 1, "dataset": "mnist", "image_format": "raw", '
     b'"compression": "none", "splits": []}', "'splits' must be an object"),
    (b"\xff\xfe{}", "not UTF-8 text"),
    (DEEP, "nested too deeply"),
    (b'{"format_version": 1, "dataset": "mnist", "image_format": "raw", '
     b'"compression": "none", "splits": {"train": {"num_examples": -1, "shards": [{'
     b'"file": "mnist-train.tfrecord-00000-of-00001", "num_examples": -1, '
     b'"num_bytes": 820, "sha256": "' + b"0" * 64 + b'"}]}}}', "num_examples must be >= 1"),
])
def test_bad_manifest_is_one_line(tmp_path, capsys, content, problem):
    (tmp_path / "manifest.json").write_bytes(content)
    assert main([str(tmp_path)]) == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in captured.err, captured.err[-2000:]
    assert lines[0].startswith(f"error: {tmp_path}/manifest.json: "), lines[0]
    assert problem in lines[0], lines[0]


def test_journal_is_reported_before_the_manifest(tmp_path, capsys):
    (tmp_path / "manifest.json").write_bytes(b"{}")
    (tmp_path / ".publish-journal.json").write_bytes(b'{"run_id": "abc123"}')
    assert main([str(tmp_path)]) == 2
    assert capsys.readouterr().err.strip() == (
        f"error: {tmp_path}/.publish-journal.json: interrupted publish of run abc123 "
        "(or one still in progress); rerun the job to complete it")
