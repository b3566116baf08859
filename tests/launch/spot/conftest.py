"""Fixtures of the spot runs' tests: the dataset in the local GCS server's
bucket (written once per session) and one fake cloud per test
(`tests.launch.spot.helpers.World`)."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def spot_data(gcs_tls_server, tmp_path_factory):
    from tests.launch.spot.helpers import write_dataset_to_bucket
    return write_dataset_to_bucket(gcs_tls_server, "spot-data",
                                   tmp_path_factory.mktemp("spot-data"))


@pytest.fixture
def world(tmp_path, gcs_tls_server, spot_data):
    """A fake cloud on the session's GCS server. Not the ``gcs_tls``
    fixture: a trainer killed mid-upload leaves the server a broken pipe,
    which is all `World.server_faults` lets through."""
    from tests.launch.spot.helpers import World
    world = World(tmp_path, gcs_tls_server, spot_data)
    yield world
    world.cleanup()
    try:
        assert world.server_faults() == []
    finally:
        gcs_tls_server.mark_log()  # its clients' broken pipes are not the next test's
