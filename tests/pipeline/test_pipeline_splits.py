"""--splits: duplicates refused; a subset over a dataset keeps the others or refuses."""

import json

import pytest


from pipeline.__main__ import main
from pipeline.errors import PipelineInputError
from pipeline.verify import verify
from tests.helpers import run_job


def files(out):
    return {p.name: p.read_bytes() for p in out.iterdir()}


def test_duplicate_split_is_one_line_exit_2(tmp_path, idx_dir, capsys):
    out = tmp_path / "out"
    assert main([f"--source={idx_dir}", f"--output={out}", "--splits=train,train"]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == \
        "error: --splits=train,train: a split is named twice"
    assert not out.exists()


def test_subset_overwrite_keeps_the_other_splits_when_options_match(tmp_path, idx_dir):
    out = tmp_path / "out"
    first = run_job([f"--source={idx_dir}", f"--output={out}", "--min_shards=2",
                     "--allow_extreme_sharding"])
    before = files(out)
    second = run_job([f"--source={idx_dir}", f"--output={out}", "--min_shards=3",
                      "--allow_extreme_sharding", "--splits=train", "--overwrite"])
    assert second.split("test") == first.split("test")
    assert len(second.split("train").shards) == 3
    assert verify(str(out)) == second
    after = files(out)
    for name in first.split("test").files:
        assert after[name] == before[name]
    assert not set(first.split("train").files) & set(after)
    info = json.loads(after["dataset_info.json"])
    assert sorted(s["name"] for s in info["splits"]) == ["test", "train"]


@pytest.mark.parametrize("flag, differs", [
    ("--image_format=png", "image_format 'raw' vs 'png'"),
    ("--shuffle_salt=other", "shuffle_salt 'mnist-tfrecords-v1' vs 'other'"),
    ("--compression=gzip", "compression 'none' vs 'gzip'"),
])
def test_subset_overwrite_with_other_options_is_refused(tmp_path, idx_dir, flag, differs):
    out = tmp_path / "out"
    run_job([f"--source={idx_dir}", f"--output={out}"])
    before = files(out)
    with pytest.raises(PipelineInputError) as refused:
        run_job([f"--source={idx_dir}", f"--output={out}", "--splits=train",
                 "--overwrite", flag])
    assert str(refused.value) == (
        f"{out}: --splits=train would drop split(s) test of the existing dataset, "
        f"written with other options ({differs}); pass --splits=train,test to replace "
        "all of it, or the same options to keep them")
    assert files(out) == before
