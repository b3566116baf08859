"""The spot run's loop against a scripted cloud (`tests.launch.spot.scripted`):
how it retries refused creates, what it says a preemption cost, which events
it reports at each ending, and that it ends once. No clock: the run's waits
are recorded, not slept."""

from __future__ import annotations

import io
import json
import os
import signal

import pytest

from launch import wheel as lw
from launch.tpu.spot import decide as sd
from launch.tpu.spot import events as spot_events
from launch.tpu.spot import runner as spot_runner
from tests.launch.helpers import tpu_plan
from tests.launch.spot.scripted import ScriptedCloud, kinds, loop, progress

STOCKOUT = (1, "", "ERROR: RESOURCE_EXHAUSTED: There is no more capacity in the zone")
# The trainer's checkpoints: every 6 steps, 22-step epochs (66 steps in 3).
CADENCE = ("--loop=custom", "--checkpoint_every=6", "--epochs=3")


# ------------------------------------------------- refused creates

def test_refused_creates_back_off_and_end_after_retry_seconds(tmp_path):
    """Every create refused, each refusal followed by a describe that says
    NOT_FOUND: the waits still double (1, 2, 4 s, up to --poll_seconds) and
    the run ends 255 once creates were refused for --retry_seconds."""
    sleeps = []
    cloud = ScriptedCloud([], creates=[STOCKOUT] * 100)
    code, out = loop(cloud, tmp_path, "--poll_seconds=60", "--retry_seconds=5",
                     sleeps=sleeps)
    assert code == 255
    assert sleeps == [1, 2, 4]
    assert cloud.calls.count("create") == 3
    assert "lost: mnist-tpu: every create was refused for 7 s (--retry_seconds)" in out


def test_refusals_wait_at_most_the_poll(tmp_path):
    sleeps = []
    cloud = ScriptedCloud([], creates=[STOCKOUT] * 100)
    code, _ = loop(cloud, tmp_path, "--poll_seconds=3", "--retry_seconds=20", sleeps=sleeps)
    assert code == 255 and sleeps == [1, 2, 3, 3, 3, 3, 3, 3]


def test_a_create_that_succeeds_ends_the_refusals(tmp_path):
    """Two refusals, then a VM that trains through two 60 s waits: the
    refusals before it count no more toward --retry_seconds."""
    sleeps = []
    cloud = ScriptedCloud(["GONE", "GONE", "GONE", "READY", "READY", "READY", "READY"],
                          [progress("not started"), progress("running", step=2),
                           progress("running", step=4), progress("exited", 0, 66)],
                          creates=[STOCKOUT, STOCKOUT])
    code, out = loop(cloud, tmp_path, "--poll_seconds=60", "--retry_seconds=5",
                     sleeps=sleeps)
    assert code == 0, out
    assert sleeps == [1, 2, 60, 60]
    assert kinds(out).count("no capacity") == 2 and "created" in kinds(out)


# ------------------------------------------------- what a preemption cost

@pytest.mark.parametrize("seen, resumed, cleanly, gap, least, most, text", [
    (None, 6, False, 6, 0, 6, "at most 6"),
    (10, 6, False, 6, 4, 6, "4 to 6"),
    (30, 30, True, 6, 0, 0, "0"),
    (12, 6, True, 6, 6, 6, "6"),
    (30, 6, False, 6, 24, None, "at least 24"),  # the newest checkpoint was skipped
    (None, 6, False, None, 0, None, "unknown"),
    (8, None, False, 6, 0, 6, "at most 6"),
])
def test_what_is_known_of_the_steps_trained_again(seen, resumed, cleanly, gap, least,
                                                  most, text):
    redo = sd.redo_after(seen, resumed, cleanly, gap)
    assert (redo.least, redo.most, redo.text()) == (least, most, text)


@pytest.mark.parametrize("total, epochs, every, per_call, keras, gap", [
    (66, 3, 6, 2, False, 6), (66, 3, 0, 2, False, 22), (66, 3, 10, 4, True, 13),
    (66, 3, 40, 4, False, 22), (None, 3, 6, 2, False, 6), (None, 3, 0, 50, True, None)])
def test_the_most_steps_between_two_checkpoints(total, epochs, every, per_call, keras, gap):
    assert sd.checkpoint_gap(total, epochs, every, per_call, keras) == gap


def hard_preemption(seen_step):
    """A VM whose trainer runs (the launcher saw ``seen_step``, or no step),
    then PREEMPTED without notice; the next trainer resumes at step 6."""
    states = ["READY", "READY", "PREEMPTED", "PREEMPTED", "GONE", "GONE",
              "READY", "READY", "READY", "READY", "GONE"]
    trainers = [progress("not started"), progress("running", step=seen_step),
                progress("not started"), progress("running", step=8, resumed=6),
                progress("exited", 0, 66)]
    return ScriptedCloud(states, trainers)


@pytest.mark.parametrize("seen_step, said", [
    (None, "at most 6"),   # preempted before the launcher saw a step
    (10, "4 to 6")])        # steps 7-10 seen, and up to 2 more unseen
def test_a_hard_preemption_reports_what_is_known_of_its_cost(tmp_path, seen_step, said):
    code, out = loop(hard_preemption(seen_step), tmp_path, *CADENCE)
    assert code == 0, out
    assert f"resumed at step 6; {said} step(s) trained again" in out
    assert out.splitlines()[-1].split(" ", 1)[1].startswith(
        f"summary: 1 recoveries; steps trained again after each preemption: {said}; ")


def test_the_summary_bounds_a_preemption_whose_resume_was_not_seen(tmp_path):
    """Preempted again before the new trainer was seen resuming: the
    checkpoint gap still bounds the first preemption's cost."""
    states = ["READY", "READY", "PREEMPTED", "PREEMPTED", "GONE", "GONE", "READY",
              "PREEMPTED", "PREEMPTED", "GONE", "GONE", "READY", "READY", "READY", "GONE"]
    trainers = [progress("not started"), progress("running", step=10),
                progress("not started"), progress("not started"),
                progress("exited", 0, 66, resumed=12)]
    code, out = loop(ScriptedCloud(states, trainers), tmp_path, *CADENCE)
    assert code == 0, out
    assert "steps trained again after each preemption: at most 6, at most 6; " in out


# ------------------------------------------------- endings

def test_max_recoveries_0_reports_the_preemption_it_gives_up_on(tmp_path):
    events = tmp_path / "events.jsonl"
    cloud = ScriptedCloud(["READY", "READY", "PREEMPTED", "PREEMPTED"],
                          [progress("not started"), progress("running", step=4)])
    code, out = loop(cloud, tmp_path, "--max_recoveries=0", events=events)
    assert code == 75
    assert kinds(out)[-4:] == ["preempted", "deleted", "gave up", "summary"]
    assert ("preempted: mnist-tpu: the VM is PREEMPTED; --max_recoveries=0 reached; "
            "preempted at step 4; not recovered") in out
    records = [json.loads(line) for line in events.read_text().splitlines()]
    [preempted] = [r for r in records if r["event"] == "preempted"]
    assert "recovery" not in preempted and preempted["step"] == 4
    assert records[-1]["recoveries"] == 0


@pytest.mark.parametrize("creates, interrupt_at, code", [
    ([(1, "", "ERROR: INVALID_ARGUMENT: bad accelerator")], None, 1),
    ([STOCKOUT] * 9, None, 255),
    ([], 1, 130)])  # Ctrl-C at the first describe
def test_deleted_is_said_only_of_a_vm_that_existed(tmp_path, creates, interrupt_at, code):
    class Cloud(ScriptedCloud):
        def vm_state(self):
            if len(self.calls) + 1 == interrupt_at:
                self.calls.append("describe")
                raise KeyboardInterrupt
            return super().vm_state()
    cloud = Cloud([], creates=creates)
    got, out = loop(cloud, tmp_path, "--retry_seconds=5", sleeps=[])
    assert got == code, out
    assert "deleted" not in kinds(out) and "delete" not in cloud.calls
    assert kinds(out)[-1] == "summary"


class SignalAtSummary(io.StringIO):
    """The run's output; Ctrl-C reaches the launcher as it prints its
    (first) summary."""

    def write(self, text):
        written = super().write(text)
        if " summary: " in text and " summary: " not in self.getvalue()[:-len(text)]:
            os.kill(os.getpid(), signal.SIGINT)
        return written


def test_a_signal_once_the_run_ends_does_not_end_it_again(tmp_path):
    cloud = ScriptedCloud(["READY", "READY", "GONE"], [progress("exited", 0, 66)])
    code, out = loop(cloud, tmp_path, out=SignalAtSummary())
    assert code == 0
    assert kinds(out)[-3:] == ["deleted", "finished", "summary"]
    assert kinds(out).count("summary") == 1


def test_a_hangup_the_launcher_was_started_ignoring_leaves_the_run_going(tmp_path):
    """Under ``nohup`` (SIGHUP ignored) a closed terminal's SIGHUP, here as
    the run asks after its trainer, neither ends the run nor deletes its VM."""
    class HungUp(ScriptedCloud):
        def trainer(self):
            os.kill(os.getpid(), signal.SIGHUP)
            return super().trainer()
    cloud = HungUp(["READY", "READY", "READY", "GONE"],
                   [progress("training", None, 30), progress("exited", 0, 66)])
    previous = signal.signal(signal.SIGHUP, signal.SIG_IGN)
    try:
        code, out = loop(cloud, tmp_path)
        assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGHUP, previous)
    assert code == 0, out
    assert "interrupted" not in kinds(out)
    assert kinds(out)[-3:] == ["deleted", "finished", "summary"]
    assert cloud.calls.count("status") == 2


def test_a_wheel_that_does_not_build_costs_no_vm(tmp_path):
    class Cloud(ScriptedCloud):
        def build_wheel(self):
            super().build_wheel()
            lw.check_wheel_build(1, tmp_path / "no.whl")
    cloud = Cloud(["GONE", "READY"], [progress("not started")])
    code, out = loop(cloud, tmp_path)
    assert code == 1 and "create" not in cloud.calls  # a run-time failure
    assert kinds(out)[-2:] == ["failed", "summary"]


def test_a_trainer_log_that_cannot_be_copied_is_a_warning(tmp_path, capsys):
    class Cloud(ScriptedCloud):
        def fetch_log(self, dest):
            super().fetch_log(dest)
            raise PermissionError(13, "Permission denied")
    cloud = Cloud(["READY", "READY", "GONE"], [progress("exited", 3, 10)])
    code, out = loop(cloud, tmp_path)
    assert code == 3 and cloud.calls[-3:] == ["describe", "delete", "describe"]
    assert "warning: the trainer's log was not copied" in capsys.readouterr().err
    assert kinds(out)[-2:] == ["failed", "summary"]


def test_a_journal_that_can_no_longer_be_written_is_a_warning(tmp_path, capsys):
    """The disk fills mid-run: the run goes on and ends as it would."""
    class FullDisk:
        def append(self, record):
            raise OSError(28, "No space left on device")
    out = io.StringIO()
    cloud = ScriptedCloud(["READY", "READY", "GONE"], [progress("exited", 0, 66)])
    cfg, _ = tpu_plan("run", "--poll_seconds=1")
    run = spot_runner.SpotRun(cfg, cloud, spot_events.Events(FullDisk(), out=out),
                              spot_events.Standing(), sleep=lambda s: None)
    assert run.run() == 0
    assert kinds(out.getvalue())[-2:] == ["finished", "summary"]
    assert capsys.readouterr().err == (
        "warning: the journal was not written from here on "
        "([Errno 28] No space left on device)\n")


# ------------------------------------------------- answers that change nothing

class Timeline(list):
    """The run's waits, each also written into the cloud's calls, so the
    calls show where the run slept."""

    def __init__(self, cloud):
        super().__init__()
        self.cloud = cloud

    def append(self, seconds):
        self.cloud.calls.append(f"sleep {seconds:g}")
        super().append(seconds)


def slept_between(calls, name):
    """Whether the run slept between every two ``name`` calls."""
    at = [i for i, call in enumerate(calls) if call == name]
    return all(any(c.startswith("sleep ") for c in calls[a:b]) for a, b in zip(at, at[1:]))


def test_a_delete_that_answers_done_but_keeps_the_vm_ends_the_run(tmp_path, capsys):
    """Every delete exits 0 and describe still says READY: the run sleeps
    between two deletes and ends by itself at --retry_seconds, exit 255,
    with one line naming the VM left."""
    class KeptVm(ScriptedCloud):
        def vm_state(self):
            self.call("describe")
            return "READY"
    cloud = KeptVm([], [progress("exited", 0, 66)])
    code, out = loop(cloud, tmp_path, "--retry_seconds=30", sleeps=Timeline(cloud))
    assert code == 255, out
    assert cloud.calls.count("delete") >= 2 and slept_between(cloud.calls, "delete")
    assert capsys.readouterr().err.splitlines() == [
        "error: mnist-tpu could not be deleted in 30 s (--retry_seconds); delete it "
        "yourself: gcloud compute tpus tpu-vm delete mnist-tpu --quiet --zone=us-central2-b"]
    assert kinds(out)[-2:] == ["finished", "summary"] and "deleted" not in kinds(out)


def test_a_create_that_answers_done_but_makes_no_vm_backs_off_and_ends(tmp_path):
    """Every create exits 0 and describe still says NOT_FOUND: each create
    after the first waits as a refusal does, and the run ends 255 once
    creates made nothing for --retry_seconds."""
    cloud = ScriptedCloud([])
    code, out = loop(cloud, tmp_path, "--poll_seconds=60", "--retry_seconds=5",
                     sleeps=Timeline(cloud))
    assert code == 255, out
    assert cloud.calls.count("create") >= 2 and slept_between(cloud.calls, "create")
    assert "yet describe finds no VM" in out and kinds(out)[-2:] == ["lost", "summary"]


def test_a_trainer_start_that_leaves_no_trainer_ends_the_run(tmp_path, capsys):
    """Setup and the trainer's start exit 0, yet the status check says no
    trainer was started: the run does not set up again and again, it ends
    1 and deletes the VM."""
    cloud = ScriptedCloud(["READY", "READY", "READY", "GONE"],
                          [progress("not started"), progress("not started")])
    code, out = loop(cloud, tmp_path)
    assert code == 1, out
    assert cloud.calls.count("install") == 1 and cloud.calls[-2:] == ["delete", "describe"]
    assert capsys.readouterr().err.splitlines()[-1] == (
        "error: mnist-tpu: the trainer start answered done, yet the status check "
        "finds no trainer there (~/mnist-tpu/train.pid missing)")


# ------------------------------------------------- queued resources

def test_a_queued_resource_whose_vm_is_gone_is_deleted_and_created_again(tmp_path):
    """ACTIVE, its VM NOT_FOUND (the VM lost): the queued resource, which
    holds the name, is deleted before the next create, and the loss is a
    recovery."""
    node_gone = sd.queued_vm_state("ACTIVE", sd.GONE)
    states = ["READY", "READY", node_gone, node_gone, sd.GONE, sd.GONE,
              "READY", "READY", sd.GONE]
    trainers = [progress("not started"), progress("running", step=4),
                progress("not started"), progress("exited", 0, 66, resumed=0)]
    cloud = ScriptedCloud(states, trainers)
    code, out = loop(cloud, tmp_path, "--queued", "--spot")
    assert code == 0, out
    assert cloud.calls.count("create") == 1
    assert "delete" in cloud.calls[:cloud.calls.index("create")]
    assert "the VM is gone (its queued resource is still ACTIVE)" in out
    assert "recovered: mnist-tpu: training again (1 of 5)" in out


def test_a_queued_resource_whose_vm_was_never_seen_is_replaced():
    assert sd.decide(sd.NODE_GONE, sd.Trainer(sd.UNASKED), sd.Tally()).action == sd.REPLACE


def test_refused_queued_creates_do_not_advise_queued(tmp_path):
    cloud = ScriptedCloud([], creates=[STOCKOUT] * 100)
    code, out = loop(cloud, tmp_path, "--queued", "--retry_seconds=5", sleeps=[])
    assert code == 255
    assert "(--retry_seconds); try another zone" in out and "--queued" not in out


def test_a_vm_shown_again_after_describe_said_gone_is_not_removed_in_a_tight_loop(tmp_path,
                                                                                 capsys):
    """Describe says PREEMPTED, then (after the delete) NOT_FOUND, then
    PREEMPTED again, on and on, with no create between: the run sleeps
    between two deletes and ends 255 after --retry_seconds."""
    class Flapping(ScriptedCloud):
        def vm_state(self):
            self.call("describe")
            if self.states:
                return self.states.pop(0)
            return sd.GONE if self.calls[-2:-1] == ["delete"] else "PREEMPTED"
    cloud = Flapping(["READY"], [progress("running", step=4)])
    code, out = loop(cloud, tmp_path, "--retry_seconds=30", sleeps=Timeline(cloud))
    assert code == 255, out
    assert cloud.calls.count("delete") >= 2 and slept_between(cloud.calls, "delete")
    assert "create" not in cloud.calls
    assert ("error: mnist-tpu: describe still shows mnist-tpu PREEMPTED 30 s after it "
            "said it was gone (--retry_seconds)") in capsys.readouterr().err
