#!/usr/bin/env python3
"""Two CPU replicas: the trainer as it is ÷ the trainer with TensorFlow's malloc setting left.

    python -m benchmarks.replica_malloc_benchmark [--data=DIR] [--examples=8192]
        [--epochs=3] [--repeats=2] [--replicas=2]

Runs ``python -m trainer --preset=cpu --cpu_replicas=2`` (one seed, no
batch-norm recalibration) as two processes, alternately, ``--repeats``
times: the trainer as it is, and a baseline whose
`trainer.malloc.restore_malloc_thresholds` is replaced by a no-op, so that
TensorFlow 2.21's ``mallopt(M_MMAP_THRESHOLD, 128 KiB)`` (applied by the
distributed dataset's iterator) stays in force. Per run: the median
milliseconds per step over the epochs after the first (Keras' own
``ms/step``; the first epoch traces), the process's minor page faults, and
its user and sys CPU time. Printed: each pair's step time and minor page
faults as it is ÷ baseline, and their medians; the faults' median has a
bar (`FAULTS_BAR`), and the exit status is 1 when it is missed. Both sides
train the same steps on the same data with the same seed, and their final
test accuracies must agree.

DATA is a folder the pipeline wrote; without it ``--examples`` synthetic
digits (`synthetic_data.py`) are written to a temporary folder.
"""

from __future__ import annotations

import argparse
import os
import re
import resource
import statistics
import subprocess
import sys
import tempfile

from benchmarks import synthetic_data

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Keras' progress line prints whole seconds, milliseconds or microseconds per
# step, whichever reads best (tf_keras 2.21 `Progbar._format_time`): a loaded
# machine's traced first epoch shows as "2s/step".
_STEP = re.compile(r"- (\d+)(s|ms|us)/step")
_MS_PER = {"s": 1000.0, "ms": 1.0, "us": 0.001}
_ACCURACY = re.compile(r"test_accuracy=([\d.]+)")

# The bar for the median of minor page faults as it is ÷ baseline: with
# TensorFlow 2.21's threshold left, every step maps its buffers afresh, so
# the baseline faults more than twice as often (measured: docs/benchmarks.md,
# Two CPU replicas and malloc).
FAULTS_BAR = 0.5

# The baseline: the trainer command with the restore made a no-op.
BASELINE = ("import sys; from trainer import malloc, __main__ as cli; "
            "malloc.restore_malloc_thresholds = lambda: False; "
            "sys.exit(cli.main(sys.argv[1:]))")


def trainer_argv(side: str, data: str, model_dir: str, args: argparse.Namespace) -> list[str]:
    prefix = ["-m", "trainer"] if side == "as is" else ["-c", BASELINE]
    return [sys.executable, *prefix, f"--data={data}", f"--model_dir={model_dir}",
            "--preset=cpu", f"--cpu_replicas={args.replicas}", f"--epochs={args.epochs}",
            "--seed=1", "--verbose=2", "--bn_recalibration_examples=0"]


def step_times_ms(log: str) -> list[float]:
    """Milliseconds per step of each epoch, in order, from the trainer's log."""
    return [int(count) * _MS_PER[unit] for count, unit in _STEP.findall(log)]


def run(side: str, data: str, tmp: str, args: argparse.Namespace) -> dict:
    """One training; its step time (median over epochs 2..), faults and CPU."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    model_dir = tempfile.mkdtemp(dir=tmp)
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    proc = subprocess.run(trainer_argv(side, data, model_dir, args), cwd=REPO, env=env,
                          capture_output=True, text=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        sys.exit(f"error: the trainer ({side}) exited {proc.returncode}: "
                 f"{proc.stderr.strip().splitlines()[-1:]}")
    steps = step_times_ms(proc.stdout + proc.stderr)
    if len(steps) != args.epochs:
        sys.exit(f"error: the trainer ({side}) printed {len(steps)} step times "
                 f"for {args.epochs} epochs")
    return {"ms_per_step": statistics.median(steps[1:]),
            "accuracy": _ACCURACY.findall(proc.stdout + proc.stderr)[-1],
            "faults": after.ru_minflt - before.ru_minflt,
            "user": after.ru_utime - before.ru_utime,
            "sys": after.ru_stime - before.ru_stime}


def describe(side: str, result: dict) -> str:
    return (f"  {side:8s} {result['ms_per_step']:5.0f} ms/step  "
            f"{result['faults']:>11,} minor faults  user {result['user']:6.1f} s  "
            f"sys {result['sys']:6.1f} s  test accuracy {result['accuracy']}")


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", help="a folder the pipeline wrote (default: synthetic)")
    parser.add_argument("--examples", type=int, default=8192, help="synthetic train examples")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--replicas", type=int, default=2)
    args = parser.parse_args()
    if args.epochs < 2 or args.repeats < 1 or args.replicas < 2:
        parser.error("needs --epochs >= 2, --repeats >= 1, --replicas >= 2")
    return args


def main() -> int:
    args = parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        data = args.data
        if not data:
            data = os.path.join(tmp, "data")
            synthetic_data.write_dataset(data, num_train=args.examples, num_test=1000,
                                         train_shards=2, test_shards=1)
        print(f"{args.replicas} CPU replicas, cpu preset, {args.epochs} epochs, "
              f"{data if args.data else f'{args.examples:,} synthetic examples'}; "
              f"load average {os.getloadavg()[0]:.1f}")
        ratios, fault_ratios = [], []
        for repeat in range(args.repeats):
            pair = {side: run(side, data, tmp, args) for side in ("baseline", "as is")}
            ratios.append(pair["as is"]["ms_per_step"] / pair["baseline"]["ms_per_step"])
            fault_ratios.append(pair["as is"]["faults"] / max(pair["baseline"]["faults"], 1))
            print(f"pair {repeat + 1}: as is ÷ baseline, step time {ratios[-1]:.2f}x, "
                  f"minor faults {fault_ratios[-1]:.3f}x")
            for side, result in pair.items():
                print(describe(side, result))
            if pair["as is"]["accuracy"] != pair["baseline"]["accuracy"]:
                sys.exit("error: the two sides' test accuracies differ")
    faults = statistics.median(fault_ratios)
    met = faults < FAULTS_BAR
    print(f"median step time as is ÷ baseline: {statistics.median(ratios):.2f}x "
          f"(load average at the end {os.getloadavg()[0]:.1f})")
    print(f"median minor faults as is ÷ baseline: {faults:.3f}x "
          f"(bar < {FAULTS_BAR}x: {'met' if met else 'MISSED'})")
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(main())
