"""`python -m pipeline.verify` passes a good dataset and names the file of each fault."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest


from pipeline.verify import main
from tests.helpers import REPO, run_job


@pytest.fixture
def dataset(tmp_path, idx_dir):
    out = tmp_path / "out"
    run_job([f"--source={idx_dir}", f"--output={out}", "--runner=DirectRunner",
             "--min_shards=3", "--allow_extreme_sharding"])
    return out


def test_good_dataset_passes(dataset, capsys):
    assert main([str(dataset)]) == 0
    assert "train: 360 examples in 3 shard(s) verified" in capsys.readouterr().out


def _flip_byte(path, offset):
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x01
    path.write_bytes(bytes(data))


def _edit_manifest(dataset, edit):
    path = dataset / "manifest.json"
    raw = json.loads(path.read_text())
    edit(raw)
    path.write_text(json.dumps(raw))


SHARD = "mnist-train.tfrecord-00001-of-00003"


@pytest.mark.parametrize("fault, expected", [
    ("corrupt byte", f"{SHARD}: sha256 does not match"),
    ("truncate", "bytes, manifest says"),
    ("delete", f"{SHARD}: listed in the manifest but missing"),
    ("manifest count", "split 'train' says 361 examples"),
    ("manifest checksum", f"{SHARD}: sha256 does not match"),
    ("corrupt byte, manifest re-hashed", f"{SHARD}: bad data CRC"),
    ("extra shard", "mnist-train.tfrecord-00003-of-00004: shard file not listed"),
    ("missing manifest", "manifest.json: missing"),
])
def test_faults_are_named(dataset, capsys, fault, expected):
    shard = dataset / SHARD
    if fault == "corrupt byte":
        _flip_byte(shard, 500)
    elif fault == "truncate":
        shard.write_bytes(shard.read_bytes()[:-10])
    elif fault == "delete":
        shard.unlink()
    elif fault == "manifest count":
        _edit_manifest(dataset, lambda m: m["splits"]["train"].update(num_examples=361))
    elif fault == "manifest checksum":
        _edit_manifest(dataset, lambda m: m["splits"]["train"]["shards"][1].update(
            sha256="0" * 64))
    elif fault == "corrupt byte, manifest re-hashed":
        import hashlib
        _flip_byte(shard, 500)
        digest = hashlib.sha256(shard.read_bytes()).hexdigest()
        _edit_manifest(dataset, lambda m: m["splits"]["train"]["shards"][1].update(
            sha256=digest))
    elif fault == "extra shard":
        (dataset / "mnist-train.tfrecord-00003-of-00004").write_bytes(b"")
    elif fault == "missing manifest":
        (dataset / "manifest.json").unlink()
    assert main([str(dataset)]) == 2  # a damaged dataset: bad input
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and expected in err[0], err


@pytest.mark.parametrize("where, kind", [
    (SHARD, "directory"), (SHARD, "FIFO"), ("manifest.json", "directory"),
    (".publish-journal.json", "directory")])
def test_a_folder_or_fifo_where_a_file_belongs(dataset, where, kind):
    """One line naming it, exit 2; a FIFO is not opened (that would wait forever,
    hence a process with a timeout)."""
    path = dataset / where
    if path.exists():
        path.unlink()
    if kind == "FIFO":
        os.mkfifo(path)
    else:
        path.mkdir()
    result = subprocess.run([sys.executable, "-m", "pipeline.verify", str(dataset)],
                            cwd=REPO, capture_output=True, text=True, timeout=60)
    assert result.returncode == 2, result.stderr[-2000:]
    assert result.stderr.splitlines() == [f"error: {path}: is a {kind}, not a file"]


def test_abbreviated_flag_is_refused(dataset, capsys, tmp_path):
    """``--prev`` is not ``--preview``: one line, exit 2, nothing drawn."""
    with pytest.raises(SystemExit) as stopped:
        main([str(dataset), f"--prev={tmp_path}/preview.png"])
    assert stopped.value.code == 2
    assert capsys.readouterr().err.splitlines() == [
        f"error: unrecognized arguments: --prev={tmp_path}/preview.png; "
        "did you mean --preview, not --prev? (see --help)"]
    assert not (tmp_path / "preview.png").exists()


def test_a_flag_given_twice_is_refused(dataset, capsys, tmp_path):
    """``--preview`` twice: one line, exit 2, nothing drawn (the last one used to win)."""
    first, second = tmp_path / "a.png", tmp_path / "b.png"
    with pytest.raises(SystemExit) as stopped:
        main([str(dataset), f"--preview={first}", f"--preview={second}"])
    assert stopped.value.code == 2
    assert capsys.readouterr().err.splitlines() == [
        f"error: --preview given twice (--preview={first}, then --preview={second}); "
        "give each flag once (see --help)"]
    assert not first.exists() and not second.exists()


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=lambda s: s.name)
def test_a_signal_while_verifying_is_one_line(dataset, tmp_path, signum):
    """Held before its second shard (`pipeline.faults`), verify gets the signal."""
    gate = tmp_path / "gate"
    proc = subprocess.Popen(
        [sys.executable, "-m", "pipeline.verify", str(dataset)], cwd=REPO,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "PIPELINE_FAULT": f"wait@verify:{SHARD}",
             "PIPELINE_FAULT_GATE": str(gate)})
    deadline = time.monotonic() + 60
    while not (tmp_path / "gate.reached").exists() and time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.02)
    proc.send_signal(signum)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 128 + signum, err
    assert (out, err.splitlines()) == ("", [
        f"error: python -m pipeline.verify: interrupted ({signum.name}) before the "
        "dataset was verified"])
