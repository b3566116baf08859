"""Starting a ``TF_CONFIG`` cluster with a deadline: `start`.

``TF_CONFIG`` is checked first (`check_tf_config`): TensorFlow reads a
malformed one with a bare ``ValueError``, or as a cluster of one.

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

from mnist_common.flags import number
from trainer.errors import TrainerError, TrainerInputError

log = logging.getLogger(__name__)

PORTS = number(int, min=1, max=65535)  # a TF_CONFIG address's port
PROBE_SECONDS = 1.0  # per connection attempt
RETRY_SECONDS = 0.5  # between rounds of attempts


def start(tf_config: str, timeout: float) -> tf.distribute.MultiWorkerMirroredStrategy:
    """The multi-worker strategy of ``tf_config`` (the ``TF_CONFIG`` value, ""
    when unset), once it is checked and every task answers; a `TrainerError`
    naming those that do not after ``timeout`` s."""
    if not tf_config:
        raise TrainerInputError("--strategy=multi_worker needs TF_CONFIG "
                                "(cluster spec and this task) in the environment")
    check_tf_config(tf_config)
    wait_for_peers(tf_config, timeout)
    return tf.distribute.MultiWorkerMirroredStrategy()


def check_tf_config(raw: str) -> None:
    """``TF_CONFIG`` names a cluster and this task in it, before TensorFlow
    reads it (it raises a bare ValueError for a missing task, an index past
    its type's list or a type not in the cluster, and runs a JSON list as
    one worker, and a port out of 1..65535 overflows the socket call). Each
    refusal is bad input (exit 2), naming TF_CONFIG."""
    try:
        config = json.loads(raw)
    except json.JSONDecodeError as e:
        raise TrainerInputError(f"TF_CONFIG is not valid JSON ({e})") from None
    cluster = config.get("cluster") if isinstance(config, dict) else None
    if not isinstance(cluster, dict) or not cluster or not all(
            isinstance(hosts, list) and hosts and all(isinstance(h, str) for h in hosts)
            for hosts in cluster.values()):
        raise TrainerInputError('TF_CONFIG: needs {"cluster": {TYPE: ["host:port", ...]}, '
                                '"task": {"type": TYPE, "index": N}}')
    task = config.get("task")
    if not isinstance(task, dict) or "type" not in task or "index" not in task:
        raise TrainerInputError('TF_CONFIG: no "task" with a "type" and an "index" '
                                "(which member of the cluster this process is)")
    kind, index = task["type"], task["index"]
    if kind not in cluster:
        raise TrainerInputError(f"TF_CONFIG: task type {kind!r} is not in the cluster "
                                f"({', '.join(sorted(cluster))})")
    for address in (a for hosts in cluster.values() for a in hosts):
        _check_port(address)
    if not isinstance(index, int) or isinstance(index, bool) or not (
            0 <= index < len(cluster[kind])):
        raise TrainerInputError(f"TF_CONFIG: task index {index!r} is not one of the "
                                f"{len(cluster[kind])} {kind!r} address(es) (0..."
                                f"{len(cluster[kind]) - 1})")


def _check_port(address: str) -> None:
    """A cluster address ends ``:PORT``, PORT a `PORTS` number."""
    try:
        PORTS(address.rpartition(":")[2])
    except ValueError:
        raise TrainerInputError(f"TF_CONFIG: address {address!r}: the port must be "
                                f"an integer {PORTS.range_text}") from None


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
