"""Each ending of ``mnist-launch-tpu run --spot`` against the fake cloud: the
exit status, the events, and the VMs left (none unless ``--keep``).

A trainer bug is not retried; a queued resource waits for capacity;
``--max_recoveries`` ends the run; a launcher killed and started again picks
its run up (waiting on a VM that trains, recovering a preempted one, counting
on from its journal); Ctrl-C, SIGTERM and SIGHUP to the launcher delete the VM.
"""

from __future__ import annotations

import os
import signal
import time

import pytest

from tests.helpers import EMULATOR_BUCKET, REPO
from tests.launch.spot.helpers import NAME, RUN_SECONDS, Chaos, World

# A hang bound, not a speed bar: the longest test here took 71 s with the
# machine's load at 2-4.5.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]


def until(condition, what: str, timeout: float = RUN_SECONDS) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"never: {what}"
        time.sleep(0.05)


def kinds(world: World) -> list[str]:
    return [e["event"] for e in world.events()]


def creates(world: World) -> int:
    return [r["event"] for r in world.cloud.history()].count("create")


def test_a_trainer_bug_is_not_retried_and_its_log_is_kept(world):
    argv = [a if not a.startswith("--data=") else f"--data=gs://{EMULATOR_BUCKET}/nothing"
            for a in world.argv("bug")]
    proc = world.launch(argv)
    assert proc.returncode == 2, proc.stdout + proc.stderr[-3000:]  # bad input: no dataset
    assert "preempted" not in kinds(world) and kinds(world)[-2:] == ["failed", "summary"]
    assert creates(world) == 1 and world.cloud.vms() == {}
    log = (world.tmp / "logs" / f"{NAME}-train.log").read_text()
    assert log.startswith("error: gs://test-bucket/nothing: ")
    assert proc.stderr.strip().splitlines()[-1] == (
        f"error: {NAME}: the trainer exited with status 2")


def test_a_queued_spot_run_waits_for_capacity_trains_and_deletes_its_resource(world):
    """``--queued``: the queued resource waits out two refusals for capacity,
    its VM trains to the end, and the resource (with its VM) is deleted."""
    world.cloud.arm(stockouts=2)
    proc = world.launch(world.argv("queued", "--queued"))
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    verbs = [c["argv"][3] for c in world.cloud.calls()
             if c["argv"][:3] == ["compute", "tpus", "queued-resources"]]
    # Looked up before it is created (a run never makes a second one),
    # described through two waits for capacity until ACTIVE, deleted, and
    # described until it is gone.
    assert verbs[0] == "describe" and verbs.count("create") == verbs.count("delete") == 1
    created, deleted = verbs.index("create"), verbs.index("delete")
    assert verbs[created:deleted].count("describe") >= 3
    assert set(verbs[deleted + 1:]) <= {"describe"}
    assert world.cloud.faults() == {"stockouts": 0}
    assert kinds(world)[-2:] == ["finished", "summary"]
    assert world.cloud.vms() == {}
    assert not list((world.cloud.root / "queued").iterdir())


def test_a_queued_resource_whose_vm_is_deleted_under_it_is_created_again(world):
    """``--queued``: the VM is deleted while it trains and its queued
    resource stays ACTIVE, holding the name: the run deletes the queued
    resource, creates it again (no ALREADY_EXISTS) and trains to the end."""
    world.env["PYTHONPATH"] = str(REPO)  # this checkout's launcher, not one installed
    proc = world.start(world.argv("queued-node", "--queued"))
    until(lambda: world.step() >= 2, "the trainer at step 2")
    with world.cloud.locked():
        world.cloud.remove_vm(NAME)
    out, err = proc.communicate(timeout=RUN_SECONDS)
    assert proc.returncode == 0, out + err[-3000:]
    queued = [c for c in world.cloud.calls()
              if c["argv"][:3] == ["compute", "tpus", "queued-resources"]]
    creates = [c["rc"] for c in queued if c["argv"][3] == "create"]
    assert creates == [0, 0] and [c["argv"][3] for c in queued].count("delete") == 2
    assert kinds(world).count("recovered") == 1 and kinds(world)[-2:] == ["finished", "summary"]
    assert world.cloud.vms() == {} and not list((world.cloud.root / "queued").iterdir())


def test_max_recoveries_reached_ends_the_run_and_deletes_the_vm(world):
    chaos = Chaos(world, [("setup", 0.5), ("setup", 0.5)])
    chaos.start()
    proc = world.launch(world.argv("max", "--max_recoveries=1"))
    chaos.join(timeout=10)
    assert not chaos.error, chaos.error
    assert proc.returncode == 75, proc.stdout + proc.stderr[-3000:]
    # Both preemptions are reported; the second is not recovered.
    preempted = [e for e in world.events() if e["event"] == "preempted"]
    assert [e.get("recovery") for e in preempted] == [1, None]
    assert kinds(world)[-2:] == ["gave up", "summary"]
    assert "--max_recoveries=1 reached" in proc.stdout
    assert creates(world) == 2 and world.cloud.vms() == {} and world.cloud.most_alive() == 1


def test_a_killed_launcher_started_again_picks_up_its_run(world):
    """Killed while training, started again: it waits on that VM. Killed
    again, the VM preempted (killed at once: its lock stays held), started
    again: it recovers, counting on, and the new trainer takes the dead
    VM's lock over at once. With --keep the last VM stays."""
    argv = world.argv("restart", "--keep", "--max_recoveries=1")
    first = world.start(argv)
    until(lambda: world.step() >= 6, "the first trainer at step 6")
    os.killpg(first.pid, signal.SIGKILL)
    first.communicate()
    second = world.start(argv)
    until(lambda: kinds(world).count("training") >= 3 and world.step() >= 12,
          "the second launcher following the training")
    os.killpg(second.pid, signal.SIGKILL)
    second.communicate()
    assert creates(world) == 1 and "created" in kinds(world)
    world.cloud.preempt(NAME, grace=0.0)
    proc = world.launch(argv)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    assert kinds(world).count("created") == 2 and kinds(world).count("preempted") == 1
    assert "recovered: spot-tpu: training again (1 of 1)" in proc.stdout
    assert world.cloud.vms() == {NAME: "READY"} and world.cloud.most_alive() == 1
    log = (world.vm_home() / "mnist-tpu" / "train.log").read_text()
    assert "MNIST_LOCK_DEAD_HOSTS" in log and "taking over the lock" in log


@pytest.mark.parametrize("signum, when, code", [
    (signal.SIGINT, "training", 130), (signal.SIGTERM, "setup", 143),
    (signal.SIGHUP, "training", 129)])  # SIGHUP: the terminal closed
def test_ctrl_c_sigterm_or_sighup_to_the_launcher_deletes_the_vm(world, signum, when, code):
    proc = world.start(world.argv("stop"))
    if when == "training":
        until(lambda: world.step() >= 2, "the trainer at step 2")
    else:
        until(lambda: world.cloud.vm_id(NAME) and (world.vm_home() / "host.log").exists(),
              "the install running")
    os.killpg(proc.pid, signum)  # Ctrl-C reaches the terminal's whole process group
    out, err = proc.communicate(timeout=RUN_SECONDS)
    assert proc.returncode == code, out + err[-3000:]
    assert kinds(world)[-2:] == ["interrupted", "summary"]
    assert "Traceback" not in err
    assert world.cloud.vms() == {} and creates(world) == 1
