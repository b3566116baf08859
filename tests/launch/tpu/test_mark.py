"""The mark a launch puts on what it creates (label ``mnist-run=RUN_ID``) and
checks before it reaches it: `tpu_cloud.Cloud` runs no ssh, scp or delete
unless its last describe found the VM carrying the launch's run id, and the
steps that reach a VM take that id (``--run_id``) and refuse another's VM."""

from __future__ import annotations

import json
import re

import pytest

from launch.tpu import cloud as tpu_cloud
from launch.tpu import commands as tc
from tests.launch.fake_cloud import FakeCloud
from tests.launch.helpers import (PYPROJECT, TPU_ARGS, flag_values, run_program,
                                  tpu_plan, fake_gcloud_env)

BASE = [a for a in TPU_ARGS if not a.startswith("--run_id=")]


class Answers:
    """A gcloud that records each call; describe answers ``self.vm`` (or,
    of a queued resource, ``self.queued``) as JSON, NOT_FOUND when None."""

    def __init__(self):
        self.calls, self.vm, self.queued = [], None, None

    def __call__(self, cmd):
        self.calls.append(cmd[4])
        if cmd[4] != "describe":
            return 0, "", ""
        found = self.queued if cmd[3] == "queued-resources" else self.vm
        if found is None:
            return 1, "", "ERROR: NOT_FOUND"
        return 0, json.dumps(found), ""


def run_cloud(*flags: str) -> tuple[tpu_cloud.Cloud, Answers]:
    cfg, _ = tpu_plan("run", "--run_id=r1", *flags, base=BASE)
    answers = Answers()
    return tpu_cloud.Cloud(cfg, PYPROJECT, dict(tc.phases("run", cfg, PYPROJECT)),
                           run=answers), answers


def reach(cloud: tpu_cloud.Cloud, tmp_path) -> list[int]:
    """Every call that reaches or changes the VM; their exit statuses."""
    return [cloud.install()[0], cloud.start_trainer(["h"])[0], cloud.status()[0],
            cloud.fetch_log(tmp_path / "log")[0], cloud.delete()[0]]


def test_the_cloud_reaches_only_a_vm_whose_describe_showed_its_mark(tmp_path):
    cloud, answers = run_cloud()
    assert reach(cloud, tmp_path) == [1] * 5 and answers.calls == []  # nothing described
    answers.vm = {"state": "READY", "labels": {tc.MARK_KEY: "r1"}}
    assert cloud.vm_state() == "READY" and cloud.checked
    assert cloud.delete()[0] == 0 and answers.calls == ["describe", "delete"]
    assert cloud.delete()[0] == 1 and answers.calls[-1] == "delete"  # not a second time
    answers.calls.clear()
    cloud.vm_state()
    assert cloud.create()[0] == 0 and reach(cloud, tmp_path) == [1] * 5
    assert answers.calls == ["describe", "create"]


@pytest.mark.parametrize("vm", [
    {"state": "READY"}, {"state": "READY", "labels": {tc.MARK_KEY: "r2"}},
    {"state": "READY", "labels": {"other": "r1"}}])
def test_the_cloud_refuses_a_vm_with_another_mark_or_none(tmp_path, vm):
    cloud, answers = run_cloud()
    answers.vm = {"state": "READY", "labels": {tc.MARK_KEY: "r1"}}
    cloud.vm_state()
    answers.vm = vm
    with pytest.raises(tpu_cloud.NotThisRun, match=r"^mnist-tpu in us-central2-b: a VM "):
        cloud.vm_state()
    assert reach(cloud, tmp_path) == [1] * 5 and answers.calls == ["describe", "describe"]


def test_a_vm_not_found_or_not_described_is_not_reached(tmp_path):
    cloud, answers = run_cloud()
    assert cloud.vm_state() == "GONE" and reach(cloud, tmp_path) == [1] * 5
    answers.vm = {"labels": {tc.MARK_KEY: "r1"}}  # no state: not read
    assert cloud.vm_state() == "UNKNOWN" and reach(cloud, tmp_path) == [1] * 5
    assert answers.calls == ["describe", "describe"]


def test_a_queued_resource_and_its_vm_both_carry_the_mark():
    cloud, answers = run_cloud("--queued")
    answers.queued = {"state": {"state": "ACTIVE"}, "tpu": {"nodeSpec": [
        {"node": {"labels": {tc.MARK_KEY: "r1"}}}]}}
    answers.vm = {"state": "READY", "labels": {tc.MARK_KEY: "r1"}}
    assert cloud.vm_state() == "READY" and cloud.checked
    answers.vm["labels"] = {}
    with pytest.raises(tpu_cloud.NotThisRun, match="a VM this launch"):
        cloud.vm_state()
    assert not cloud.checked
    answers.queued["tpu"]["nodeSpec"][0]["node"]["labels"] = {}
    with pytest.raises(tpu_cloud.NotThisRun, match="a queued resource this launch"):
        cloud.vm_state()
    assert answers.calls == ["describe"] * 5


def test_create_labels_the_vm_and_the_queued_resource_with_the_run_id():
    for flags in ([], ["--queued"]):
        _, [create] = tpu_plan("create", "--run_id=r-1_x", *flags, base=BASE)
        assert flag_values(create)["labels"] == f"{tc.MARK_KEY}=r-1_x"
    _, [create] = tpu_plan("create", base=BASE)
    assert re.fullmatch(f"{tc.MARK_KEY}=[0-9a-f]{{16}}", flag_values(create)["labels"])


# ------------------------------------------------------ the steps, end to end

@pytest.fixture
def steps(tmp_path):
    """Runs a step of ``python -m launch.tpu`` against the fake cloud."""
    cloud = FakeCloud(tmp_path / "cloud")
    env = fake_gcloud_env(tmp_path, cloud.root)

    def step(*argv):
        return run_program("launch.tpu", *argv, "--name=team-vm", "--zone=z-1",
                          "--accelerator_type=v4-8", env=env)
    return step, cloud


@pytest.mark.parametrize("step", ["setup", "train", "wait", "status", "logs", "delete"])
def test_a_step_refuses_a_vm_it_did_not_make(steps, step):
    run_step, cloud = steps
    with cloud.locked():
        cloud.new_vm("team-vm", {tc.MARK_KEY: "theirs"})
        cloud.set_state("team-vm", "READY")
    proc = run_step(step, "--run_id=mine", "--data=gs://b/d", "--model_dir=gs://b/m")
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.splitlines()[-1] == (
        'error: team-vm in z-1: a VM this launch did not create (label mnist-run: "theirs", '
        "not mine); left as it is: pass another --name, or the --run_id it was made with")
    assert [c["argv"][3] for c in cloud.calls()] == ["describe"]
    assert cloud.vms() == {"team-vm": "READY"}


@pytest.mark.parametrize("step", ["setup", "train", "wait", "status", "logs", "delete"])
def test_a_step_that_reaches_a_vm_needs_its_run_id(steps, step):
    run_step, cloud = steps
    proc = run_step(step, "--data=gs://b/d", "--model_dir=gs://b/m")
    assert (proc.returncode, proc.stderr) == (2, (
        f"error: {step} needs --run_id: the id create printed, the VM's label mnist-run\n"))
    assert cloud.calls() == []


def test_create_prints_the_run_id_that_delete_then_takes(steps):
    run_step, cloud = steps
    made = run_step("create")
    assert made.returncode == 0, made.stderr
    [run_id] = re.findall(r"pass --run_id=(\S+) to the steps", made.stderr)
    assert cloud.labels("team-vm") == {tc.MARK_KEY: run_id}
    assert run_step("delete", "--run_id=not-it").returncode == 2
    assert cloud.vms() == {"team-vm": "READY"}
    gone = run_step("delete", f"--run_id={run_id}")
    assert gone.returncode == 0, gone.stderr
    assert cloud.vms() == {}
    assert run_step("delete", "--run_id=Bad!").stderr == (
        "error: --run_id 'Bad!' is not a label value: lowercase letters, digits, - and _, "
        "at most 63\n")
