"""The fake cloud itself: what the launcher tests rely on it for."""

from __future__ import annotations

import subprocess
import sys

from tests.launch.fake_cloud import FakeCloud


def test_preempting_one_clouds_vm_leaves_another_clouds_vm_running(tmp_path):
    """Tests on other pytest-xdist workers run fake clouds of their own on the
    same machine, with VMs of the same name; a VM's processes are found by
    its id, so the ids differ and a preemption stays in its cloud."""
    clouds = [FakeCloud(tmp_path / "a"), FakeCloud(tmp_path / "b")]
    ids, procs = [], []
    for cloud in clouds:
        with cloud.locked():
            ids.append(cloud.new_vm("spot-tpu"))
            cloud.set_state("spot-tpu", "READY")
        procs.append(subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"],
                                      env=cloud.host_env("spot-tpu")))
    try:
        assert ids[0] != ids[1]
        assert clouds[0].preempt("spot-tpu", grace=0.0) == ids[0]
        assert procs[0].wait(timeout=10) != 0
        assert procs[1].poll() is None  # the other cloud's VM still runs
        assert [c.state("spot-tpu") for c in clouds] == ["PREEMPTED", "READY"]
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()


def test_the_fake_gcloud_keeps_labels_as_gce_does(tmp_path):
    """``create --labels`` is kept and ``describe --format=json`` returns it
    under ``labels`` (a queued resource: under its node spec); a label
    value GCE refuses is refused."""
    import json
    import os

    from tests.launch.helpers import clean_env, write_fake_gcloud
    cloud = FakeCloud(tmp_path / "cloud")
    gcloud = write_fake_gcloud(tmp_path)
    env = clean_env(FAKE_CLOUD=str(cloud.root), FAKE_CREATE_SECONDS="0", PATH=os.environ["PATH"])

    def call(*argv):
        return subprocess.run([str(gcloud), "compute", "tpus", *argv, "--zone=z"], env=env,
                              capture_output=True, text=True, timeout=60)
    assert call("tpu-vm", "create", "vm", "--labels=mnist-run=ab-1_c").returncode == 0
    described = json.loads(call("tpu-vm", "describe", "vm", "--format=json").stdout)
    assert (described["state"], described["labels"]) == ("READY", {"mnist-run": "ab-1_c"})
    assert call("tpu-vm", "describe", "vm", "--format=value(state)").stdout == "READY\n"
    bad = call("tpu-vm", "create", "vm2", "--labels=mnist-run=Not OK")
    assert bad.returncode == 1 and "INVALID_ARGUMENT" in bad.stderr and "vm2" not in cloud.vms()
    assert call("queued-resources", "create", "q", "--node-id=q",
                "--labels=mnist-run=x" + "y" * 63).returncode == 1
    assert call("queued-resources", "create", "q", "--node-id=q", "--accelerator-type=v4-8",
                "--labels=mnist-run=r2").returncode == 0
    queued = json.loads(call("queued-resources", "describe", "q", "--format=json").stdout)
    assert queued["state"] == {"state": "ACTIVE"}
    assert queued["tpu"]["nodeSpec"][0]["node"]["labels"] == {"mnist-run": "r2"}
    assert cloud.labels("q") == {"mnist-run": "r2"}
