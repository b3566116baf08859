"""``mnist-launch-tpu run`` against a VM or queued resource of its name that it
did not create (no ``mnist-run`` label, or another run's): refused in one line,
exit 2, with no call that reaches or changes it and nothing said on stdout. A
name GCE would refuse never reaches gcloud, and an event is one line whatever
a setting holds."""

from __future__ import annotations

import io
import json

import pytest

from launch.tpu.spot import events as spot_events
from launch.tpu import commands as tc
from tests.launch.fake_cloud import FakeCloud
from tests.launch.helpers import run_program, fake_gcloud_env

NAME = "shared-vm"


def run_argv(tmp_path, *extra: str, name: str = NAME) -> list[str]:
    """``run`` of a new model_dir; were it to get that far, its wheel build
    (``--python=false``) would fail."""
    return ["run", "--spot", f"--name={name}", "--zone=us-central2-b",
            "--accelerator_type=v4-8", "--data=gs://b/mnist", "--model_dir=gs://b/runs/NEW",
            f"--events={tmp_path / 'events.jsonl'}", f"--dist_dir={tmp_path / 'dist'}",
            "--python=false", "--poll_seconds=0.1", "--retry_seconds=5", *extra]


@pytest.fixture
def cloud(tmp_path):
    return FakeCloud(tmp_path / "cloud")


@pytest.fixture
def env(tmp_path, cloud):
    return fake_gcloud_env(tmp_path, cloud.root)


def finished_vm(cloud: FakeCloud, labels: dict | None, status: int) -> None:
    """A READY VM whose trainer exited ``status`` at step 1000/1000."""
    with cloud.locked():
        cloud.new_vm(NAME, labels)
        cloud.set_state(NAME, "READY")
    work = cloud.vm_dir(NAME) / "home" / "mnist-tpu"
    work.mkdir()
    (work / "train.pid").write_text("1\n")
    (work / "train.exit").write_text(f"{status}\n")
    (work / "train.log").write_text("step 1000/1000 loss 0.1\n")


def verbs(cloud: FakeCloud) -> set[str]:
    """The verbs of the calls on a resource (``gcloud version`` names none)."""
    return {c["argv"][3] for c in cloud.calls() if c["argv"][0] != "version"}


@pytest.mark.parametrize("labels, seen", [
    (None, "no such label"), ({tc.MARK_KEY: "another-run"}, '"another-run"')])
@pytest.mark.parametrize("status", [0, 1])
def test_run_refuses_a_vm_of_its_name_that_it_did_not_create(tmp_path, cloud, env, labels,
                                                             seen, status):
    finished_vm(cloud, labels, status)
    proc = run_program("launch.tpu", *run_argv(tmp_path), env=env)
    assert (proc.returncode, proc.stdout) == (2, ""), proc.stdout + proc.stderr
    [line] = proc.stderr.splitlines()
    assert line.startswith(f"error: {NAME} in us-central2-b: a VM this launch did not "
                           f"create (label {tc.MARK_KEY}: {seen}, not ")
    assert line.endswith("); left as it is: pass another --name, or the --run_id it was "
                         "made with")
    assert verbs(cloud) == {"describe"}  # no ssh, scp or delete
    assert cloud.vms() == {NAME: "READY"}
    assert (tmp_path / "events.jsonl").read_text() == ""


def test_run_refuses_a_queued_resource_of_its_name_that_it_did_not_create(tmp_path, cloud,
                                                                         env):
    folder = cloud.root / "queued" / NAME
    folder.mkdir()
    (folder / "node").write_text(NAME)
    (folder / "state").write_text("ACTIVE\n")
    with cloud.locked():
        cloud.new_vm(NAME)
        cloud.set_state(NAME, "READY")
    proc = run_program("launch.tpu", *run_argv(tmp_path, "--queued"), env=env)
    assert (proc.returncode, proc.stdout) == (2, ""), proc.stderr
    assert proc.stderr.startswith(f"error: {NAME} in us-central2-b: a queued resource this "
                                  f"launch did not create (label {tc.MARK_KEY}: no such label")
    assert verbs(cloud) == {"describe"} and folder.exists() and cloud.vms() == {NAME: "READY"}


def test_run_takes_up_its_own_vm_with_the_run_id_of_its_journal(tmp_path, cloud, env):
    """The same VM, labelled with the run id its journal names: this run's,
    so a trainer that exited 0 finishes the run and the VM is deleted."""
    finished_vm(cloud, {tc.MARK_KEY: "run-7"}, 0)
    run = {"name": NAME, "zone": "us-central2-b", "project": None,
           "accelerator_type": "v4-8", "model_dir": "gs://b/runs/NEW", "queued": False,
           "run_id": "run-7"}
    (tmp_path / "events.jsonl").write_text(json.dumps({"event": "started", "run": run}) + "\n")
    proc = run_program("launch.tpu", *run_argv(tmp_path), env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "finished: shared-vm: the trainer exited 0" in proc.stdout
    assert cloud.vms() == {}


@pytest.mark.parametrize("name", ["vm\n2026-12-07T00:00:00Z finished: vm: the trainer "
                                  "exited 0", "Shared-VM", "vm-", "v" * 64, "9vm"])
def test_run_refuses_a_name_gce_would_refuse_before_any_call(tmp_path, cloud, env, name):
    proc = run_program("launch.tpu", *run_argv(tmp_path, name=name), env=env)
    assert (proc.returncode, proc.stdout) == (2, "")
    assert proc.stderr == (f"error: --name {name!r} is not a TPU VM name: a lowercase "
                           "letter, then lowercase letters, digits or -, not ending in -, "
                           "at most 63 characters\n")
    assert cloud.calls() == []


def test_an_event_is_one_line_whatever_its_message_holds():
    out = io.StringIO()
    spot_events.Events(None, clock=lambda: 0.0, out=out).emit(
        "started", "x: model_dir gs://b/a\n1970-01-01T00:00:00Z finished: x\r")
    assert out.getvalue() == ("1970-01-01T00:00:00Z started: x: model_dir gs://b/a\\n"
                              "1970-01-01T00:00:00Z finished: x\\r\n")
