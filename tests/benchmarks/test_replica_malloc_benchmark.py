"""The two-replica malloc benchmark runs end to end at a tiny size.

No timing is asserted (speed is for the benchmark itself, on a quiet
machine). Page faults are counted, not timed: with TensorFlow 2.21's
threshold left in force the baseline maps every step's buffers afresh, so
it faults several times as often as the trainer as it is.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from benchmarks import replica_malloc_benchmark
from tests.helpers import REPO

pytestmark = [pytest.mark.slow, pytest.mark.tf221]


def test_benchmark_prints_the_pair_and_the_baseline_faults_more():
    proc = subprocess.run(
        [sys.executable, "benchmarks/replica_malloc_benchmark.py", "--examples=2048",
         "--epochs=2", "--repeats=1"],
        cwd=REPO, capture_output=True, text=True, timeout=600,
        env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"))
    out = proc.stdout
    assert proc.returncode == 0, proc.stderr[-3000:] + out
    assert re.search(r"^pair 1: as is ÷ baseline, step time [\d.]+x$", out, re.M), out
    assert re.search(r"^median step time as is ÷ baseline: [\d.]+x", out, re.M), out
    faults = {side: int(count.replace(",", "")) for side, count in
              re.findall(r"^  (baseline|as is)\s+\d+ ms/step\s+([\d,]+) minor faults", out, re.M)}
    assert set(faults) == {"baseline", "as is"}, out
    assert faults["baseline"] > 2 * faults["as is"], out


def test_bad_flags_are_one_line():
    proc = subprocess.run(
        [sys.executable, "benchmarks/replica_malloc_benchmark.py", "--epochs=1"],
        cwd=REPO, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert "needs --epochs >= 2" in proc.stderr.strip().splitlines()[-1]


def test_step_times_read_every_unit_keras_prints():
    log = ("Epoch 1/2\n8/8 - 19s - loss: 2.1 - 2s/step\n"
           "Epoch 2/2\n8/8 - 1s - loss: 1.2 - 181ms/step\n16/16 - 0s - 900us/step\n")
    assert replica_malloc_benchmark.step_times_ms(log) == [2000.0, 181.0, 0.9]
