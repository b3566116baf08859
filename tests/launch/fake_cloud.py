"""A Cloud TPU in a folder: the state behind the fake ``gcloud`` (`fake_gcloud`).

Each TPU VM is a folder ``vms/NAME`` holding its state (CREATING, READY,
PREEMPTED, ...), its id, its labels, its host name and a home folder. ``ssh`` runs the
command in bash there, in a session of its own, with ``HOME`` the VM's home
and, first on ``PATH``, the VM's ``python3`` (`fake_host_python3`) and
``hostname``. Every process a VM runs carries ``FAKE_TPU_VM=<id>`` in its
environment, so a preemption finds them all, detached ones included, and
signals them as Compute Engine does: SIGTERM, a grace period, SIGKILL; the
state then goes to PREEMPTED (a queued resource's to SUSPENDED) and the VM
stays, billed, until it is deleted. A deleted VM's folder moves to
``gone/<id>`` (its log stays readable).

``history.jsonl`` records every create, preemption and delete, so a test can
check that no two VMs of a name were ever alive at once and none is left;
``calls.jsonl`` records every gcloud call with its exit status. Faults a
test arms in ``faults.json``: creates refused as a stockout, ssh calls that
fail as an unreachable host would (255), deletes that answer done and keep
the VM (``kept_deletes``).
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import signal
import sys
import time
from contextlib import contextmanager
from pathlib import Path

HERE = Path(__file__).resolve().parent
HOST_SITE = HERE / "fake_host_site"  # sitecustomize: the VM's host name for Python
VM_MARK = "FAKE_TPU_VM"
STOCKOUT = ("ERROR: (gcloud.compute.tpus.tpu-vm.create) RESOURCE_EXHAUSTED: "
            "There is no more capacity in the zone \"{zone}\"; you can try in "
            "another zone where Cloud TPU Nodes are offered")


def _read_if_there(path: Path) -> str | None:
    """A VM file's text, or None once the VM is gone: tests read the cloud
    without its lock while the launcher deletes VMs."""
    try:
        return path.read_text().strip()
    except FileNotFoundError:
        return None


class FakeCloud:
    """The folder's state, for the fake gcloud and for tests."""

    def __init__(self, root: Path):
        self.root = Path(root)
        self._depth = 0
        for sub in ("vms", "gone", "queued"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)

    @contextmanager
    def locked(self):
        if self._depth:
            self._depth += 1
            try:
                yield
            finally:
                self._depth -= 1
            return
        with open(self.root / "lock", "a") as fh:
            fcntl.flock(fh, fcntl.LOCK_EX)
            self._depth = 1
            try:
                yield
            finally:
                self._depth = 0
                fcntl.flock(fh, fcntl.LOCK_UN)

    # ------------------------------------------------------------ records

    def _append(self, name: str, record: dict) -> None:
        with open(self.root / name, "a") as fh:
            fh.write(json.dumps({"t": round(time.time(), 3), **record}) + "\n")

    def record(self, event: str, vm: str, vm_id: str) -> None:
        self._append("history.jsonl", {"event": event, "vm": vm, "id": vm_id})

    def record_call(self, argv: list[str], rc: int) -> None:
        self._append("calls.jsonl", {"argv": argv, "rc": rc})
    def _read(self, name: str) -> list[dict]:
        path = self.root / name
        if not path.exists():
            return []
        return [json.loads(line) for line in path.read_text().splitlines()]

    def history(self) -> list[dict]:
        return self._read("history.jsonl")

    def calls(self) -> list[dict]:
        return self._read("calls.jsonl")

    def most_alive(self) -> int:
        """The most VMs that existed at once (a preempted VM exists until deleted)."""
        alive, most = set(), 0
        for record in self.history():
            if record["event"] == "create":
                alive.add(record["id"])
            elif record["event"] == "delete":
                alive.discard(record["id"])
            most = max(most, len(alive))
        return most

    # ------------------------------------------------------------ faults

    def faults(self) -> dict:
        path = self.root / "faults.json"
        return json.loads(path.read_text()) if path.exists() else {}

    def arm(self, **counts: int) -> None:
        with self.locked():
            (self.root / "faults.json").write_text(json.dumps({**self.faults(), **counts}))

    def take_fault(self, kind: str) -> bool:
        """Uses up one armed fault of ``kind``; False when none is left."""
        with self.locked():
            faults = self.faults()
            if faults.get(kind, 0) <= 0:
                return False
            faults[kind] -= 1
            (self.root / "faults.json").write_text(json.dumps(faults))
            return True

    # ------------------------------------------------------------ VMs

    def vm_dir(self, name: str) -> Path:
        return self.root / "vms" / name

    def state(self, name: str) -> str | None:
        return _read_if_there(self.vm_dir(name) / "state")

    def set_state(self, name: str, state: str) -> None:
        (self.vm_dir(name) / "state").write_text(state + "\n")

    def vm_id(self, name: str) -> str | None:
        return _read_if_there(self.vm_dir(name) / "id")

    def vms(self) -> dict[str, str]:
        """Name -> state of every VM that exists."""
        return {p.name: self.state(p.name) for p in (self.root / "vms").iterdir()}

    def labels(self, name: str) -> dict[str, str]:
        """The VM's labels (``--labels`` of its create)."""
        text = _read_if_there(self.vm_dir(name) / "labels.json")
        return json.loads(text) if text else {}

    def new_vm(self, name: str, labels: dict[str, str] | None = None) -> str:
        """A VM folder in state CREATING (caller holds the lock); its id."""
        # Unique across clouds: its processes are found (and killed) by it,
        # while other tests' fake clouds run VMs on the same machine.
        cloud = hashlib.sha256(str(self.root.resolve()).encode()).hexdigest()[:8]
        vm_id = f"vm-{len([r for r in self.history() if r['event'] == 'create']) + 1}-{cloud}"
        folder = self.vm_dir(name)
        (folder / "home").mkdir(parents=True)
        (folder / "bin").mkdir()
        (folder / "id").write_text(vm_id)
        (folder / "host").write_text(f"t1v-n-{vm_id}-w-0")
        (folder / "labels.json").write_text(json.dumps(labels or {}))
        _write_program(folder / "bin" / "python3",
                       f'exec "$FAKE_HOST_PYTHON" {HERE / "fake_host_python3.py"} "$@"')
        _write_program(folder / "bin" / "hostname", 'echo "$FAKE_TPU_HOSTNAME"')
        self.set_state(name, "CREATING")
        self.record("create", name, vm_id)
        return vm_id

    def host_env(self, name: str) -> dict[str, str]:
        """The environment of the VM's ssh sessions."""
        folder = self.vm_dir(name)
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        env.update({"HOME": str(folder / "home"), VM_MARK: self.vm_id(name),
                    "FAKE_TPU_HOSTNAME": (folder / "host").read_text(),
                    "FAKE_HOST_PYTHON": os.environ.get("FAKE_HOST_PYTHON", sys.executable),
                    "PATH": f"{folder / 'bin'}{os.pathsep}{os.environ['PATH']}"})
        return env

    def remove_vm(self, name: str) -> None:
        """Kills what the VM runs and moves its folder to ``gone/`` (lock held)."""
        vm_id = self.vm_id(name)
        kill_vm_processes(vm_id, signal.SIGKILL)
        shutil.move(str(self.vm_dir(name)), str(self.root / "gone" / vm_id))
        self.record("delete", name, vm_id)

    def preempt(self, name: str, grace: float) -> str:
        """SIGTERM to the VM's processes, ``grace`` seconds, SIGKILL, then
        PREEMPTED (its queued resource SUSPENDED); the id preempted."""
        vm_id = self.vm_id(name)
        kill_vm_processes(vm_id, signal.SIGTERM)
        deadline = time.monotonic() + grace
        while vm_processes(vm_id) and time.monotonic() < deadline:
            time.sleep(0.05)
        kill_vm_processes(vm_id, signal.SIGKILL)
        with self.locked():
            if self.vm_id(name) == vm_id:
                self.set_state(name, "PREEMPTED")
                queued = self.root / "queued" / name
                if queued.exists():
                    (queued / "state").write_text("SUSPENDED\n")
                self.record("preempt", name, vm_id)
        return vm_id


def _write_program(path: Path, body: str) -> None:
    path.write_text("#!/bin/sh\n" + body + "\n")
    path.chmod(0o755)


def vm_processes(vm_id: str | None) -> list[int]:
    """Pids of the live processes whose environment marks them as ``vm_id``'s."""
    if vm_id is None:
        return []
    mark = f"{VM_MARK}={vm_id}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if mark in (entry / "environ").read_bytes().split(b"\0"):
                found.append(int(entry.name))
        except OSError:  # gone meanwhile, or not ours
            continue
    return found


def kill_vm_processes(vm_id: str | None, signum: int) -> None:
    for pid in vm_processes(vm_id):
        try:
            os.kill(pid, signum)
        except ProcessLookupError:
            pass
