"""Fixtures of the scripts' tests: a copy of the scripts run_local.sh needs;
the spot runs' dataset in the local GCS server's bucket (written once per
session) and one fake cloud per test (`tests.scripts.spot_helpers.World`)."""

from __future__ import annotations

import subprocess

import pytest

from tests.scripts.run_local_helpers import make_checkout


@pytest.fixture
def checkout(tmp_path):
    return make_checkout(tmp_path)


@pytest.fixture
def blocked_runs(tmp_path):
    """run_local.sh runs (`start_blocked_run`), let go and ended when the test
    ends, whatever happened."""
    runs: list[subprocess.Popen] = []
    yield runs
    (tmp_path / "go").touch()
    for run in runs:
        try:
            run.wait(timeout=30)
        except subprocess.TimeoutExpired:
            run.kill()
            run.wait()


@pytest.fixture(scope="session")
def spot_data(gcs_tls_server, tmp_path_factory):
    from tests.scripts.spot_helpers import write_dataset_to_bucket
    return write_dataset_to_bucket(gcs_tls_server, "spot-data",
                                   tmp_path_factory.mktemp("spot-data"))


@pytest.fixture
def world(tmp_path, gcs_tls_server, spot_data):
    """A fake cloud on the session's GCS server. Not the ``gcs_tls``
    fixture: a trainer killed mid-upload leaves the server a broken pipe,
    which is all `World.server_faults` lets through."""
    from tests.scripts.spot_helpers import World
    world = World(tmp_path, gcs_tls_server, spot_data)
    yield world
    world.cleanup()
    try:
        assert world.server_faults() == []
    finally:
        gcs_tls_server.mark_log()  # its clients' broken pipes are not the next test's
