"""The fake ``gcloud``: the calls ``mnist-launch-tpu`` makes, answered from a
`fake_cloud.FakeCloud` folder (``FAKE_CLOUD``), with gcloud's output formats
and exit statuses.

    compute tpus tpu-vm create|describe|delete|ssh|scp NAME ...
    compute tpus queued-resources create|describe|delete NAME ...
    storage cat gs://BUCKET/OBJECT   (from the local GCS server,
                                      STORAGE_EMULATOR_HOST)
    version --format=json            (``FAKE_GCLOUD_VERSION``, default
                                      `CURRENT_VERSION`)

``create`` keeps ``--labels=KEY=VALUE,...`` (refused, as GCE refuses them,
unless keys and values follow its label rules); ``describe
--format=json`` prints them as gcloud does: a VM's under ``labels``, a
queued resource's under ``tpu.nodeSpec[0].node.labels``.

``create`` blocks while the VM is CREATING (``FAKE_CREATE_SECONDS``), and
``delete`` while it is DELETING (``FAKE_DELETE_SECONDS``), as gcloud waits
for the operation; the operation itself runs on in a process of its own,
as it runs on in Cloud TPU when gcloud is killed. A queued resource waits
for capacity and becomes ACTIVE, with its VM READY, when it is next
described.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

from tests.launch.fake_cloud import STOCKOUT, FakeCloud

CURRENT_VERSION = "548.0.0"


def _flags(args: list[str]) -> tuple[list[str], dict[str, str]]:
    """Positional arguments and ``--name=value`` flags (``--quiet``: "")."""
    positional, flags = [], {}
    for arg in args:
        if arg.startswith("--"):
            key, _, value = arg[2:].partition("=")
            flags[key] = value
        else:
            positional.append(arg)
    return positional, flags


# GCE's label rules (ASCII): a key starts with a lowercase letter; keys and
# values hold lowercase letters, digits, - and _, at most 63 characters.
LABEL_KEY = re.compile(r"[a-z][a-z0-9_-]{0,62}")
LABEL_VALUE = re.compile(r"[a-z0-9_-]{0,63}")


def parse_labels(text: str) -> dict[str, str] | None:
    """``--labels``'s ``KEY=VALUE,...``; None when one breaks the rules."""
    labels = {}
    for pair in filter(None, text.split(",")):
        key, _, value = pair.partition("=")
        if not (LABEL_KEY.fullmatch(key) and LABEL_VALUE.fullmatch(value)):
            return None
        labels[key] = value
    return labels


def _error(verb: str, status: str, message: str, code: int = 1) -> int:
    print(f"ERROR: (gcloud.compute.tpus.{verb}) {status}: {message}", file=sys.stderr)
    return code


def _not_found(verb: str, name: str) -> int:
    return _error(verb, "NOT_FOUND", f"Resource 'projects/p/locations/z/nodes/{name}' "
                  "was not found")


def tpu_vm(cloud: FakeCloud, verb: str, args: list[str]) -> int:
    positional, flags = _flags(args)
    name = positional[0].split(":")[0] if verb != "scp" else None
    handlers = {"create": lambda: _create(name, flags),
                "describe": lambda: describe(cloud, name, flags.get("format")),
                "delete": lambda: _operation("delete", name),
                "ssh": lambda: ssh(cloud, name, flags),
                "scp": lambda: scp(cloud, positional)}
    return handlers[verb]()


def _create(name: str, flags: dict[str, str]) -> int:
    if parse_labels(flags.get("labels", "")) is None:
        return _error("tpu-vm.create", "INVALID_ARGUMENT", f"bad labels {flags['labels']!r}")
    return _operation("create", name, flags.get("zone", ""), flags.get("labels", ""))


def create(cloud: FakeCloud, name: str, zone: str, labels: str = "") -> int:
    with cloud.locked():
        if cloud.state(name) is not None:
            return _error("tpu-vm.create", "ALREADY_EXISTS", f"node {name} already exists")
        if cloud.take_fault("stockouts"):
            print(STOCKOUT.format(zone=zone), file=sys.stderr)
            return 1
        vm_id = cloud.new_vm(name, parse_labels(labels))
    time.sleep(float(os.environ.get("FAKE_CREATE_SECONDS", "0.2")))
    with cloud.locked():
        if cloud.vm_id(name) == vm_id and cloud.state(name) == "CREATING":
            cloud.set_state(name, "READY")
    return 0


def _operation(verb: str, name: str, zone: str = "", labels: str = "") -> int:
    """A create or delete, run in a session of its own (a signal to this
    gcloud does not reach it) and waited for, as gcloud waits."""
    return subprocess.run([sys.executable, __file__, "operation", verb, name, zone, labels],
                          start_new_session=True).returncode


def operation(cloud: FakeCloud, verb: str, name: str, zone: str, labels: str = "") -> int:
    return create(cloud, name, zone, labels) if verb == "create" else delete(cloud, name)


def describe(cloud: FakeCloud, name: str, form: str | None) -> int:
    """``--format=json``: the VM's name, state and labels; else its state."""
    state = cloud.state(name)
    if state is None:
        return _not_found("tpu-vm.describe", name)
    if form == "json":
        print(json.dumps({"name": name, "state": state, "labels": cloud.labels(name)},
                         indent=2))
    else:
        print(state)
    return 0


def delete(cloud: FakeCloud, name: str) -> int:
    if cloud.state(name) is not None and cloud.take_fault("kept_deletes"):
        return 0  # answered done, the VM kept
    with cloud.locked():
        if cloud.state(name) is None:
            return _not_found("tpu-vm.delete", name)
        cloud.set_state(name, "DELETING")
        vm_id = cloud.vm_id(name)
    time.sleep(float(os.environ.get("FAKE_DELETE_SECONDS", "0.1")))
    with cloud.locked():
        if cloud.vm_id(name) == vm_id:
            cloud.remove_vm(name)
    return 0


def ssh(cloud: FakeCloud, name: str, flags: dict[str, str]) -> int:
    """The command in bash on the VM, in a session of its own (as sshd
    starts it); 255 when the VM cannot be reached, as ssh exits."""
    state = cloud.state(name)
    if state is None:
        return _not_found("tpu-vm.ssh", name)
    if state != "READY" or cloud.take_fault("ssh_failures"):
        print(f"ssh: connect to host {name} port 22: Connection timed out", file=sys.stderr)
        return 255
    home = cloud.vm_dir(name) / "home"
    proc = subprocess.run(["bash", "-c", flags["command"]], cwd=home,
                          env=cloud.host_env(name), start_new_session=True)
    if proc.returncode < 0:  # killed with the VM
        print(f"Connection to {name} closed by remote host.", file=sys.stderr)
        return 255
    return proc.returncode


def scp(cloud: FakeCloud, positional: list[str]) -> int:
    """``scp LOCAL NAME:`` copies into the VM's home; ``scp NAME:PATH LOCAL``
    copies out of it (``~`` is the home)."""
    source, dest = positional
    remote, local = (dest, source) if ":" in dest else (source, dest)
    name, _, path = remote.partition(":")
    if cloud.state(name) != "READY":
        print(f"ssh: connect to host {name} port 22: Connection timed out", file=sys.stderr)
        return 255 if cloud.state(name) else _not_found("tpu-vm.scp", name)
    home = cloud.vm_dir(name) / "home"
    inside = home / path.replace("~/", "", 1) if path else home
    try:
        if remote is dest:
            shutil.copy(local, inside)
        else:
            shutil.copy(inside, local)
    except OSError as exc:
        print(f"scp: {exc}", file=sys.stderr)
        return 1
    return 0


def queued(cloud: FakeCloud, verb: str, args: list[str]) -> int:
    positional, flags = _flags(args)
    name = positional[0]
    folder = cloud.root / "queued" / name
    with cloud.locked():
        if verb == "create":
            labels = parse_labels(flags.get("labels", ""))
            if labels is None:
                return _error("queued-resources.create", "INVALID_ARGUMENT", "bad labels")
            if folder.exists():
                return _error("queued-resources.create", "ALREADY_EXISTS", name)
            folder.mkdir()
            (folder / "node").write_text(flags["node-id"])
            (folder / "labels.json").write_text(json.dumps(labels))
            (folder / "state").write_text("WAITING_FOR_RESOURCES\n")
            return 0
        if not folder.exists():
            return _error(f"queued-resources.{verb}", "NOT_FOUND", f"queued resource {name}")
        node = (folder / "node").read_text()
        if verb == "delete":
            if cloud.state(node) is not None:
                cloud.remove_vm(node)
            shutil.rmtree(folder)
            return 0
        state = (folder / "state").read_text().strip()
        labels_file = folder / "labels.json"  # none: a resource made without labels
        labels = json.loads(labels_file.read_text()) if labels_file.exists() else {}
        if state == "WAITING_FOR_RESOURCES" and not cloud.take_fault("stockouts"):
            cloud.new_vm(node, labels)
            cloud.set_state(node, "READY")
            state = "ACTIVE"
            (folder / "state").write_text(state + "\n")
        print(json.dumps({"name": name, "state": {"state": state}, "tpu": {"nodeSpec": [
            {"nodeId": node, "node": {"labels": labels}}]}}, indent=2)
              if flags.get("format") == "json" else state)
        return 0


def storage_cat(url: str) -> int:
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import storage
    bucket, _, name = url.removeprefix("gs://").partition("/")
    if "STORAGE_EMULATOR_HOST" not in os.environ:
        print(f"ERROR: (gcloud.storage.cat) {url}: no storage server here", file=sys.stderr)
        return 1
    client = storage.Client(project="test", credentials=AnonymousCredentials(),
                            client_options={"api_endpoint": os.environ["STORAGE_EMULATOR_HOST"]})
    try:
        sys.stdout.write(client.bucket(bucket).blob(name).download_as_text(timeout=10))
    except Exception as exc:  # noqa: BLE001 - gcloud prints one line for any failure
        print(f"ERROR: (gcloud.storage.cat) {url}: {exc}", file=sys.stderr)
        return 1
    return 0


def main(argv: list[str]) -> int:
    cloud = FakeCloud(Path(os.environ["FAKE_CLOUD"]))
    if argv[0] == "operation":  # not a gcloud call: the cloud's side of one
        return operation(cloud, *argv[1:])
    if argv[:2] == ["storage", "cat"]:
        rc = storage_cat(argv[2])
    elif argv == ["version", "--format=json"]:
        version = os.environ.get("FAKE_GCLOUD_VERSION", CURRENT_VERSION)
        print(json.dumps({"Google Cloud SDK": version, "core": "2025.11.14"}, indent=2))
        rc = 0
    elif argv[:3] == ["compute", "tpus", "tpu-vm"]:
        rc = tpu_vm(cloud, argv[3], argv[4:])
    elif argv[:3] == ["compute", "tpus", "queued-resources"]:
        rc = queued(cloud, argv[3], argv[4:])
    else:
        print(f"ERROR: (gcloud) the fake gcloud does not answer {argv[:4]}", file=sys.stderr)
        rc = 2
    cloud.record_call(argv, rc)
    return rc


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
