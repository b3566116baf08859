"""Starting a ``TF_CONFIG`` cluster with a deadline: `start`.

``tf.distribute.MultiWorkerMirroredStrategy()`` waits, inside TensorFlow's
C++, until every task that ``TF_CONFIG`` lists answers, with no deadline.
It waits holding Python's global lock, so no other Python thread runs and
no signal handler either, and it installs TensorFlow's own SIGTERM handler
(its preemption notice), which keeps the signal: a task whose peer never
starts waits forever and only SIGKILL ends it.

So the tasks meet first in Python (`wait_for_peers`): each listens on its
own ``TF_CONFIG`` address (connections complete in the kernel's backlog; none
is accepted) and tries every other task's address until all take a
connection, at most ``--cluster_timeout`` seconds. Meanwhile signals end the
run as anywhere outside training (`trainer.run.preemption`); at the deadline
the run ends with one line naming the tasks that did not answer. Then it
closes its listener and TensorFlow binds the same address. A peer that dies
between the meeting and TensorFlow's start still leaves the others in
TensorFlow's wait.
"""

from __future__ import annotations

import itertools
import json
import logging
import socket
import time

import tensorflow as tf

from trainer.errors import TrainerError

log = logging.getLogger(__name__)

PROBE_SECONDS = 1.0  # per connection attempt
RETRY_SECONDS = 0.5  # between rounds of attempts


def start(tf_config: str, timeout: float) -> tf.distribute.MultiWorkerMirroredStrategy:
    """The multi-worker strategy of ``tf_config`` (checked already), once every
    task answers; a `TrainerError` naming those that do not after ``timeout`` s."""
    wait_for_peers(tf_config, timeout)
    return tf.distribute.MultiWorkerMirroredStrategy()


def wait_for_peers(tf_config: str, timeout: float) -> None:
    """Listens on this task's address until every other task's takes a connection."""
    config = json.loads(tf_config)
    own = (config["task"]["type"], config["task"]["index"])
    peers = {f"{kind} {index} ({address})": address
             for kind, addresses in config["cluster"].items()
             for index, address in enumerate(addresses) if (kind, index) != own}
    listener = _listen(config["cluster"][own[0]][own[1]])
    deadline = time.monotonic() + timeout
    try:
        for round_ in itertools.count():
            peers = {name: address for name, address in peers.items()
                     if not _answers(address)}
            if not peers:
                return
            if round_ == 0:
                log.info("TF_CONFIG: waiting up to %gs (--cluster_timeout) for %s",
                         timeout, ", ".join(peers))
            if time.monotonic() >= deadline:
                raise TrainerError(f"TF_CONFIG: no answer within {timeout:g}s "
                                   f"(--cluster_timeout) from {', '.join(peers)}; start "
                                   "every task it lists")
            time.sleep(RETRY_SECONDS)
    finally:
        if listener is not None:
            listener.close()


def _split(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    return host.strip("[]"), int(port)


def _listen(address: str):
    """A socket listening on ``address``; None where it cannot bind (TensorFlow
    will say why, or a port in use answers for this task)."""
    try:
        return socket.create_server(_split(address), backlog=64)
    except (OSError, ValueError):
        return None


def _answers(address: str) -> bool:
    try:
        with socket.create_connection(_split(address), PROBE_SECONDS):
            return True
    except (OSError, ValueError):
        return False
