"""Fixtures of more than one test folder: real digits, a local GCS API server,
and the same server behind TensorFlow's own gs:// client (`tests.gcs_tls`).
A fixture only one folder's tests use is in that folder's conftest.py.

The helpers they use, which tests also import, are in `tests.helpers`.
"""

from __future__ import annotations

import os
import signal

from mnist_common import console

console.set_tensorflow_log_level()
console.use_tf_keras()  # every test process's tf.keras is the trainer's

# The commands keep a SIGHUP or SIGINT that their parent ignores (as under
# nohup, or for a job a non-interactive shell puts in the background: the
# user asked for those signals to be ignored; `test_trainer_signals.py`
# checks it). A suite started that way would hand the ignore to every
# process it starts, and the tests of what a hangup or a Ctrl-C does would
# see none; the suite's processes start with the default actions instead.
signal.signal(signal.SIGHUP, signal.SIG_DFL)
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

import pytest  # noqa: E402

from tests.gcs_tls import GcsTlsServer  # noqa: E402
from tests.helpers import GcsEmulator, free_port, real_digits  # noqa: E402


@pytest.fixture(scope="session")
def digits():
    """{split: (images, labels)}: 360 train and 90 test real digits."""
    train = real_digits(360)
    test = real_digits(90, offset=3)
    return {"train": train, "test": test}


@pytest.fixture(scope="session")
def gcs_emulator():
    emulator = GcsEmulator(free_port())
    emulator.start()
    previous = os.environ.get("STORAGE_EMULATOR_HOST")
    os.environ["STORAGE_EMULATOR_HOST"] = emulator.host
    yield emulator
    emulator.stop()
    if previous is None:
        os.environ.pop("STORAGE_EMULATOR_HOST", None)
    else:
        os.environ["STORAGE_EMULATOR_HOST"] = previous


@pytest.fixture(scope="session")
def gcs_tls_server(tmp_path_factory):
    server = GcsTlsServer(tmp_path_factory.mktemp("gcs-tls"))
    server.start()
    yield server
    server.stop()


@pytest.fixture
def gcs_tls(gcs_tls_server):
    """`GcsTlsServer`: pass ``gcs_tls.env()`` (or use ``gcs_tls.run``) to the
    processes under test; the test process's own environment is untouched.

    A test fails if the server logged a handler exception or the proxy was
    asked for a host other than Google's storage endpoints while it ran.
    """
    refused = len(gcs_tls_server.proxy.refused)
    gcs_tls_server.mark_log()
    yield gcs_tls_server
    assert gcs_tls_server.server_errors(settle=10) == []
    assert gcs_tls_server.proxy.refused[refused:] == []


def pytest_collection_modifyitems(session, config, items):
    """Tests marked slow first (a stable sort): with several pytest-xdist
    workers the longest files then start at once instead of running alone at
    the end of the suite."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)
