"""The spot run's policy and bookkeeping, without a runner: `spot_decide.decide`
on every state, the loop (`spot_runner.SpotRun`) against a scripted cloud,
the journal a restarted launcher reads, the status line's progress, the
``--dry_run`` plan and the trainer's lock takeover for a host named gone."""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import time

import pytest

from launch.tpu import cloud as tpu_cloud
from launch.tpu.spot import decide as sd
from launch.tpu.spot import journal as spot_journal
from launch.tpu import commands as tc
from launch.tpu import states as ts
from mnist_common import storage_lock
from tests.launch.helpers import TPU_ARGS, host_env, run_program, tpu_plan, wait_remote_exit
from tests.launch.spot.scripted import ScriptedCloud, loop, progress

RUNNING = sd.Trainer("running")


@pytest.mark.parametrize("vm, trainer, tally, action, code", [
    ("GONE", sd.Trainer(sd.UNASKED), sd.Tally(), sd.CREATE, 0),
    ("GONE", sd.Trainer(sd.UNASKED), sd.Tally(had_vm=True), sd.RECOVER, 0),
    ("CREATING", sd.Trainer(sd.UNASKED), sd.Tally(), sd.WAIT, 0),
    ("READY", sd.Trainer("not started"), sd.Tally(), sd.SETUP, 0),
    ("READY", sd.Trainer("not started"), sd.Tally(setup_rc=255), sd.SETUP, 0),
    ("READY", sd.Trainer("not started"), sd.Tally(setup_rc=1), sd.FAIL, 1),
    ("READY", RUNNING, sd.Tally(), sd.WAIT, 0),
    ("READY", sd.Trainer("exited", 0), sd.Tally(), sd.FINISH, 0),
    ("READY", sd.Trainer("exited", 1), sd.Tally(recoveries=9), sd.FAIL, 1),
    ("READY", sd.Trainer("exited", 2), sd.Tally(), sd.FAIL, 2),
    ("READY", sd.Trainer("exited", 143), sd.Tally(), sd.RECOVER, 0),
    ("READY", sd.Trainer("stopped"), sd.Tally(), sd.RECOVER, 0),
    ("READY", sd.Trainer(sd.UNREACHABLE), sd.Tally(failing_seconds=5), sd.WAIT, 0),
    ("READY", sd.Trainer(sd.UNREACHABLE), sd.Tally(failing_seconds=901), sd.LOST, 255),
    ("UNKNOWN", sd.Trainer(sd.UNASKED), sd.Tally(failing_seconds=901), sd.LOST, 255),
    ("PREEMPTED", sd.Trainer(sd.UNASKED), sd.Tally(failing_seconds=901), sd.RECOVER, 0),
    ("TERMINATED", sd.Trainer(sd.UNASKED), sd.Tally(), sd.RECOVER, 0),
    ("PREEMPTED", sd.Trainer(sd.UNASKED), sd.Tally(recoveries=5), sd.GIVE_UP, 75),
    ("READY", RUNNING, sd.Tally(elapsed=86401), sd.TIMEOUT, 124),
    ("FAILED", sd.Trainer(sd.UNASKED), sd.Tally(), sd.REPLACE, 0),
])
def test_decide(vm, trainer, tally, action, code):
    decision = sd.decide(vm, trainer, tally)
    assert (decision.action, decision.code) == (action, code)


@pytest.mark.parametrize("queued, node, vm", [
    ("WAITING_FOR_RESOURCES", "", "CREATING"), ("PROVISIONING", "", "CREATING"),
    ("ACTIVE", "READY", "READY"), ("SUSPENDED", "", "SUSPENDED"),
    ("GONE", "", "GONE"), ("FAILED", "", "FAILED")])
def test_queued_state(queued, node, vm):
    assert sd.queued_vm_state(queued, node) == vm


def test_backoff_doubles_up_to_the_poll():
    assert [sd.backoff(n, 10) for n in range(6)] == [10, 1, 2, 4, 8, 10]


@pytest.mark.parametrize("text, kind", [
    ("ERROR: ... RESOURCE_EXHAUSTED: There is no more capacity in the zone", "stockout"),
    ("ERROR: ... RESOURCE_EXHAUSTED: Quota limit exceeded", "permanent"),
    ("ERROR: ... INVALID_ARGUMENT: bad accelerator", "permanent"),
    ("ERROR: ... UNAVAILABLE: try again", "transient")])
def test_create_failures(text, kind):
    assert tpu_cloud.create_failure(text) == kind


# ------------------------------------------------- the loop, scripted

def test_a_stockout_is_retried_then_the_run_trains_and_finishes(tmp_path):
    stockout = (1, "", "ERROR: RESOURCE_EXHAUSTED: There is no more capacity in the zone")
    cloud = ScriptedCloud(["GONE", "GONE", "READY", "READY", "READY", "READY", "GONE"],
                          [progress("not started"), progress("running", step=4),
                           progress("exited", 0, 66)], creates=[stockout])
    code, out = loop(cloud, tmp_path)
    assert code == 0
    # The wheel is built before the first create: a build that fails costs no VM.
    assert cloud.calls == ["describe", "build", "create", "describe", "create", "describe",
                           "status", "install", "train dead=", "describe", "status",
                           "describe", "status", "describe", "delete", "describe"]
    assert [line.split()[1] for line in out.splitlines()] == [
        "started:", "no", "created:", "set", "training:", "training:", "training:",
        "deleted:", "finished:", "summary:"]


def test_ssh_failing_too_long_gives_up_and_deletes(tmp_path):
    unreachable = (sd.Trainer(sd.UNREACHABLE), [])
    cloud = ScriptedCloud(["READY"] * 40 + ["READY", "GONE"], [unreachable] * 40)
    code, out = loop(cloud, tmp_path)
    assert code == 255 and cloud.calls[-2:] == ["delete", "describe"]
    assert "lost: mnist-tpu: calls to the cloud failed for" in out


def test_a_failed_install_is_not_retried(tmp_path):
    cloud = ScriptedCloud(["READY", "READY", "READY", "GONE"],
                          [progress("not started"), progress("not started")],
                          installs=[(1, "", "error: t1: libtpu 0.0.32 does not load")])
    code, _ = loop(cloud, tmp_path)
    assert code == 1 and cloud.calls.count("install") == 1
    assert cloud.calls[-4:] == ["fetch log", "describe", "delete", "describe"]


def test_the_journal_lets_a_restarted_launcher_count_on(tmp_path):
    """A preempted VM after a kill: its recovery counts on from the journal,
    and the new trainer is told the dead VM's host."""
    events = tmp_path / "events.jsonl"
    run = spot_journal.identity(tpu_plan("run")[0])
    old = [{"event": "started", "run": run},
           {"event": "created"}, {"event": "training", "step": 12, "hosts": ["h-old"]},
           {"event": "preempted", "recovery": 1, "step": 12}, {"event": "deleted"},
           {"event": "created"}, {"event": "recovered", "recovery": 1},
           {"event": "training", "step": 30, "hosts": ["h-two"]}]
    events.write_text("".join(json.dumps(e) + "\n" for e in old))
    standing = replayed(events)
    assert (standing.recoveries, standing.dead_hosts, standing.vm_hosts) == (
        1, {"h-old"}, {"h-two"})
    cloud = ScriptedCloud(["PREEMPTED", "PREEMPTED", "GONE", "GONE", "READY", "READY", "GONE"],
                          [progress("not started"), progress("exited", 0, 66, "h-3")])
    code, out = loop(cloud, tmp_path, "--max_recoveries=2", events=events)
    assert code == 0
    assert "train dead=h-old,h-two" in cloud.calls
    assert "recovered: mnist-tpu: training again (2 of 2)" in out
    # A finished run's journal starts the next one afresh.
    assert replayed(events).recoveries == 0


def replayed(path):
    """The `Standing` a launcher reads from the journal at ``path``."""
    journal, standing = spot_journal.Journal.open(path, {})
    journal.close()
    return standing


# ----------------------------------------------- commands and the CLI

def test_the_status_line_reports_the_trainers_progress(tmp_path):
    home = tmp_path / "home"
    (home / "mnist-tpu").mkdir(parents=True)
    (home / "mnist-tpu" / "train.log").write_text(
        "resuming at step 30/66\nstep 40/66 epoch 2/3 loss 1.0\n"
        "SIGTERM received: stopped at step 42/66, saved x; rerun\n")
    (home / "mnist-tpu" / "train.pid").write_text("1\n")
    (home / "mnist-tpu" / "train.exit").write_text("143\n")
    out = subprocess.run(["bash", "-c", tc.status_script()], env={"HOME": str(home),
                         "PATH": "/usr/bin:/bin"}, capture_output=True, text=True).stdout
    [found] = ts.parse_progress(out)
    assert (found.step, found.total, found.resumed) == (42, 66, 30)
    assert ts.summarize_status(ts.parse_status(out)) == ("exited", 143)


def test_the_train_script_records_143_when_every_process_gets_sigterm(tmp_path):
    """As a preemption notice reaches every process: the subshell outlives
    it and writes the trainer's status."""
    cfg, _ = tpu_plan("train")
    env = host_env(tmp_path)
    session = subprocess.Popen(["bash", "-c", tc.train_script(cfg, ["old-host"]) + "; sleep 600"],
                               env=env, start_new_session=True, stdout=subprocess.DEVNULL)
    # The stand-in trainer records its arguments first: by then the subshell
    # has set its trap. A hang bound, not a speed bar (quiet: well under 1 s).
    deadline = time.monotonic() + 60
    while not (tmp_path / "trainer.args").exists():
        assert session.poll() is None and time.monotonic() < deadline, session.returncode
        time.sleep(0.02)
    os.killpg(session.pid, signal.SIGTERM)
    assert wait_remote_exit(env) == ("exited", 143)
    session.wait(timeout=30)


def test_the_trainer_is_told_the_hosts_of_deleted_vms():
    cfg, _ = tpu_plan("train")
    script = tc.train_script(cfg, ["h2", "h1"])
    assert f"{storage_lock.DEAD_HOSTS_ENV}=h1,h2 python3 -m trainer" in script
    assert storage_lock.DEAD_HOSTS_ENV not in tc.train_script(cfg)


def test_dry_run_shows_the_plan_of_run():
    proc = run_program("launch.tpu", "run", *TPU_ARGS, "--spot", "--queued",
                      "--max_recoveries=2", "--dry_run")
    assert proc.returncode == 0, proc.stderr
    verbs = [shlex.split(line)[3:5] for line in proc.stdout.splitlines()
             if line.startswith("gcloud compute")]
    assert verbs == [["queued-resources", "describe"], ["tpu-vm", "describe"],
                     ["queued-resources", "create"], ["tpu-vm", "scp"], ["tpu-vm", "ssh"],
                     ["tpu-vm", "ssh"], ["tpu-vm", "ssh"], ["queued-resources", "delete"],
                     ["queued-resources", "describe"], ["tpu-vm", "describe"]]
    assert "--spot" in proc.stdout.splitlines()[2]
    assert "at most --max_recoveries=2; then exit 75" in proc.stderr


@pytest.mark.parametrize("flag, message", [
    ("--max_recoveries=-1", "--max_recoveries must be 0 or more"),
    ("--retry_seconds=0", "--retry_seconds must be positive")])
def test_run_refuses_bad_flags_in_one_line(flag, message):
    proc = run_program("launch.tpu", "run", *TPU_ARGS, flag, "--dry_run")
    assert proc.returncode == 2 and proc.stderr == f"error: {message}\n"


def test_a_lock_whose_host_is_named_gone_is_taken_over(tmp_path):
    path = str(tmp_path / ".lock")
    alive = storage_lock.LockInfo("old", "vm-1-host", 1, time.time(), time.time())
    assert storage_lock.LocalLockFile(path).create(alive.to_bytes())
    me = storage_lock.LockInfo.for_this_process("new")
    token, holder = storage_lock.claim(storage_lock.LocalLockFile(path), me, "M")
    assert token is None and holder.run_id == "old"
    gone = storage_lock.dead_hosts({storage_lock.DEAD_HOSTS_ENV: "vm-1-host, x"})
    assert gone == {"vm-1-host", "x"}
    token, holder = storage_lock.claim(storage_lock.LocalLockFile(path), me, "M", gone=gone)
    assert token is not None and holder is None
