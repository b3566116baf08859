"""Checks of the TPU VM launcher (`launch.tpu`), offline.

Nothing here talks to Google Cloud. The commands are read as argv lists; the
shell scripts the launcher sends to the TPU hosts run here in bash, against a
stand-in ``python3``, so detaching, the pid and exit files, status and logs
are exercised for real. ``execute`` is driven with a stand-in ``gcloud`` on
PATH that records every call, and the record must equal the ``--dry_run``
output line for line.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import mnist_contract as contract
from launch import errors as le
from launch import wheel as lw
from launch.tpu import cli as lt
from launch.tpu import cloud as tpu_cloud
from launch.tpu import commands as tc
from launch.tpu import states as ts
from mnist_common import console
from tests.helpers import REPO
from tests.launch.helpers import (PYPROJECT, RUN_ID, RUNNING, TPU_ARGS, WHEEL, FakeHost, as_planned,
                                  clean_env, fake_program, flag_values, host_env, release_trainer,
                                  described, program, remote_state, run_remote, run_program,
                                  status_line, tpu_plan, wait_remote_exit, wait_with)

POD_ARGS = [a for a in TPU_ARGS if not a.startswith("--accelerator_type")] + [
    "--accelerator_type=v4-32", "--runtime_version=tpu-vm-tf-2.19.0-pod-pjrt"]


def remote_script(cmd: list[str]) -> str:
    return flag_values(cmd)["command"]


def verb(cmd: list[str]) -> str:
    """What a planned command does: build, storage cat, or the tpu-vm verb."""
    if cmd[0] != "gcloud":
        return "build"
    return " ".join(cmd[1:3]) if cmd[1] == "storage" else cmd[4]


def manifest_text(train_files: int) -> str:
    """A valid manifest.json whose train split has ``train_files`` files."""
    def split(name: str, files: int) -> contract.SplitInfo:
        return contract.SplitInfo(name, tuple(
            contract.ShardInfo(contract.shard_filename(name, i, files), 10, 8550,
                               "0" * 64) for i in range(files)))
    return contract.Manifest(contract.DATASET_NAME, "raw", "none", {
        "train": split("train", train_files), "test": split("test", 1)}).to_json()


# ------------------------------------------------------------- commands

def test_tpu_create_command():
    _, [cmd] = tpu_plan("create", "--spot", "--project=proj-1")
    assert cmd[:6] == ["gcloud", "compute", "tpus", "tpu-vm", "create",
                       "mnist-tpu"]
    flags = flag_values(cmd)
    assert flags["zone"] == "us-central2-b"
    assert flags["accelerator-type"] == "v4-8"
    assert flags["version"] == "tpu-ubuntu2204-base"
    assert flags["project"] == "proj-1"
    assert "--spot" in cmd


@pytest.mark.parametrize("accelerator,image", [
    ("v4-8", "tpu-ubuntu2204-base"), ("v5litepod-8", "v2-alpha-tpuv5-lite"),
    ("v5p-8", "v2-alpha-tpuv5"), ("v6e-8", "v2-alpha-tpuv6e"),
])
def test_tpu_default_runtime_per_accelerator(accelerator, image):
    base = [a for a in TPU_ARGS if not a.startswith("--accelerator_type")]
    _, [cmd] = tpu_plan("create", f"--accelerator_type={accelerator}",
                        base=base)
    assert flag_values(cmd)["version"] == image


def test_tpu_setup_copies_and_installs_on_every_worker(tmp_path):
    _, (describe, build, scp, ssh) = tpu_plan("setup", f"--dist_dir={tmp_path}")
    assert describe[3:6] == ["tpu-vm", "describe", "mnist-tpu"]
    assert build[1:4] == ["-m", "pip", "wheel"]
    assert scp[:5] == ["gcloud", "compute", "tpus", "tpu-vm", "scp"]
    assert "--worker=all" in scp and "--zone=us-central2-b" in scp
    assert scp[5:7] == [str(tmp_path / WHEEL), "mnist-tpu:"]
    assert ssh[:6] == ["gcloud", "compute", "tpus", "tpu-vm", "ssh",
                       "mnist-tpu"]
    assert "--worker=all" in ssh and "--zone=us-central2-b" in ssh
    script = remote_script(ssh)
    assert "pip install --user tensorflow-tpu==2.20.0 libtpu==0.0.31;" in script
    assert tc.LIBTPU_FIND_LINKS not in script
    assert f"--no-deps --force-reinstall {WHEEL}" in script
    subprocess.run(["bash", "-n", "-c", script], check=True)


def test_tpu_install_script_keeps_tpu_tensorflow(tmp_path):
    """Run the remote install script against a stand-in python3."""
    log = tmp_path / "calls.log"
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake_program(bin_dir / "python3", f"""
echo "$*" >> {shlex.quote(str(log))}
case "$*" in *"print(tf.__version__)"*) echo 2.20.0 ;; esac
""")
    cfg, _ = tpu_plan("setup", "--libtpu=libtpu==0.0.17")
    script = tc.install_script(cfg, PYPROJECT)
    env = dict(os.environ, HOME=str(tmp_path),
               PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    subprocess.run(["bash", "-c", script], check=True, env=env, timeout=30)
    calls = log.read_text().splitlines()
    pip = [c for c in calls if c.startswith("-m pip install")]
    assert pip[0] == "-m pip install --user tensorflow-tpu==2.20.0 libtpu==0.0.17"
    # The trainer's GCS client with its dependencies, in the trainer extra's
    # range (the project wheel below brings no dependencies).
    [gcs] = [r for r in lw.extra_requirements(PYPROJECT, "trainer")
             if r.startswith("google-cloud-storage")]
    assert pip[1] == f"-m pip install --user {gcs}"
    # tf-keras pinned to the installed TensorFlow, and never pulling the
    # CPU-only tensorflow wheel in as its dependency.
    assert pip[2] == "-m pip install --user --no-deps tf-keras~=2.20.0"
    assert pip[3] == ("-m pip install --user --no-deps --force-reinstall "
                      + WHEEL)
    assert "import tensorflow as tf, tf_keras, google.cloud.storage, trainer" in calls[-1]


def test_tpu_install_script_needs_the_gcs_client_in_the_trainer_extra():
    cfg, _ = tpu_plan("setup")
    extras = PYPROJECT["project"]["optional-dependencies"]
    without = {**PYPROJECT, "project": {**PYPROJECT["project"], "optional-dependencies": {
        **extras, "trainer": [r for r in extras["trainer"]
                              if not r.startswith("google-cloud-storage")]}}}
    with pytest.raises(le.ConfigError, match="trainer extra must list google-cloud-storage"):
        tc.install_script(cfg, without)


def test_tpu_tf_runtime_image_keeps_its_tensorflow():
    cfg, (_, _, _, ssh) = tpu_plan(
        "setup", "--runtime_version=tpu-vm-tf-2.19.0-pjrt")
    assert cfg.tensorflow == tc.PREINSTALLED
    script = remote_script(ssh)
    assert "tensorflow-tpu" not in script
    assert '"tf-keras~=${TF_VERSION%.*}.0"' in script


def test_tpu_train_single_host_starts_the_tpu_preset_on_all_workers():
    cfg, [_, manifest, cmd] = tpu_plan("train", "--loop=custom", "--epochs=3")
    assert manifest == ["gcloud", "storage", "cat", "gs://bkt/mnist/manifest.json"]
    assert cmd[:6] == ["gcloud", "compute", "tpus", "tpu-vm", "ssh",
                       "mnist-tpu"]
    assert "--worker=all" in cmd and "--zone=us-central2-b" in cmd
    trainer = tc.trainer_command(cfg)
    # The preset first, so the user's flags after it override its values.
    assert trainer == ["python3", "-m", "trainer", "--preset=tpu",
                       "--strategy=tpu", "--tpu=local",
                       "--data=gs://bkt/mnist", "--model_dir=gs://bkt/runs/1",
                       "--loop=custom", "--epochs=3"]
    script = remote_script(cmd)
    assert shlex.join(trainer) in script
    assert "TPU_LOAD_LIBRARY" not in script
    subprocess.run(["bash", "-n", "-c", script], check=True)


@pytest.mark.parametrize("given", [["--preset=cpu"], ["--preset", "cpu"]])
def test_tpu_train_a_given_preset_replaces_the_default(given):
    cfg, _ = tpu_plan("train", *given, "--epochs=1")
    trainer = tc.trainer_command(cfg)
    assert "--preset=tpu" not in trainer
    assert trainer[-len(given) - 1:] == [*given, "--epochs=1"]


def test_tpu_train_multi_host_uses_one_client_and_a_pod_image():
    cfg, [_, _, cmd] = tpu_plan("train", base=POD_ARGS)
    assert "--worker=0" in cmd and "--worker=all" not in cmd
    script = remote_script(cmd)
    assert ("TPU_LOAD_LIBRARY=0 python3 -m trainer --preset=tpu "
            "--strategy=tpu --tpu=mnist-tpu ") in script
    assert "--tpu=local" not in script
    assert "echo $! > train.pid" in script  # detached there too


def test_tpu_logs_status_and_wait_need_only_name_and_zone():
    base = ["--name=mnist-tpu", "--zone=us-central2-b", "--run_id=r1"]
    _, [_, logs] = tpu_plan("logs", "--follow", "--lines=7", base=base)
    assert "--worker=all" in logs
    assert "tail -n 7 -F --pid=" in remote_script(logs)
    _, [_, status] = tpu_plan("status", base=base)
    _, [_, wait] = tpu_plan("wait", base=base)
    assert status == wait and "--worker=all" in status
    assert remote_script(status) == tc.status_script()


def test_tpu_all_order_and_delete_after():
    _, cmds = tpu_plan("all", "--delete_after")
    assert [verb(c) for c in cmds] == ["create", "describe", "build", "scp", "ssh",
                                       "describe", "storage cat", "ssh", "describe", "ssh",
                                       "describe", "delete"]
    assert remote_script(cmds[7]).startswith("mkdir -p ~/mnist-tpu")
    assert remote_script(cmds[9]) == tc.status_script()
    assert cmds[-1][5:] == ["mnist-tpu", "--quiet", "--zone=us-central2-b"]
    _, cmds = tpu_plan("all")
    assert "delete" not in [verb(c) for c in cmds]


# ------------------------------------------------ remote scripts, in bash

def test_train_script_detaches_and_survives_a_hangup(tmp_path):
    cfg, _ = tpu_plan("train", "--epochs=2")
    env = host_env(tmp_path)
    run_dir = Path(env["HOME"]) / "mnist-tpu"
    assert remote_state(env) == ("not started", None)
    # Like sshd, a session of its own; the script must return while the
    # trainer still runs (a trainer holding the pipes would block here).
    session = subprocess.Popen(
        ["bash", "-c", tc.train_script(cfg)], env=env, text=True,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        start_new_session=True)
    out, err = session.communicate(timeout=60)
    assert session.returncode == 0, err
    assert "trainer started on" in out
    pid = int((run_dir / "train.pid").read_text())
    assert remote_state(env) == ("running", None)
    # The connection drops: SIGHUP to everything the session started.
    os.killpg(session.pid, signal.SIGHUP)
    assert remote_state(env) == ("running", None)
    # A second start on a host that is training is refused.
    again = run_remote(tc.train_script(cfg), env)
    assert again.returncode == 1
    assert f"a trainer is already running, pid {pid}" in again.stderr
    assert int((run_dir / "train.pid").read_text()) == pid

    release_trainer(tmp_path, 3)
    assert wait_remote_exit(env) == ("exited", 3)
    assert (run_dir / "train.exit").read_text() == "3\n"
    assert (tmp_path / "trainer.args").read_text().splitlines() == \
        tc.trainer_command(cfg)[1:]
    assert (run_dir / "train.log").read_text().splitlines() == [
        "trainer says hello", "to stderr"]

    # Starting again keeps the previous log and clears the old status.
    release_trainer(tmp_path, 0)
    restart = run_remote(tc.train_script(cfg), env)
    assert restart.returncode == 0, restart.stderr
    assert (run_dir / "train.log.prev").read_text().startswith("trainer says")
    assert wait_remote_exit(env) == ("exited", 0)


def test_status_script_reports_a_trainer_that_vanished(tmp_path):
    env = host_env(tmp_path)
    run_dir = Path(env["HOME"]) / "mnist-tpu"
    run_dir.mkdir()
    dead = subprocess.Popen(["true"])
    dead.wait()
    (run_dir / "train.pid").write_text(f"{dead.pid}\n")
    assert remote_state(env) == ("stopped", None)
    (run_dir / "train.exit").write_text("0\n")
    assert remote_state(env) == ("exited", 0)


def test_logs_script_prints_the_end_of_the_log(tmp_path):
    env = host_env(tmp_path)
    cfg, _ = tpu_plan("logs", "--lines=2")
    proc = run_remote(tc.logs_script(cfg), env)
    assert proc.returncode == 0
    assert proc.stdout == ""
    assert "no ~/mnist-tpu/train.log" in proc.stderr
    run_dir = Path(env["HOME"]) / "mnist-tpu"
    run_dir.mkdir()
    (run_dir / "train.log").write_text("one\ntwo\nthree\n")
    proc = run_remote(tc.logs_script(cfg), env)
    assert proc.stdout == "two\nthree\n"


def test_logs_follow_stops_when_the_trainer_exits(tmp_path):
    env = host_env(tmp_path)
    cfg, _ = tpu_plan("logs", "--lines=1", "--follow")
    run_dir = Path(env["HOME"]) / "mnist-tpu"
    run_dir.mkdir()
    log = run_dir / "train.log"
    log.write_text("old\nstep 1\n")
    trainer = subprocess.Popen(["sleep", "600"])
    (run_dir / "train.pid").write_text(f"{trainer.pid}\n")
    tail = subprocess.Popen(["bash", "-c", tc.logs_script(cfg)], env=env,
                            stdout=subprocess.PIPE, text=True)
    try:
        assert tail.stdout.readline() == "step 1\n"
        with log.open("a") as fh:
            fh.write("step 2\n")
        assert tail.stdout.readline() == "step 2\n"  # still following
    finally:
        trainer.kill()
        trainer.wait()
    out, _ = tail.communicate(timeout=60)  # returns: the trainer is gone
    assert out == "" and tail.returncode == 0


# ------------------------------------------------------- status and wait

@pytest.mark.parametrize("lines,expected", [
    ([status_line("running pid=12")], ("running", 0)),
    ([status_line("exited status=0")], ("exited", 0)),
    ([status_line("exited status=3")], ("exited", 3)),
    ([status_line("not started")], ("not started", 1)),
    ([status_line("stopped without an exit status")], ("stopped", 1)),
    # A pod slice: the trainer runs on worker 0 only.
    ([status_line("running pid=12"), status_line("not started", "w-1")],
     ("running", 0)),
    ([status_line("not started", "w-1"), status_line("exited status=0")],
     ("exited", 0)),
    ([status_line("exited status=0"), status_line("exited status=5", "w-1")],
     ("exited", 5)),
])
def test_status_summary(lines, expected):
    output = "Using ssh batch size of 1.\n" + "\n".join(lines) + "\n"
    assert ts.summarize_status(ts.parse_status(output)) == expected


def test_wait_polls_until_the_trainer_exits(capsys):
    host = FakeHost([RUNNING, RUNNING, (0, status_line("exited status=4"))])
    assert wait_with(host) == 4
    assert host.calls == 3 and host.slept == [30, 30]
    assert "finished with exit status 4" in capsys.readouterr().err


def test_wait_rides_out_failed_checks_but_not_too_many(capsys):
    failed = (255, "")
    host = FakeHost([failed] * (tpu_cloud.POLL_FAILURES - 1) + [RUNNING]
                    + [failed] * (tpu_cloud.POLL_FAILURES - 1)
                    + [(0, status_line("exited status=0"))])
    assert wait_with(host) == 0
    host = FakeHost([RUNNING] + [failed] * tpu_cloud.POLL_FAILURES)
    assert wait_with(host) == console.LOST
    assert host.calls == 1 + tpu_cloud.POLL_FAILURES
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith(f"error: mnist-tpu: {tpu_cloud.POLL_FAILURES} status "
                              "checks in a row failed (last exit 255)")


def test_wait_gives_up_after_the_timeout(capsys):
    host = FakeHost([RUNNING] * 10)
    assert wait_with(host, "--wait_timeout=90") == console.TIMED_OUT
    assert host.calls == 4 and host.now == 90
    assert "still running after 90 s (--wait_timeout)" in \
        capsys.readouterr().err


@pytest.mark.parametrize("state,message", [
    ("not started", "no trainer was started there"),
    ("stopped without an exit status", "stopped without an exit status"),
])
def test_wait_fails_at_once_without_a_trainer(state, message, capsys):
    host = FakeHost([(0, status_line(state))])
    assert wait_with(host) == 1
    assert host.calls == 1
    [line] = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("error: mnist-tpu: ") and message in line


# ------------------------------------ execute runs what --dry_run prints

def fake_cloud(tmp_path: Path, running_polls: int = 0, train_exit: int = 0,
               manifest: str | None = manifest_text(1),
               ) -> tuple[dict[str, str], Path, Path]:
    """A ``gcloud`` on PATH and a build ``python`` that log their commands.

    Each call is written as ``shlex.join`` of the argv the launcher passed
    (the name it used first). A describe answers READY, with the mark of
    TPU_ARGS's run id. Status checks answer "running" for the first
    ``running_polls`` calls, then "exited status=train_exit". ``storage cat``
    prints ``manifest``, or fails (exit 1) when it is None.
    """
    log, count = tmp_path / "calls.log", tmp_path / "polls"
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    answer = tmp_path / "manifest.answer"
    if manifest is not None:
        answer.write_text(manifest)
    record = f"""#!{sys.executable}
import pathlib, shlex, sys
with open({str(log)!r}, "a") as fh:
    fh.write(shlex.join([NAME] + sys.argv[1:]) + "\\n")
"""
    gcloud = bin_dir / "gcloud"
    gcloud.write_text(record.replace("NAME", repr("gcloud")) + f"""
if sys.argv[4:5] == ["describe"]:
    print({json.dumps({"state": "READY", "labels": {tc.MARK_KEY: RUN_ID}})!r})
if sys.argv[1:3] == ["storage", "cat"]:
    answer = pathlib.Path({str(answer)!r})
    if not answer.exists():
        sys.exit("ERROR: (gcloud.storage.cat) 403 no access")
    print(answer.read_text(), end="")
if any({tc.STATUS_PREFIX!r} in a for a in sys.argv):
    polls = pathlib.Path({str(count)!r})
    n = int(polls.read_text()) if polls.exists() else 0
    polls.write_text(str(n + 1))
    state = ("running pid=7" if n < {running_polls}
             else "exited status={train_exit}")
    print({tc.STATUS_PREFIX!r}, state, "on t1-w-0")
""")
    python = bin_dir / "build-python"
    python.write_text(record.replace("NAME", repr(str(python))) + f"""
wheel_dir = pathlib.Path(sys.argv[sys.argv.index("--wheel-dir") + 1])
(wheel_dir / {WHEEL!r}).write_text("wheel")
""")
    for stand_in in (gcloud, python):
        stand_in.chmod(0o755)
    env = clean_env(PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    return env, log, python


@pytest.mark.parametrize("step,extra", [
    ("create", []),
    ("setup", []),
    ("train", ["--loop=custom"]),
    ("wait", []),
    ("status", []),
    ("logs", ["--follow", "--lines=5"]),
    ("delete", []),
    ("all", ["--delete_after", "--epochs=1"]),
    ("all", []),
])
def test_execute_runs_exactly_what_dry_run_prints(tmp_path, step, extra):
    env, log, python = fake_cloud(tmp_path)
    argv = [step, *TPU_ARGS, *extra, f"--python={python}",
            f"--dist_dir={tmp_path / 'dist'}", "--poll_seconds=0"]
    dry = run_program("launch.tpu", *argv, "--dry_run", env=env)
    assert dry.returncode == 0, dry.stderr
    assert not log.exists() and not (tmp_path / "dist").exists()
    real = run_program("launch.tpu", *argv, env=env)
    assert real.returncode == 0, real.stderr
    assert dry.stdout.strip()
    assert as_planned(log.read_text()) == dry.stdout


@pytest.mark.parametrize("step", ["create", "setup", "train", "wait", "status", "logs",
                                  "delete", "all"])
def test_each_step_runs_its_planned_commands_through_the_one_cloud_layer(tmp_path, step):
    """`tpu_cloud.Cloud` runs every step from `tc.phases`, the plan ``--dry_run``
    prints (the wheel build too: the one place it is special)."""
    cfg, planned = tpu_plan(step, f"--dist_dir={tmp_path}", "--poll_seconds=0")
    calls = []

    def record(cmd):
        calls.append(cmd)
        if "describe" in cmd:
            return 0, described(cfg), ""
        if "--wheel-dir" in cmd:
            (tmp_path / WHEEL).write_text("wheel")
        if any(tc.STATUS_PREFIX in a for a in cmd):
            return 0, status_line("exited status=0") + "\n", ""
        return 0, manifest_text(1) if "storage" in cmd else "", ""
    work = tc.phases(step, cfg, PYPROJECT)
    cloud = tpu_cloud.Cloud(cfg, PYPROJECT, dict(work), run=record)
    assert [tpu_cloud.run_step(name, cloud) for name, _ in work] == [0] * len(work)
    assert [[as_planned(a) for a in cmd] for cmd in calls] == planned


def test_execute_repeats_only_the_status_check_while_training(tmp_path):
    env, log, python = fake_cloud(tmp_path, running_polls=2, train_exit=0)
    argv = ["all", *TPU_ARGS, "--delete_after", f"--python={python}",
            f"--dist_dir={tmp_path / 'dist'}", "--poll_seconds=0"]
    dry = run_program("launch.tpu", *argv, "--dry_run", env=env)
    assert "the status command repeats every 0 s" in dry.stderr
    real = run_program("launch.tpu", *argv, env=env)
    assert real.returncode == 0, real.stderr
    planned = dry.stdout.splitlines()
    status = planned[-3]  # then the describe and delete of --delete_after
    assert tc.STATUS_PREFIX in status
    assert as_planned(log.read_text()).splitlines() == \
        planned[:-2] + [status, status] + planned[-2:]


def train_stderr(tmp_path: Path, base: list[str], manifest: str | None) -> str:
    """The train step, run against a fake gcloud: its stderr (the trainer started)."""
    env, log, _ = fake_cloud(tmp_path, manifest=manifest)
    proc = run_program("launch.tpu", "train", *base, env=env)
    assert proc.returncode == 0, proc.stderr
    assert [verb(shlex.split(c)) for c in log.read_text().splitlines()] == [
        "describe", "storage cat", "ssh"]
    return proc.stderr


def warnings(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("warning: ")]


def test_train_warns_when_a_pod_has_more_hosts_than_train_files(tmp_path):
    [line] = warnings(train_stderr(tmp_path, POD_ARGS, manifest_text(1)))
    assert line == ("warning: gs://bkt/mnist/manifest.json: the train split has 1 "
                    "file(s) but v4-32 has 4 hosts, so every host reads all of it "
                    "and keeps one record in 4; rerun the pipeline with "
                    "--min_shards=4 (or a multiple of it)")


@pytest.mark.parametrize("base,files", [(TPU_ARGS, 1), (POD_ARGS, 4)])
def test_train_is_quiet_when_every_host_has_a_train_file(tmp_path, base, files):
    assert warnings(train_stderr(tmp_path, base, manifest_text(files))) == []


@pytest.mark.parametrize("manifest,problem", [
    (None, "not read (gcloud storage cat exited 1); the train files were not "
           "compared with the 4 host(s) of v4-32"),
    ("{", "not valid JSON"),
])
def test_an_unreadable_manifest_is_a_warning_and_training_starts(tmp_path, manifest,
                                                                 problem):
    [line] = warnings(train_stderr(tmp_path, POD_ARGS, manifest))
    assert line.startswith("warning: gs://bkt/mnist/manifest.json: " + problem)


def test_tpu_all_deletes_even_when_training_fails(tmp_path):
    """A real wheel build; the trainer on the host exits with 3."""
    env, log, _ = fake_cloud(tmp_path, running_polls=1, train_exit=3)
    proc = run_program("launch.tpu", "all", *TPU_ARGS, "--delete_after",
                      f"--dist_dir={tmp_path / 'd'}", "--no_build_isolation",
                      "--poll_seconds=0", env=env)
    assert proc.returncode == 3, proc.stderr
    assert "finished with exit status 3" in proc.stderr
    calls = [shlex.split(c) for c in log.read_text().splitlines()]
    assert [verb(c) for c in calls] == ["create", "describe", "scp", "ssh", "describe",
                                        "storage cat", "ssh", "describe", "ssh", "ssh",
                                        "describe", "delete"]
    assert (tmp_path / "d" / WHEEL).is_file()  # what scp copied was built


def test_tpu_all_deletes_when_setup_fails_but_not_when_create_fails(tmp_path):
    env, log, python = fake_cloud(tmp_path)
    fake_program(Path(env["PATH"].split(os.pathsep)[0]) / "gcloud", f"""
printf '%s\\n' "$4" >> {shlex.quote(str(log))}
case "$4" in scp) exit 5 ;; create) exit "${{CREATE_RC:-0}}" ;;
  describe) echo '{{"state": "READY", "labels": {{"{tc.MARK_KEY}": "{RUN_ID}"}}}}' ;; esac
""")
    argv = ["all", *TPU_ARGS, "--delete_after", f"--python={python}",
            f"--dist_dir={tmp_path / 'dist'}"]
    proc = run_program("launch.tpu", *argv, env=env)
    assert proc.returncode == 5
    calls = log.read_text().splitlines()
    assert calls[0] == "create" and calls[-3:] == ["scp", "describe", "delete"]
    log.unlink()
    proc = run_program("launch.tpu", *argv, env=dict(env, CREATE_RC="4"))
    assert proc.returncode == 4
    assert log.read_text().splitlines() == ["create"]


def test_tpu_dry_run_subprocess_prints_gcloud_commands():
    proc = run_program("launch.tpu", "all", *TPU_ARGS, "--dry_run")
    assert proc.returncode == 0, proc.stderr
    lines = [shlex.split(line) for line in proc.stdout.splitlines()]
    gcloud = [c for c in lines if c[0] == "gcloud"]
    assert [verb(c) for c in gcloud] == ["create", "describe", "scp", "ssh", "describe",
                                         "storage cat", "ssh", "describe", "ssh"]
    assert all("--worker=all" in c for c in gcloud[1:]
               if c[1] == "compute" and verb(c) != "describe")
    assert "--version=tpu-ubuntu2204-base" in gcloud[0]
    assert "--accelerator-type=v4-8" in gcloud[0]


# -------------------------------------------------------------- settings

def test_tpu_settings_from_environment():
    args, rest = lt.parse_args(["create"])
    cfg = lt.resolve_config(args, rest, environ={
        "TPU_NAME": "env-tpu", "TPU_ZONE": "europe-west4-a",
        "TPU_ACCELERATOR_TYPE": "v5litepod-8",
        "TPU_RUNTIME_VERSION": "tpu-vm-tf-2.19.0-pjrt"})
    [cmd] = tc.create_commands(cfg)
    flags = flag_values(cmd)
    assert cmd[5] == "env-tpu"
    assert flags["zone"] == "europe-west4-a"
    assert flags["accelerator-type"] == "v5litepod-8"
    assert flags["version"] == "tpu-vm-tf-2.19.0-pjrt"


def test_tpu_config_is_settled_once_and_frozen():
    """Every setting is resolved before the config is built: nothing later
    changes it (a step that needs another value makes a new one)."""
    cfg, _ = tpu_plan("all", "--epochs=2")
    assert (cfg.accelerator_type, cfg.multi_host, cfg.data) == ("v4-8", False, "gs://bkt/mnist")
    assert cfg.trainer_args == ("--epochs=2",)
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.data = "gs://other"  # type: ignore[misc]


@pytest.mark.parametrize("step,drop,message", [
    ("create", "--name", "--name is required"),
    ("create", "--zone", "--zone is required"),
    ("create", "--accelerator_type", "--accelerator_type is required"),
    ("train", "--data", "--data is required"),
    ("train", "--model_dir", "--model_dir is required"),
    ("delete", "--zone", "--zone is required"),
    ("logs", "--name", "--name is required"),
])
def test_tpu_missing_setting_is_a_clear_error(step, drop, message):
    args = [a for a in TPU_ARGS if not a.startswith(drop + "=")]
    proc = run_program("launch.tpu", step, *args, "--dry_run")
    assert proc.returncode == 2
    assert proc.stdout == ""
    assert len(proc.stderr.strip().splitlines()) == 1
    assert proc.stderr.startswith("error: " + message)


@pytest.mark.parametrize("step,extra,message", [
    ("train", ["--data=/local/mnist"], "--data must be a gs:// URI"),
    ("train", ["--accelerator_type=v4-32"], "v4-32 spans several hosts"),
    ("train", ["--accelerator_type=v4-32",
               "--runtime_version=tpu-ubuntu2204-base"],
     "v4-32 spans several hosts and needs a TensorFlow pod image"),
    ("train", ["--accelerator_type=tpu9-8"],
     "--accelerator_type 'tpu9-8' is not"),
    ("train", ["--tpu=other"], "--tpu is set by this launcher"),
    ("logs", ["--lines=0"], "--lines must be at least 1"),
    ("logs", ["--line=5"], "logs takes no trainer arguments, got --line=5"),
    ("wait", ["--wait_timeout=0"], "--wait_timeout must be positive"),
    ("all", ["--poll_seconds=-1"], "--poll_seconds must be 0 or more"),
])
def test_tpu_invalid_setting_is_a_clear_error(step, extra, message):
    keys = {e.split("=", 1)[0] for e in extra}
    args = [a for a in TPU_ARGS if a.split("=", 1)[0] not in keys]
    proc = run_program("launch.tpu", step, *args, *extra, "--dry_run")
    assert proc.returncode == 2
    assert proc.stdout == ""
    assert len(proc.stderr.strip().splitlines()) == 1
    assert proc.stderr.startswith("error: " + message)


@pytest.mark.parametrize("step, trainer_args, message", [
    ("all", ["--epoch=3"], "unrecognized arguments: --epoch=3; did you mean --epochs, "
                           "not --epoch? (see --help)"),
    ("run", ["--epochs=0"], "--epochs must be >= 1, not 0"),
    ("train", ["--preset=cpu", "--global_batch_size=0"],
     "--global_batch_size must be >= 1, not 0"),
])
def test_trainer_arguments_the_trainer_refuses_stop_the_launch_before_the_cloud(
        tmp_path, step, trainer_args, message):
    """The trainer's own parser answers here, before a TPU VM is created: the
    fake gcloud is never called."""
    env, log, python = fake_cloud(tmp_path)
    proc = run_program("launch.tpu", step, *TPU_ARGS, *trainer_args,
                      f"--python={python}", f"--dist_dir={tmp_path / 'd'}", env=env)
    assert proc.returncode == 2
    assert proc.stderr.splitlines() == [f"error: trainer arguments: {message}"]
    assert not log.exists()  # neither gcloud nor the wheel build ran


def test_tpu_all_interrupted_while_waiting_still_deletes(tmp_path):
    env, log, python = fake_cloud(tmp_path)
    gcloud = Path(env["PATH"].split(os.pathsep)[0]) / "gcloud"
    # Ctrl-C at the terminal reaches the launcher during the first check.
    gcloud.write_text(gcloud.read_text().replace(
        "    polls = pathlib.Path(",
        "    import os, signal\n"
        "    os.kill(os.getppid(), signal.SIGINT)\n"
        "    polls = pathlib.Path("))
    proc = run_program("launch.tpu", "all", *TPU_ARGS, "--delete_after",
                      f"--python={python}", f"--dist_dir={tmp_path / 'd'}",
                      env=env)
    assert proc.returncode == 130
    assert proc.stderr.strip().splitlines()[-1] == "error: mnist-launch-tpu: stopped by SIGINT"
    assert "Traceback" not in proc.stderr
    verbs = [verb(shlex.split(c)) for c in log.read_text().splitlines()
             if c.startswith("gcloud")]
    assert verbs == ["create", "describe", "scp", "ssh", "describe", "storage cat", "ssh",
                     "describe", "ssh", "describe", "delete"]


def start_launcher(argv: list[str], env: dict[str, str]) -> subprocess.Popen:
    return subprocess.Popen(program("launch.tpu", *argv),
                            cwd=REPO, env=env, stderr=subprocess.PIPE, text=True)


def until_called(log: Path, what: str) -> None:
    for _ in range(1200):  # a bound for a launcher that never gets there, not a speed bar
        if log.exists() and what in log.read_text():
            return
        time.sleep(0.05)
    raise AssertionError(f"never called: {what}")


def test_sigterm_during_a_gcloud_command_goes_to_it_and_stops_the_launcher(tmp_path):
    """``wait``: the status check gets the SIGTERM and dies of it, as gcloud
    does; the launcher says so in one line and exits 143."""
    env, log, _ = fake_cloud(tmp_path)
    gcloud = Path(env["PATH"].split(os.pathsep)[0]) / "gcloud"
    signalled = tmp_path / "gcloud.signal"
    gcloud.write_text(gcloud.read_text().replace(
        "    polls = pathlib.Path(",
        "    import signal, time\n"
        f"    signal.signal(signal.SIGTERM, lambda n, f: (pathlib.Path({str(signalled)!r})"
        ".write_text(str(n)), signal.signal(n, signal.SIG_DFL), os.kill(os.getpid(), n)))\n"
        f"    pathlib.Path({str(tmp_path / 'ready')!r}).touch()\n"
        "    time.sleep(300)\n"
        "    polls = pathlib.Path(").replace("import pathlib,", "import os, pathlib,"))
    proc = start_launcher(["wait", *TPU_ARGS], env)
    until_called(log, tc.STATUS_PREFIX)
    for _ in range(1200):  # as above
        if (tmp_path / "ready").exists():
            break
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 143, err
    assert signalled.read_text() == str(int(signal.SIGTERM))
    # gcloud said nothing; the launcher's line says why it stopped.
    assert err.splitlines()[-1] == "error: mnist-launch-tpu: stopped by SIGTERM"


def test_all_stopped_by_sighup_between_checks_deletes_the_vm(tmp_path):
    env, log, python = fake_cloud(tmp_path, running_polls=100)
    proc = start_launcher(["all", *TPU_ARGS, "--delete_after", "--poll_seconds=300",
                           f"--python={python}", f"--dist_dir={tmp_path / 'd'}"], env)
    until_called(log, tc.STATUS_PREFIX)
    proc.send_signal(signal.SIGHUP)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 129, err
    assert err.splitlines()[-1] == "error: mnist-launch-tpu: stopped by SIGHUP"
    assert "Traceback" not in err
    verbs = [verb(shlex.split(c)) for c in log.read_text().splitlines()
             if c.startswith("gcloud")]
    assert verbs == ["create", "describe", "scp", "ssh", "describe", "storage cat", "ssh",
                     "describe", "ssh", "describe", "delete"]


def test_setup_with_a_wheel_that_does_not_build_is_a_run_time_failure(tmp_path):
    env, log, _ = fake_cloud(tmp_path)
    python = fake_program(tmp_path / "failing-python", "exit 3\n")
    proc = run_program("launch.tpu", "setup", *TPU_ARGS, f"--python={python}",
                      f"--dist_dir={tmp_path / 'd'}", env=env)
    assert proc.returncode == 1
    assert proc.stderr.splitlines()[-1] == "error: building the project wheel failed (exit 3)"
    assert [verb(shlex.split(c)) for c in log.read_text().splitlines()] == [
        "describe"]  # nothing copied


# -------------------------------------------------------------- real cloud

def test_v5e_is_sent_as_the_tpu_apis_v5litepod(capsys):
    """The TPU API names v5e slices v5litepod-N and refuses v5e-N: the
    launcher sends v5litepod-N, says so in one line, and counts the slice's
    hosts as v5litepod's."""
    base = [a for a in TPU_ARGS if not a.startswith("--accelerator_type")]
    cfg, [cmd] = tpu_plan("create", "--accelerator_type=v5e-8", base=base)
    assert flag_values(cmd)["accelerator-type"] == "v5litepod-8"
    assert flag_values(cmd)["version"] == "v2-alpha-tpuv5-lite"
    assert capsys.readouterr().err == (
        "--accelerator_type v5e-8: sent as v5litepod-8, the TPU API's name for it\n")
    cfg, _ = tpu_plan("run", "--accelerator_type=v5e-16",
                      "--runtime_version=tpu-vm-tf-2.19.0-pod-pjrt", base=base)
    assert (cfg.accelerator_type, cfg.multi_host) == ("v5litepod-16", True)


def test_the_tpu_prerequisites_say_to_add_the_key_to_ssh_agent():
    """``tpu-vm ssh --worker=all`` needs gcloud's key in ssh-agent (gcloud's
    help for ``--worker``); docs/launch.md says so where it lists what the
    TPU VM launcher needs here."""
    text = (REPO / "docs" / "launch.md").read_text()
    section = text.split("## TPU VM", 1)[1].split("### Spot runs", 1)[0]
    [prerequisites] = [" ".join(p.split()) for p in section.split("\n\n")
                       if p.startswith("Prerequisites")]
    assert "--worker=all" in prerequisites
    assert "ssh-add ~/.ssh/google_compute_engine" in prerequisites
