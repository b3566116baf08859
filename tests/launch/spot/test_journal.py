"""The ``--events`` journal of ``mnist-launch-tpu run``: a damaged one, another
run's, one that cannot be written or that another launcher holds is refused
in one line before any gcloud call; a last line cut short by a kill is
dropped, and the next record starts on a line of its own."""

from __future__ import annotations

import fcntl
import json
import os

import pytest

from launch.tpu.spot import journal as spot_journal
from tests.helpers import read_only
from tests.launch.fake_cloud import FakeCloud
from tests.launch.helpers import RUN_ID, TPU_ARGS, run_program, fake_gcloud_env

RUN = {"name": "mnist-tpu", "zone": "us-central2-b", "project": None,
       "accelerator_type": "v4-8", "model_dir": "gs://bkt/runs/1", "queued": False,
       "run_id": RUN_ID}


@pytest.fixture
def launch(tmp_path):
    """``run`` with the fake gcloud on PATH; the cloud it would have used."""
    cloud = FakeCloud(tmp_path / "cloud")
    env = fake_gcloud_env(tmp_path, cloud.root)

    def launch(events):
        # Were the journal taken, the run would stop at its wheel build.
        proc = run_program("launch.tpu", "run", "--spot", *TPU_ARGS,
                          f"--events={events}", f"--dist_dir={tmp_path / 'dist'}",
                          "--python=false", "--poll_seconds=0.1", "--retry_seconds=5",
                          env=env)
        return proc, cloud
    return launch


def line(record: dict) -> bytes:
    return (json.dumps(record) + "\n").encode()


@pytest.mark.parametrize("content, problem", [
    (line({"event": "preempted", "recovery": "x", "step": 3}),
     'line 1: "recovery" is "x", not a whole number >= 1'),
    (b"\xff\xfe" + '{"event": "created"}\n'.encode("utf-16-le"),
     "line 1: not UTF-8 text (byte 1)"),
    (line({"event": "training", "hosts": 5}),
     'line 1: "hosts" is 5, not a list of host names'),
    (line({"event": "created"}) + b"{garbled\n" + line({"event": "created"}),
     "line 2: not a JSON object (Expecting property name enclosed in double quotes: "
     "line 1 column 2 (char 1))"),
    (line({"event": "created"}) + b"[3]\n", "line 2: list, not a JSON object"),
    (line({"event": "training", "step": -4}),
     'line 1: "step" is -4, not a whole number >= 0'),
    (line({"event": "preempted", "recovery": 1, "redo": [5, 2]}),
     'line 1: "redo" is [5, 2], not [least, most] steps'),
    (line({"message": "no event"}), 'line 1: no "event" name'),
    (line({"event": "created"}) + line({"event": "started", "run": {**RUN, "zone": "eu"}}),
     "line 2: the journal of another run, not yet ended (zone 'eu', not "
     "'us-central2-b'); pass another --events file, or end that run with its own command"),
    (line({"event": "created", "vm": "other-vm"}) + line({"event": "preempted", "recovery": 3}),
     "line 1: the journal of another run, not yet ended (name 'other-vm', not "
     "'mnist-tpu'); pass another --events file, or end that run with its own command"),
])
def test_a_damaged_or_foreign_journal_is_refused_before_any_gcloud_call(
        launch, tmp_path, content, problem):
    events = tmp_path / "events.jsonl"
    events.write_bytes(content)
    proc, cloud = launch(events)
    assert (proc.returncode, proc.stdout) == (2, "")
    assert proc.stderr == f"error: {events}: {problem}\n"
    assert cloud.calls() == [] and events.read_bytes() == content


@pytest.mark.parametrize("make, problem", [
    (lambda p: p.mkdir(), "a directory, not a journal file (--events)"),
    (lambda p: os.mkfifo(p), "not a regular file (--events)"),
])
def test_a_journal_that_is_not_a_file_is_refused(launch, tmp_path, make, problem):
    events = tmp_path / "events"
    make(events)
    proc, cloud = launch(events)
    assert proc.returncode == 2 and proc.stderr == f"error: {events}: {problem}\n"
    assert cloud.calls() == []


def test_a_journal_that_cannot_be_written_is_refused(launch, tmp_path):
    (tmp_path / "a-file").write_text("")
    events = tmp_path / "a-file" / "events.jsonl"
    proc, cloud = launch(events)
    assert proc.returncode == 2 and proc.stderr == (
        f"error: {events}: cannot open the journal for writing (Not a directory)\n")
    assert cloud.calls() == []


def test_a_journal_in_a_read_only_folder_is_refused(launch, tmp_path):
    folder = tmp_path / "ro"
    folder.mkdir()
    with read_only(folder):
        proc, cloud = launch(folder / "events.jsonl")
    assert proc.returncode == 2 and "cannot open the journal for writing" in proc.stderr
    assert cloud.calls() == []


def test_a_journal_another_launcher_holds_is_refused(launch, tmp_path):
    events = tmp_path / "events.jsonl"
    events.write_bytes(line({"event": "started", "run": RUN}))
    with open(events, "a") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        proc, cloud = launch(events)
    assert proc.returncode == 1 and proc.stderr == (
        f"error: {events}: in use by another launcher of this run; let it end, or pass "
        "another --events file\n")
    assert cloud.calls() == []


# ------------------------------------------------- read by the launcher

def opened(path, run=RUN):
    journal, standing = spot_journal.Journal.open(path, run)
    return journal, standing


def test_a_torn_last_line_is_dropped_and_the_next_record_starts_a_line(tmp_path, capsys):
    """A kill while a record was written: the records before it count, the
    fragment is cut off, and the next record is a line of its own."""
    events = tmp_path / "events.jsonl"
    whole = line({"event": "started", "run": RUN}) + line(
        {"event": "preempted", "recovery": 1, "step": 12})
    events.write_bytes(whole + b'{"event": "deleted", "mess\xc3')  # cut in a character
    journal, standing = opened(events)
    try:
        assert standing.recoveries == 1 and standing.lost_noted
        assert capsys.readouterr().err == (
            f"warning: {events}: line 3: an unfinished last line (a write cut short by a "
            "kill), dropped\n")
        journal.append({"event": "created"})
    finally:
        journal.close()
    assert events.read_bytes() == whole + b'{"event": "created"}\n'


def test_a_whole_last_record_without_its_newline_is_kept(tmp_path):
    events = tmp_path / "events.jsonl"
    events.write_bytes(line({"event": "started", "run": RUN}) +
                       b'{"event": "preempted", "recovery": 2}')
    journal, standing = opened(events)
    journal.append({"event": "deleted"})
    journal.close()
    assert standing.recoveries == 2
    assert events.read_bytes().endswith(b'"recovery": 2}\n{"event": "deleted"}\n')


def test_a_last_line_that_is_no_record_is_refused_not_dropped(tmp_path):
    events = tmp_path / "events.jsonl"
    events.write_bytes(b"\xff\xfe")
    with pytest.raises(spot_journal.JournalError, match=r"line 1: not UTF-8 text"):
        opened(events)
    assert events.read_bytes() == b"\xff\xfe"


def test_another_runs_journal_is_taken_once_that_run_ended(tmp_path):
    events = tmp_path / "events.jsonl"
    events.write_bytes(line({"event": "started", "run": {**RUN, "name": "other"}})
                       + line({"event": "preempted", "recovery": 1})
                       + line({"event": "finished"}))
    journal, standing = opened(events)
    journal.close()
    assert standing.recoveries == 0 and standing.run is None


OTHER_HOST = {"event": "training", "hosts": ["other-teams-vm-w-0"]}


@pytest.mark.parametrize("records, problem", [
    ([{"event": "started", "run": {}}, OTHER_HOST, {"event": "deleted"}],
     'line 1: "started" does not name its run (no name, zone, project, accelerator_type, '
     "model_dir, queued, run_id)"),
    ([OTHER_HOST, {"event": "deleted"}],
     'line 1: a run that no "started" line names before it, so not known to be this run'),
    ([{"event": "finished"}, OTHER_HOST, {"event": "started", "run": RUN}],
     'line 2: a run that no "started" line names before it, so not known to be this run'),
    ([{"event": "started", "run": {k: v for k, v in RUN.items() if k != "run_id"}}, OTHER_HOST],
     'line 1: "started" does not name its run (no run_id)'),
])
def test_a_journal_that_does_not_name_this_run_is_refused(launch, tmp_path, records, problem):
    """Its dead hosts would let this run's trainer take over another's lock."""
    events = tmp_path / "events.jsonl"
    content = b"".join(line(r) for r in records)
    events.write_bytes(content)
    proc, cloud = launch(events)
    assert (proc.returncode, proc.stdout) == (2, "")
    assert proc.stderr == f"error: {events}: {problem}; pass another --events file\n"
    assert cloud.calls() == [] and events.read_bytes() == content


def test_a_file_whose_one_line_starts_a_record_is_not_a_journal(launch, tmp_path):
    """Not a cut-short last record of a journal: there is no journal before it."""
    events = tmp_path / "notes.txt"
    events.write_bytes(b'{"these": "are my notes, not a journal"')
    proc, cloud = launch(events)
    assert (proc.returncode, proc.stdout) == (2, "")
    assert proc.stderr == (f"error: {events}: line 1: not a journal: no whole record, only "
                           "the start of one (--events)\n")
    assert cloud.calls() == [] and events.read_bytes() == b'{"these": "are my notes, not a journal"'


def test_a_run_id_that_is_no_label_value_is_refused(tmp_path):
    """A launcher without --run_id takes its journal's run id: one that no
    VM could carry as its label is refused."""
    events = tmp_path / "events.jsonl"
    events.write_bytes(line({"event": "started", "run": {**RUN, "run_id": "Not A Label"}}))
    mine = {k: v for k, v in RUN.items() if k != "run_id"}
    with pytest.raises(spot_journal.JournalError, match=r'line 1: "run_id" is "Not A Label", '
                       "not a run id; pass another --events file$"):
        opened(events, run=mine)
