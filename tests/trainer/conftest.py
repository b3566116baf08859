"""Fixtures of the trainer tests only: contract datasets written once per
session, and one small trained run per module for the tests that resume
copies of it.

They import TensorFlow and the trainer only when a test asks for them.
"""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def trainer_dataset(tmp_path_factory):
    """``trainer_dataset(**sizes)`` → the folder of a `tests.trainer_data.write_dataset`
    dataset of those sizes, written once per session for each set of sizes.

    Shared between tests, so they read it and never change it (a test that
    edits its data writes its own).
    """
    made: dict[tuple, str] = {}

    def make(**sizes) -> str:
        key = tuple(sorted(sizes.items()))
        if key not in made:
            from tests import trainer_data  # imports TensorFlow: only when used
            out = str(tmp_path_factory.mktemp("trainer_data") / "data")
            trainer_data.write_dataset(out, **sizes)
            made[key] = out
        return made[key]
    return make


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """`trainer_runs.two_epoch_run` once per module: (data, model_dir)."""
    from tests.trainer import trainer_runs
    return trainer_runs.two_epoch_run(tmp_path_factory.mktemp("two-epochs"))


@pytest.fixture
def model_dir(trained, tmp_path):
    """A fresh copy of `trained`'s model_dir for one test to change."""
    from tests.trainer import trainer_runs
    return trainer_runs.copy_of(trained[1], tmp_path)
