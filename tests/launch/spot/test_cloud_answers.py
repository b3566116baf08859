"""``mnist-launch-tpu run`` against the fake gcloud (`tests.launch.fake_gcloud`)
when the cloud's answers change nothing: a delete that exits 0 and keeps the
VM. The run still sleeps between its tries and ends by itself."""

from __future__ import annotations


from tests.launch.fake_cloud import FakeCloud
from launch.tpu import commands as tc
from tests.launch.helpers import RUN_ID, TPU_ARGS, run_program, fake_gcloud_env

NAME = "mnist-tpu"  # TPU_ARGS's
POLL = 0.5


def finished_vm(cloud: FakeCloud) -> None:
    """A READY VM of the run (its mark, TPU_ARGS's --run_id) whose trainer
    exited 0: the run's next step is to delete it."""
    with cloud.locked():
        cloud.new_vm(NAME, {tc.MARK_KEY: RUN_ID})
        cloud.set_state(NAME, "READY")
    work = cloud.vm_dir(NAME) / "home" / "mnist-tpu"
    work.mkdir()
    (work / "train.pid").write_text("1\n")
    (work / "train.exit").write_text("0\n")


def test_a_run_whose_vm_is_never_deleted_ends_by_itself_with_255(tmp_path):
    """Every delete exits 0 and the VM stays READY: the run ends by itself
    after --retry_seconds, exit 255, with one error line naming the VM,
    and it slept at least the backoff (--poll_seconds here) between two
    deletes (the calls' times: load only lengthens the gaps)."""
    cloud = FakeCloud(tmp_path / "cloud")
    finished_vm(cloud)
    cloud.arm(kept_deletes=10_000)
    env = fake_gcloud_env(tmp_path, cloud.root)
    env.pop("STORAGE_EMULATOR_HOST", None)  # the manifest read: a warning
    proc = run_program("launch.tpu", "run", *TPU_ARGS, f"--poll_seconds={POLL}",
                      "--retry_seconds=3", "--python=false",
                      f"--dist_dir={tmp_path / 'dist'}", env=env)
    assert proc.returncode == 255, proc.stdout + proc.stderr
    assert [line for line in proc.stderr.splitlines() if line.startswith("error: ")] == [
        f"error: {NAME} could not be deleted in 3 s (--retry_seconds); delete it yourself: "
        f"gcloud compute tpus tpu-vm delete {NAME} --quiet --zone=us-central2-b"]
    deletes = [c["t"] for c in cloud.calls() if c["argv"][2:4] == ["tpu-vm", "delete"]]
    assert len(deletes) >= 2
    # Each time is rounded to the millisecond.
    assert all(later - earlier >= POLL - 0.002 for earlier, later in zip(deletes, deletes[1:]))
    assert cloud.vms() == {NAME: "READY"}
