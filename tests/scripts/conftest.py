"""Fixtures of the scripts' tests: a copy of the scripts run_local.sh needs."""

from __future__ import annotations

import pytest

from tests.scripts.run_local_helpers import make_checkout


@pytest.fixture
def checkout(tmp_path):
    return make_checkout(tmp_path)
