"""``mnist-launch-tpu run --spot`` through three preemptions, against the fake cloud.

The chaos run is preempted during setup, at a random step (SIGTERM: the
trainer saves and stops within the grace period) and during a checkpoint
save (SIGKILL right after SIGTERM: the save is cut short). It must end 0
with three recoveries reported, and its final checkpoint, export and
metrics.json must equal those of an uninterrupted run of the trainer
command the fake VM runs: the weights bit for bit. No two VMs are ever
alive at once and none is left. The cloud also refuses two creates as a
stockout and one ssh call as an unreachable host; both are retried.
``SPOT_CHAOS_SEED`` picks the steps (the test prints the seed it used).
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import threading

import numpy as np
import pytest

from tests.helpers import EMULATOR_BUCKET, REPO
from tests.launch.spot.helpers import (RUN_SECONDS, TOTAL_STEPS, TRAINER_ARGS, Chaos, World,
                                        random_schedule)

# A hang bound, not a speed bar: the test took 119 s with the machine's load at 2-4.5.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]


def uninterrupted(world: World, label: str) -> threading.Thread:
    """The trainer command the fake VM runs (the TPU flags as it rewrites
    them), run once without interruption, in a thread. Not `GcsTlsServer.run`,
    which stops at the first error the server logs: the chaos run's killed
    trainers leave broken pipes there meanwhile (the ``world`` fixture lets
    only those through)."""
    args = [sys.executable, "-m", "trainer", "--strategy=default", f"--data={world.data}",
            f"--model_dir={world.model_dir(label)}", *TRAINER_ARGS]
    result = {}

    def run():
        result["proc"] = subprocess.run(args, env=world.server.env(), cwd=REPO,
                                        capture_output=True, text=True, timeout=RUN_SECONDS)
    thread = threading.Thread(target=run, daemon=True)
    thread.result = result
    thread.start()
    return thread


def download(world: World, label: str, folder, dest) -> None:
    prefix = world.model_dir(label).removeprefix(f"gs://{EMULATOR_BUCKET}/") + "/" + folder
    for blob in world.server.emulator.client().list_blobs(EMULATOR_BUCKET, prefix=prefix):
        target = dest / blob.name[len(prefix):].lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        if not blob.name.endswith("/"):  # by name: its media link names TF's host
            target.write_bytes(world.server.emulator.download(blob.name))


def tensors(prefix) -> dict:
    import tensorflow as tf
    reader = tf.train.load_checkpoint(str(prefix))
    return {name: reader.get_tensor(name) for name in reader.get_variable_to_shape_map()}


def differing(a: dict, b: dict) -> dict[str, str]:
    """Name -> how far apart, for the tensors of ``a`` and ``b`` that differ."""
    assert a.keys() == b.keys()
    def gap(x, y) -> str:
        x, y = np.asarray(x), np.asarray(y)
        if x.dtype.kind in "fiu":
            return f"max |diff| {np.max(np.abs(x.astype(float) - y.astype(float))):g}"
        return f"{x!r} != {y!r}"
    return {k: gap(a[k], b[k]) for k in sorted(a) if not np.array_equal(a[k], b[k])}


def metrics(world: World, label: str) -> dict:
    prefix = world.model_dir(label).removeprefix(f"gs://{EMULATOR_BUCKET}/")
    return json.loads(world.server.emulator.download(f"{prefix}/metrics.json"))


def test_chaos_run_recovers_three_times_and_ends_like_an_uninterrupted_one(world, tmp_path):
    seed = int(os.environ.get("SPOT_CHAOS_SEED") or random.randrange(10**6))
    print(f"SPOT_CHAOS_SEED={seed}")
    baseline = uninterrupted(world, "clean")
    chaos = Chaos(world, random_schedule(seed))
    chaos.start()
    world.cloud.arm(stockouts=2, ssh_failures=1)  # no capacity twice, a host unreachable once
    proc = world.launch(world.argv("chaos", "--max_recoveries=3"))
    chaos.join(timeout=10)
    baseline.join(timeout=RUN_SECONDS)
    print(proc.stdout)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-5000:]
    assert not chaos.error and len(chaos.done) == 3, chaos.error
    clean = baseline.result["proc"]
    assert clean.returncode == 0, clean.stderr[-3000:]

    events = world.events()
    assert [e["event"] for e in events].count("preempted") == 3
    [summary] = [e for e in events if e["event"] == "summary"]
    assert summary["recoveries"] == 3 and summary["exit"] == 0
    # Each preemption's cost is bounded: at most the 6 steps between two
    # checkpoints (--checkpoint_every=6), the one during setup none.
    assert len(summary["redo"]) == 3 and summary["redo"][0] == [0, 0]
    assert all(most is not None and least <= most <= 6 for least, most in summary["redo"])
    assert proc.stdout.strip().splitlines()[-1].split(" ", 1)[1].startswith(
        "summary: 3 recoveries; steps trained again after each preemption: ")

    # The cloud: one VM at a time, four in all, none left.
    assert world.cloud.vms() == {}
    assert world.cloud.most_alive() == 1
    assert [r["event"] for r in world.cloud.history()].count("create") == 4
    assert [c["rc"] for c in world.cloud.calls()
            if c["argv"][:4] == ["compute", "tpus", "tpu-vm", "create"] and c["rc"]] == [1, 1]
    assert [e["event"] for e in events].count("no capacity") == 2
    assert world.cloud.faults() == {"stockouts": 0, "ssh_failures": 0}

    assert_same_result(world, tmp_path)


def assert_same_result(world: World, tmp_path) -> None:
    """The weights bit for bit, the metrics but for the resume."""
    for label in ("chaos", "clean"):
        download(world, label, "checkpoints", tmp_path / label / "checkpoints")
        download(world, label, "export/variables", tmp_path / label / "variables")
    final = f"checkpoints/ckpt-{TOTAL_STEPS}"
    chaos_ckpt, clean_ckpt = (tensors(tmp_path / label / final) for label in ("chaos", "clean"))
    # Weights and optimizer slots bit for bit; the saves counted and the
    # run's history (the train loss of an epoch cut by a preemption is its
    # steps' after the resume, docs/trainer.md) may differ.
    state = "trainer_state/.ATTRIBUTES/VARIABLE_VALUE"
    assert set(differing(chaos_ckpt, clean_ckpt)) <= {
        "save_counter/.ATTRIBUTES/VARIABLE_VALUE", state}
    assert len([k for k in clean_ckpt if "model" in k and "OPTIMIZER" not in k]) >= 8
    got_state, want_state = (json.loads(t[state]) for t in (chaos_ckpt, clean_ckpt))
    assert {**got_state, "history": None} == {**want_state, "history": None}
    for key in ("test_loss", "test_accuracy"):
        assert got_state["history"][key] == want_state["history"][key]
    chaos_export, clean_export = (tensors(tmp_path / label / "variables" / "variables")
                                  for label in ("chaos", "clean"))
    assert differing(chaos_export, clean_export) == {}
    got, want = metrics(world, "chaos"), metrics(world, "clean")
    print("metrics.json keys that differ:", sorted(k for k in want if got[k] != want[k]))
    for key in ("test_loss", "test_accuracy", "test_examples", "train_steps",
                "train_examples", "dataset"):
        assert got[key] == want[key], key
    assert got["history"]["test_accuracy"] == want["history"]["test_accuracy"]
    assert got["history"]["test_loss"] == want["history"]["test_loss"]
