"""The ``tpu`` preset's search: candidates against the ``cpu`` preset, same seeds.

    python -m benchmarks.preset_search DATA LOG [--seeds=1,2,3] [--work_dir=DIR]
        [--only=NAME,...]

DATA is a folder the pipeline wrote whose ``test`` split is a validation
split (for example the last 10,000 of the 60,000 MNIST training digits,
the first 50,000 as ``train``); never the MNIST test set. Each run is
``python -m trainer --data=DATA --model_dir=DIR/NAME-sS --cpu_replicas=2
--seed=S --verbose=2`` plus the candidate's flags, one at a time. LOG is a
JSON-lines file: each run appends one line as it ends (candidate, seed,
validation accuracy, wall seconds, exit status), and a run already in LOG
is not run again, so a stopped search loses one run at most and resumes
where it stopped. After the last run it prints one line per candidate:
its seeds, mean and spread, and whether its mean reaches the ``cpu``
preset's on the same seeds.

The candidates run as the ``cpu`` reference does: MirroredStrategy over 2
logical CPU devices, float32 (``--mixed_precision=none``), batch
normalization over each replica's half of the batch. On a TPU with 8
replicas each normalizes an eighth. Emulating that here, with ghost
batches (``--bn_virtual_batch_size``) or 8 logical devices, took 128–205
and 171 ms a step against the reference's 56–101 (2026-12-06, this
machine, other work beside each), too long for the search's budget of
about 3 hours. The entry ``tpu`` is the chosen preset run as it is, in
bfloat16 (this CPU has AVX512_BF16); the two after it remove one of its
differences from ``cpu`` each.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time


def _tpu_run(batch: int, **flags) -> list[str]:
    """Flags of a candidate over the ``tpu`` preset, in float32."""
    values = {"preset": "tpu", "global_batch_size": batch, "mixed_precision": "none",
              **flags}
    return [f"--{name}={value}" for name, value in values.items()]


# The reference, then the candidates (at most 6), each a name and its flags.
CANDIDATES: dict[str, list[str]] = {
    "cpu": ["--preset=cpu"],
    # Four times the batch, Adam at sqrt(4) x 2e-3, one epoch of warmup.
    "adam-512": _tpu_run(512, optimizer="adam", learning_rate=4e-3,
                         warmup_epochs=1.0, dropout=0.4),
    # The tpu preset as it is, bfloat16 included: the check of the choice.
    "tpu": ["--preset=tpu"],
    # The two ways it differs from cpu, one at a time: bfloat16 alone (the
    # records streamed through the shuffle buffer, as cpu reads them) and
    # --cache alone (each epoch a full permutation, in float32).
    "tpu-stream": ["--preset=tpu", "--cache=false"],
    "tpu-f32": ["--preset=tpu", "--mixed_precision=none"],
}


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("data")
    p.add_argument("log")
    p.add_argument("--seeds", default="1,2,3")
    p.add_argument("--work_dir", default=None)
    p.add_argument("--only", default=",".join(CANDIDATES))
    args = p.parse_args(argv)
    unknown = set(args.only.split(",")) - set(CANDIDATES)
    if unknown:
        p.error(f"--only: no candidate {', '.join(sorted(unknown))}")
    return args


def done_runs(log: str) -> dict[tuple[str, int], dict]:
    """The runs LOG already holds, by (candidate, seed)."""
    if not os.path.exists(log):
        return {}
    with open(log) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    return {(r["candidate"], r["seed"]): r for r in rows}


def run_one(data: str, work_dir: str, name: str, seed: int) -> dict:
    """One trainer run; its validation accuracy from ``metrics.json``."""
    model_dir = os.path.join(work_dir, f"{name}-s{seed}")
    cmd = [sys.executable, "-m", "trainer", f"--data={data}", f"--model_dir={model_dir}",
           "--cpu_replicas=2", f"--seed={seed}", "--verbose=2", *CANDIDATES[name]]
    start = time.monotonic()
    with open(model_dir + ".log", "w") as out:
        rc = subprocess.call(cmd, stdout=out, stderr=subprocess.STDOUT)
    wall = time.monotonic() - start
    accuracy = None
    if rc == 0:
        with open(os.path.join(model_dir, "metrics.json")) as f:
            accuracy = json.load(f)["test_accuracy"]
    return {"candidate": name, "seed": seed, "accuracy": accuracy,
            "wall_s": round(wall), "rc": rc, "flags": CANDIDATES[name],
            "ended": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())}


def summary(rows: dict[tuple[str, int], dict], seeds: list[int]) -> list[str]:
    """One line per candidate with every seed run: mean, spread, against cpu."""
    def accuracies(name):
        values = [rows.get((name, s), {}).get("accuracy") for s in seeds]
        return None if None in values else values
    reference = accuracies("cpu")
    lines = []
    for name in CANDIDATES:
        values = accuracies(name)
        if values is None:
            continue
        mean = statistics.mean(values)
        verdict = "" if reference is None or name == "cpu" else (
            "  reaches cpu" if mean >= statistics.mean(reference) else "  below cpu")
        lines.append(f"{name}: {', '.join(f'{v:.4f}' for v in values)}  mean {mean:.5f}"
                     f"  spread {max(values) - min(values):.4f}{verdict}")
    return lines


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    seeds = [int(s) for s in args.seeds.split(",")]
    work_dir = args.work_dir or os.path.dirname(os.path.abspath(args.log))
    names = args.only.split(",")
    for seed in seeds:  # seed by seed: a stop leaves every candidate comparable
        for name in names:
            if (name, seed) in done_runs(args.log):
                continue
            row = run_one(args.data, work_dir, name, seed)
            with open(args.log, "a") as f:
                f.write(json.dumps(row) + "\n")
            print(json.dumps(row), flush=True)
    print("\n".join(summary(done_runs(args.log), seeds)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
