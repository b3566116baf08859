"""``scripts/run_local.sh`` checks the trainer's flags before it changes anything,
and replaces only a DATA folder it made itself.

A DATA folder with a file in it, or the checkout, is refused with one line
before anything changes; one the script made (its marker file) is handed to
the pipeline with ``--overwrite``; a new one is made and marked. With the real
interpreter, flags the trainer refuses (``--epochs=0``) end the script with
the trainer's own one-line reason before DATA or MODEL_DIR is touched.
"""

from __future__ import annotations

import pytest

from tests.scripts.run_local_helpers import MARKER, calls, run_local, tree


def pipeline_calls(tmp_path) -> list[str]:
    return [c for c in calls(tmp_path) if c.startswith("-m pipeline")]


@pytest.mark.parametrize("which", ["folder with a file", "the checkout"])
def test_data_it_did_not_make_is_refused_and_kept(checkout, tmp_path, which):
    data = checkout if which == "the checkout" else tmp_path / "results"
    data.mkdir(exist_ok=True)
    (data / "notes.txt").write_text("keep me")
    before = tree(tmp_path)
    result = run_local(checkout, None, DATA=str(data))
    assert result.returncode == 2, result.stderr
    assert result.stderr.splitlines() == [
        f"error: DATA={data}: not a folder this script made (no {MARKER} in it), so it is "
        "not replaced; remove it yourself, or pick another DATA"]
    assert {k: v for k, v in tree(tmp_path).items() if k != "calls"} == before
    assert not pipeline_calls(tmp_path)


def test_data_it_made_is_marked_then_overwritten(checkout, tmp_path):
    data = tmp_path / "data"
    first = run_local(checkout, None)
    assert first.returncode == 0, first.stderr
    assert sorted(p.name for p in data.iterdir()) == [MARKER]
    second = run_local(checkout, None)
    assert second.returncode == 0, second.stderr
    made = pipeline_calls(tmp_path)
    assert len(made) == 2 and "--overwrite" not in made[0] and "--overwrite" in made[1]


def test_bad_trainer_flags_change_nothing(checkout, tmp_path):
    data, model_dir = tmp_path / "data", tmp_path / "model"
    for folder in (data, model_dir):  # both made by an earlier run of the script
        folder.mkdir()
        (folder / MARKER).touch()
    (data / "manifest.json").write_text("an earlier dataset")
    (model_dir / "ckpt-1.index").write_text("an earlier run")
    before = tree(tmp_path)
    result = run_local(checkout, model_dir, "--epochs=0", real=True)
    assert result.returncode == 2, result.stderr[-3000:]
    assert result.stderr.splitlines() == [
        "error: trainer flags: --epochs must be >= 1, not 0"]
    assert tree(tmp_path) == before


def test_trainer_flags_given_as_arguments_replace_the_scripts_own(checkout, tmp_path):
    """The trainer refuses a flag given twice: ``--epochs`` and ``--preset``
    given to the script replace its own; ``--data``, ``--model_dir`` and
    ``--loop`` are its settings (DATA, MODEL_DIR, LOOP), refused as arguments."""
    assert run_local(checkout, None, "--epochs=3", "--preset=smoke").returncode == 0
    [train] = [c for c in calls(tmp_path) if c.startswith("-m trainer ")]
    flags = train.split()[2:]
    assert [f for f in flags if f.startswith(("--epochs", "--preset"))] == [
        "--epochs=3", "--preset=smoke"], train
    before = tree(tmp_path)
    for flag, setting in [("--loop=custom", "LOOP"), ("--data=x", "DATA"),
                          ("--model_dir", "MODEL_DIR")]:
        result = run_local(checkout, None, "--epochs=3", flag)
        assert result.returncode == 2, result.stderr
        assert result.stderr.splitlines() == [
            f"error: {flag.split('=')[0]}: set {setting}=... instead (this script's own "
            "setting)"]
    assert tree(tmp_path) == before


def test_real_trainer_flags_given_twice_change_nothing(checkout, tmp_path):
    result = run_local(checkout, None, "--seed=1", "--seed=2", real=True)
    assert result.returncode == 2, result.stderr[-3000:]
    assert result.stderr.splitlines() == [
        "error: trainer flags: --seed given twice (--seed=1, then --seed=2); give each flag "
        "once (see --help)"]
    assert not pipeline_calls(tmp_path)
