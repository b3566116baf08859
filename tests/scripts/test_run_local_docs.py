"""What README.md and docs/trainer.md say about the demo (`scripts/run_local.sh`)
holds: the refusal of more epochs on resume is quoted as the trainer words
it, and a stop in training is said to wait for the running call, which in the
demo is a whole epoch (its steps per epoch fit in one call)."""

from __future__ import annotations

import pytest

from tests.helpers import REPO
from trainer.config import from_preset
from trainer.errors import TrainerError
from trainer.run import resume

DEMO_TRAIN_EXAMPLES = 4000  # the offline sample's train split
MODEL_DIR = "runs/local-keras"  # run_local.sh's default


def section(path: str, heading: str) -> str:
    """The text under ``heading`` up to the next heading of its level or above,
    its whitespace squashed (the docs wrap lines anywhere)."""
    lines = (REPO / path).read_text().splitlines()
    start = lines.index(heading)
    level = heading.split()[0]
    end = next((i for i in range(start + 1, len(lines))
                if lines[i].startswith("#") and len(lines[i].split()[0]) <= len(level)),
               len(lines))
    return " ".join(" ".join(lines[start:end]).split())


def demo(epochs: int):
    return from_preset("cpu", data="out/mnist", model_dir=MODEL_DIR, epochs=epochs)


def test_resuming_quotes_the_refusal_of_more_epochs_for_the_demo():
    steps_per_epoch = DEMO_TRAIN_EXAMPLES // demo(3).global_batch_size
    with pytest.raises(TrainerError) as refused:
        resume.check_settings({"settings": resume.saved_settings(demo(3), steps_per_epoch)},
                              resume.saved_settings(demo(5), steps_per_epoch),
                              3 * steps_per_epoch, f"{MODEL_DIR}/checkpoints", MODEL_DIR)
    text = section("docs/trainer.md", "## Resuming")
    assert f"`error: {refused.value}`" in text
    assert "`RESUME=1 EPOCHS=5 bash scripts/run_local.sh` after the demo's 3 epochs" in text


def test_readme_says_a_stop_waits_for_the_epoch_and_names_the_resume_command():
    config = demo(20)
    steps_per_epoch = DEMO_TRAIN_EXAMPLES // config.global_batch_size
    assert config.steps_per_execution >= steps_per_epoch  # one call per epoch
    text = section("README.md", "## The demo's settings")
    assert (f"in the demo a whole epoch and its evaluation ({steps_per_epoch} steps, one "
            "call: `steps_per_execution`)") in text
    assert "prints the command that resumes, `RESUME=1 bash scripts/run_local.sh`" in text
    assert "stops the running step" not in text


def test_the_demos_time_is_stated_with_its_conditions():
    """README gives the demo's time on a quiet and on a busy machine, from the
    dated measurements of docs/benchmarks.md, which name the machine's load."""
    readme = section("README.md", "## The demo's settings")
    assert "[measured](docs/benchmarks.md#the-demo)" in readme
    bench = section("docs/benchmarks.md", "## The demo")
    assert "2 cores" in bench and "load" in bench and "2026-12-07" in bench
    assert "install" in bench
