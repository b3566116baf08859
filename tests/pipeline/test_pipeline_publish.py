"""Crash-safe publish: a failure or SIGKILL at every step of finalize, locally and on gs://.

After each fault, readers (pipeline.verify, the trainer's load_manifest, TFDS's
view through dataset_info.json) see the complete old dataset, the complete new
one, or the one-line "interrupted publish" error, never a mix; the next run
completes the publish.
"""

import json
import os
import subprocess
import sys
import uuid

import pytest

import mnist_contract as contract

from pipeline import faults, options, storage
from pipeline.publish import journal
from pipeline.errors import PipelineInputError, StorageError
from pipeline.publish.output import prepared_output
from pipeline.verify import VerificationError, verify
from tests.helpers import EMULATOR_BUCKET, REPO, write_idx_split, run_job


# Tiny data in several shards: below the 1 MB shard size the job otherwise refuses.
OLD = ["--min_shards=2", "--allow_extreme_sharding"]
NEW = ["--min_shards=3", "--allow_extreme_sharding", "--shuffle_salt=other"]


@pytest.fixture(scope="module")
def datasets(tmp_path_factory, digits):
    """Two complete datasets of the same digits that differ in every shard file."""
    root = tmp_path_factory.mktemp("datasets")
    for split, (images, labels) in digits.items():
        write_idx_split(root / "idx", split, images, labels)
    made = {}
    for name, flags in {"old": OLD, "new": NEW}.items():
        out = root / name
        manifest = run_job([f"--source={root / 'idx'}", f"--output={out}", *flags])
        made[name] = (manifest, {p.name: p.read_bytes() for p in out.iterdir()})
    made["idx"] = root / "idx"
    return made


def new_output(where, tmp_path):
    if where == "gcs":
        return f"gs://{EMULATOR_BUCKET}/publish/{uuid.uuid4().hex[:10]}"
    path = tmp_path / uuid.uuid4().hex[:10]
    path.mkdir()
    return str(path)


def stage(output, datasets, run_id="newrun"):
    """The old dataset published, the new one complete in a run's temp folder."""
    temp = f"{output}/.incomplete-{run_id}"
    for name, data in datasets["old"][1].items():
        storage.write_bytes(f"{output}/{name}", data)
    for name, data in datasets["new"][1].items():
        storage.write_bytes(f"{temp}/{name}", data)
    manifest, files = datasets["new"]
    moved = [s for split in manifest.splits.values() for s in split.shards]
    return journal.make_plan(output, temp, run_id, moved, [],
                             contract.TFDS_METADATA_FILES,
                             files[contract.MANIFEST_FILE])


def file_bytes(output, names):
    return {n: storage.read_bytes(f"{output}/{n}") for n in names
            if storage.exists(f"{output}/{n}")}


def tfds_view(output, datasets):
    """What TFDS would read: nothing, or dataset_info plus every shard it names, whole."""
    info_path = f"{output}/dataset_info.json"
    if not storage.exists(info_path):
        return "none"
    info = storage.read_bytes(info_path)
    version = next(v for v in ("old", "new")
                   if datasets[v][1]["dataset_info.json"] == info)
    splits = json.loads(info)["splits"]
    for split in splits:
        lengths = split["shardLengths"]
        names = [contract.shard_filename(split["name"], i, len(lengths))
                 for i in range(len(lengths))]
        assert file_bytes(output, names) == {n: datasets[version][1][n] for n in names}, \
            f"TFDS would read a mix: {version} dataset_info.json with other shards"
    return version


def readers_see(output, datasets):
    """old, new or interrupted, the same for every reader; fails on a mix."""
    try:
        manifest = verify(output)
    except VerificationError as e:
        assert "interrupted publish of run newrun" in str(e) or \
            "interrupted publish" in str(e), str(e)
        seen = "interrupted"
    else:
        seen = next(v for v in ("old", "new") if datasets[v][0] == manifest)
    if not output.startswith("gs://"):
        from trainer.config import TrainerError
        from trainer.data.splits import load_manifest
        if seen == "interrupted":
            with pytest.raises(TrainerError, match="interrupted publish"):
                load_manifest(output)
        else:
            assert load_manifest(output) == datasets[seen][0]
    tfds = tfds_view(output, datasets)
    assert tfds in ({seen, "none"} if seen != "interrupted" else {"none", "new", "old"})
    if seen in ("old", "new"):
        assert tfds == seen
    return seen


def publish_points(tmp_path, datasets, monkeypatch):
    """The fault points a publish passes, in order, recorded from a clean publish."""
    output = new_output("local", tmp_path)
    plan = stage(output, datasets)
    points = []
    monkeypatch.setattr(faults, "point", points.append)
    journal.publish(output, plan)
    monkeypatch.undo()
    assert readers_see(output, datasets) == "new"
    return points


@pytest.mark.parametrize("where", ["local", "gcs"])
def test_failure_at_every_publish_step_rolls_forward(tmp_path, datasets, monkeypatch,
                                                     request, where):
    points = publish_points(tmp_path, datasets, monkeypatch)
    shard_moves = [p for p in points if p.startswith("moved:mnist-")]
    assert len(shard_moves) == 6 and points[0] == "journal-staged"
    assert points[-3:] == ["moved:manifest.json", "journal-deleted", "removing-temp"]
    assert {"hidden:manifest.json", "hidden:dataset_info.json", "deleted-old",
            "moved:dataset_info.json"} <= set(points)
    # Published by then: a failure there is a warning (test_pipeline_rerun.py).
    points.remove("removing-temp")
    if where == "gcs":  # each step is an HTTP call: a representative subset
        request.getfixturevalue("gcs_emulator")
        points = [p for p in points if p in {
            "journal-written", shard_moves[0], "deleted-old", "moved:features.json",
            "moved:manifest.json", "journal-deleted"}]
    seen = {}
    for point in points:
        output = new_output(where, tmp_path)
        plan = stage(output, datasets)
        monkeypatch.setenv(faults.ENV, f"enospc@{point}")
        with pytest.raises(OSError, match="No space left"):
            journal.publish(output, plan)
        monkeypatch.delenv(faults.ENV)
        seen[point] = readers_see(output, datasets)
        # What the next run does before its own work: complete the publish (if a
        # journal exists) and remove lock-less temp folders.
        with prepared_output(options.parse([f"--output={output}", "--overwrite"]),
                             "next") as layout:
            pass
        storage.delete_tree(layout.temp_dir)
        assert readers_see(output, datasets) == ("old" if seen[point] == "old" else "new")
        assert not any(n.startswith(".incomplete-") or n == ".lock"
                       for n in storage.list_top(output)), point
    assert seen.get("journal-staged", "old") == "old"
    assert seen["journal-deleted"] == "new"
    assert all(seen[p] == "interrupted" for p in points[1:-1]), seen


def test_interrupted_publish_cannot_complete_without_its_temp_files(tmp_path, datasets,
                                                                    monkeypatch):
    output = new_output("local", tmp_path)
    plan = stage(output, datasets)
    monkeypatch.setenv(faults.ENV, "enospc@moved:mnist-train.tfrecord-00000-of-00003")
    with pytest.raises(OSError):
        journal.publish(output, plan)
    os.remove(f"{output}/.incomplete-newrun/mnist-train.tfrecord-00001-of-00003")
    with pytest.raises(journal.PublishError, match="00001-of-00003: missing"):
        journal.roll_forward(output)
    monkeypatch.delenv(faults.ENV)
    args = [f"--source={datasets['idx']}", f"--output={output}"]
    with pytest.raises(PipelineInputError, match="cannot be completed; pass --overwrite"):
        run_job(args)
    manifest = run_job(args + ["--overwrite"])
    assert verify(output) == manifest


@pytest.mark.parametrize("point, earlier", [
    ("journal-staged", "the earlier dataset there is intact"),
    ("moved:mnist-test.tfrecord-00001-of-00003", "interrupted publish of run"),
])
def test_job_storage_failure_while_publishing_says_what_is_left(tmp_path, datasets,
                                                                monkeypatch, point, earlier):
    output = str(tmp_path / "out")
    args = [f"--source={datasets['idx']}", f"--output={output}"]
    run_job(args + OLD)
    monkeypatch.setenv(faults.ENV, f"enospc@{point}")
    with pytest.raises(StorageError, match=f"No space left on device.*; {earlier}"):
        run_job(args + NEW + ["--overwrite"])
    monkeypatch.delenv(faults.ENV)
    left = os.listdir(output)
    assert ".lock" not in left
    if point == "journal-staged":
        assert readers_see(output, datasets) == "old"
        assert not [n for n in left if n.startswith(".incomplete-")], left
    else:
        assert readers_see(output, datasets) == "interrupted"
        with pytest.raises(PipelineInputError,
                           match="completed the interrupted publish of run .* --overwrite"):
            run_job(args)
        assert readers_see(output, datasets) == "new"


def run_killed(output, idx, point):
    process = subprocess.run(
        [sys.executable, "-m", "pipeline", f"--source={idx}", f"--output={output}",
         "--runner=DirectRunner", *NEW, "--overwrite"],
        cwd=REPO, capture_output=True, text=True, timeout=300,
        env={**os.environ, faults.ENV: f"kill@{point}", "NO_GCE_CHECK": "True"})
    assert process.returncode == -9, process.stderr[-2000:]


@pytest.mark.slow
@pytest.mark.parametrize("where, point", [
    ("local", "hidden:manifest.json"),
    ("local", "moved:mnist-train.tfrecord-00001-of-00003"),
    ("local", "moved:manifest.json"),
    ("gcs", "moved:mnist-test.tfrecord-00000-of-00003"),
    ("gcs", "moved:dataset_info.json"),
])
def test_sigkill_during_publish_then_next_run_completes(tmp_path, datasets, request,
                                                        where, point):
    if where == "gcs":
        request.getfixturevalue("gcs_emulator")
    output = new_output(where, tmp_path)
    args = [f"--source={datasets['idx']}", f"--output={output}"]
    run_job(args + OLD)
    assert readers_see(output, datasets) == "old"
    run_killed(output, datasets["idx"], point)
    assert readers_see(output, datasets) == "interrupted"
    # The killed run's lock is taken over (its pid is gone), the publish completed,
    # and without --overwrite the run then refuses, saying so.
    with pytest.raises(PipelineInputError, match="completed the interrupted publish"):
        run_job(args)
    assert readers_see(output, datasets) == "new"
    assert not any(n.startswith(".incomplete-") or n == ".lock"
                   for n in storage.list_top(output))
