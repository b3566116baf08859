"""One writer per output: the lock, its heartbeat and takeover, and two real racing jobs."""

import json
import logging
import os
import re
import subprocess
import sys
import time
import uuid

import pytest

from mnist_common import storage_lock
from pipeline import options
from pipeline.publish import lock
from pipeline.errors import PipelineInputError
from pipeline.publish.output import prepared_output
from pipeline.verify import verify
from tests.helpers import EMULATOR_BUCKET, REPO, locks_judged_later, run_job

HOLDER = re.compile(r"locked by run (\w+) \(host (\S+), pid (\d+), started "
                    r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ, heartbeat \d+s ago\)")


def gcs_output(name):
    return f"gs://{EMULATOR_BUCKET}/locks/{name}-{uuid.uuid4().hex[:8]}"


@pytest.fixture(params=["local", "gcs"])
def output(request, tmp_path):
    if request.param == "local":
        out = tmp_path / "out"
        out.mkdir()
        return str(out)
    request.getfixturevalue("gcs_emulator")
    return gcs_output("unit")


def dead_pid():
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    process.wait()
    return process.pid


def plant_lock(output, **fields):
    """Writes a lock as another run would have left it."""
    now = time.time()
    info = {"run_id": "other", "host": "elsewhere", "pid": 1, "started": now,
            "heartbeat": now, **fields}
    path = f"{output}/{lock.LOCK_FILE}"
    if output.startswith("gs://"):
        from pipeline import storage
        storage.write_bytes(path, json.dumps(info).encode())
    else:
        with open(path, "w") as f:
            json.dump(info, f)
        os.utime(path, (info["heartbeat"], info["heartbeat"]))


def test_second_run_refused_naming_the_holder_until_released(output):
    held = lock.acquire(output, "first")
    with pytest.raises(PipelineInputError) as refused:
        lock.acquire(output, "second")
    message = str(refused.value)
    assert message.startswith(f"{output}: locked by run first")
    run, host, pid = HOLDER.search(message).groups()
    assert (run, pid) == ("first", str(os.getpid()))
    held.release()
    lock.acquire(output, "second").release()


def test_live_holder_on_another_host_is_not_taken_over(output):
    plant_lock(output, heartbeat=time.time() - 30)
    with pytest.raises(PipelineInputError, match=r"locked by run other \(host elsewhere"):
        lock.acquire(output, "mine")


def test_a_holders_host_cannot_split_the_error_line(tmp_path, capsys):
    """The lock's host is another run's text: shown escaped, on the one line."""
    from pipeline.__main__ import main
    out = tmp_path / "out"
    out.mkdir()
    plant_lock(str(out), host="vm\nerror: all good")
    assert main(["--source=synthetic:10", f"--output={out}"]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {out}: locked by run other "
                                                   "(host 'vm\\nerror: all good', pid 1"), lines


@pytest.mark.parametrize("holder", ["pid gone on this host", "heartbeat too old"])
def test_dead_holder_is_taken_over_with_a_warning(output, holder, caplog):
    import socket
    if holder == "pid gone on this host":
        plant_lock(output, host=socket.gethostname(), pid=dead_pid())
    else:
        old = time.time() - lock.STALE_SECONDS - 60
        plant_lock(output, started=old, heartbeat=old)
    # On gs:// the lock's age is its update time (just now): judged that much later.
    later = lock.STALE_SECONDS + 60 if holder != "pid gone on this host" and \
        output.startswith("gs://") else 0
    with caplog.at_level(logging.WARNING), locks_judged_later(later):
        held = lock.acquire(output, "mine")
    assert "taking over the lock of run other" in caplog.text
    with pytest.raises(PipelineInputError, match="locked by run mine"):
        lock.acquire(output, "third")
    held.release()


def test_heartbeat_refreshes_and_never_overwrites_a_taken_lock(output, monkeypatch):
    held = lock.acquire(output, "mine")
    first = held._backend.read()
    time.sleep(0.05)
    held.refresh()
    second = held._backend.read()
    assert second[1] != first[1], "the heartbeat did not change the lock"
    held.check_held()
    # Another run takes the lock over (as if ours were judged dead): our refresh
    # must fail instead of replacing it, and we must not publish.
    assert held._backend.delete_if(second[1])
    plant_lock(output, run_id="thief")
    held.refresh()
    assert held.lost
    with pytest.raises(PipelineInputError, match="lost its lock"):
        held.check_held()
    held.release()  # must leave the thief's lock alone
    assert b"thief" in held._backend.read()[0]


def test_heartbeat_thread_keeps_the_lock_fresh(tmp_path, monkeypatch):
    monkeypatch.setattr(storage_lock, "HEARTBEAT_SECONDS", 0.05)
    held = lock.acquire(str(tmp_path), "mine")
    path = tmp_path / lock.LOCK_FILE
    os.utime(path, (1, 1))
    deadline = time.monotonic() + 30
    while path.stat().st_mtime < 2 and time.monotonic() < deadline:
        time.sleep(0.02)
    held.release()
    assert not path.exists()
    assert time.monotonic() < deadline, "heartbeat never refreshed the lock"


def test_stale_temp_folders_removed_only_under_the_lock(tmp_path, caplog):
    """Empty and non-empty temp folders of lock-less runs go; a locked output is left alone."""
    out = tmp_path / "out"
    (out / ".incomplete-empty").mkdir(parents=True)
    (out / ".incomplete-full" / "spill").mkdir(parents=True)
    (out / ".incomplete-full" / "spill" / "x").write_bytes(b"1")
    live = lock.acquire(str(out), "live")
    with pytest.raises(PipelineInputError, match="locked by run live"):
        with prepared_output(options.parse([f"--output={out}"]), "next"):
            pass
    assert sorted(p.name for p in out.iterdir()) == [
        ".incomplete-empty", ".incomplete-full", ".lock"]
    live.release()
    with caplog.at_level(logging.WARNING):
        with prepared_output(options.parse([f"--output={out}"]), "next"):
            pass
    assert sorted(p.name for p in out.iterdir()) == [".incomplete-next"]
    assert caplog.text.count("left by an earlier run") == 2


def test_job_releases_its_lock_on_success_and_failure(tmp_path, idx_dir):
    out = tmp_path / "out"
    run_job([f"--source={idx_dir}", f"--output={out}"])
    assert not (out / lock.LOCK_FILE).exists()
    with pytest.raises(PipelineInputError, match="already holds a dataset"):
        run_job([f"--source={idx_dir}", f"--output={out}"])
    assert not (out / lock.LOCK_FILE).exists()


# Two real `python -m pipeline` processes on one output.

def start(output, source, *flags, env=None):
    return subprocess.Popen(
        [sys.executable, "-m", "pipeline", f"--source={source}", f"--output={output}",
         "--runner=DirectRunner", *flags],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "NO_GCE_CHECK": "True", **(env or {})})


def lock_exists(output):
    if output.startswith("gs://"):
        from pipeline import storage
        return storage.exists(f"{output}/{lock.LOCK_FILE}")
    return os.path.exists(os.path.join(output, lock.LOCK_FILE))


def wait_for(path, process):
    deadline = time.monotonic() + 300
    while not os.path.exists(path):
        assert process.poll() is None, process.communicate()[1][-2000:]
        assert time.monotonic() < deadline, "the first run never reached its step"
        time.sleep(0.05)


def train_count(stdout):
    return int(re.search(r"train: (\d+) examples", stdout).group(1))


def check_second_refused(first, second, output, first_count):
    out2, err2 = second.communicate(timeout=300)
    out1, err1 = first.communicate(timeout=300)
    assert first.returncode == 0, err1[-3000:]
    assert train_count(out1) == first_count
    assert second.returncode == 2, err2[-3000:]
    errors = [line for line in err2.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "Traceback" not in err2, err2[-3000:]
    assert HOLDER.search(errors[0]), errors[0]
    assert verify(output).split("train").num_examples == first_count
    assert not lock_exists(output)


@pytest.mark.slow
@pytest.mark.parametrize("where", ["local", "gcs"])
@pytest.mark.parametrize("overwrite", [False, True])
def test_second_process_refused_while_first_runs(tmp_path, idx_dir, request, where,
                                                 overwrite):
    if where == "gcs":
        request.getfixturevalue("gcs_emulator")
        output = gcs_output("race")
    else:
        output = str(tmp_path / "out")
    flags = ["--overwrite"] if overwrite else []
    if overwrite:  # an earlier dataset there (written in this process)
        run_job([f"--source={idx_dir}", f"--output={output}"])
    # The first run is held in the middle of its publish (journal written, shards
    # being moved) until the second has been refused.
    gate = str(tmp_path / "gate")
    first = start(output, "synthetic:2000", "--min_shards=2", "--allow_extreme_sharding",
                  *flags, env={"PIPELINE_FAULT": "wait@journal-written",
                               "PIPELINE_FAULT_GATE": gate})
    wait_for(gate + ".reached", first)
    second = start(output, idx_dir, *flags)
    second.wait(timeout=300)
    open(gate, "w").close()
    check_second_refused(first, second, output, 2000)


@pytest.mark.slow
@pytest.mark.parametrize("order", ["big first", "small first"])
def test_racing_runs_never_both_report_success(tmp_path, order):
    """Started together with different sources and no --overwrite: one wins, one refuses."""
    output = str(tmp_path / "out")
    sources = {"big": "synthetic:6000", "small": "synthetic:3000"}
    names = ["big", "small"] if order == "big first" else ["small", "big"]
    processes = {name: start(output, sources[name]) for name in names}
    results = {name: p.communicate(timeout=300) for name, p in processes.items()}
    winners = [n for n, p in processes.items() if p.returncode == 0]
    assert len(winners) == 1, {n: (p.returncode, results[n][1][-1500:])
                               for n, p in processes.items()}
    loser = next(n for n in names if n not in winners)
    assert processes[loser].returncode == 2
    last = results[loser][1].strip().splitlines()[-1]
    assert HOLDER.search(last) or "already holds a dataset" in last, last
    reported = train_count(results[winners[0]][0])
    assert reported == int(sources[winners[0]].split(":")[1])
    assert verify(output).split("train").num_examples == reported
