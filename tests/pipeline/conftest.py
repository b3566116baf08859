"""Fixtures of the pipeline tests only: the shared real digits as IDX files,
the job's input format."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers import write_idx_split


@pytest.fixture
def idx_dir(tmp_path, digits) -> Path:
    folder = tmp_path / "idx"
    for split, (images, labels) in digits.items():
        write_idx_split(folder, split, images, labels)
    return folder
