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
