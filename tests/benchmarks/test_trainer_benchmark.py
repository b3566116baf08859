"""The trainer benchmark runs end to end at a tiny size and prints every line.

No timing is asserted (speed is for the benchmark itself, on a quiet
machine): this checks that each ratio, each bar and the input stage
breakdown are measured and printed, so the script keeps working.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from tests.helpers import REPO

pytestmark = pytest.mark.slow


def test_benchmark_prints_every_ratio_bar_and_stage():
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.trainer_benchmark", "--examples=1024", "--shards=2",
         "--batch=32", "--input_batches=20", "--steps=50", "--repeats=1",
         "--fit_repeats=1", "--memory_examples=4096"],
        cwd=REPO, capture_output=True, text=True, timeout=600,
        env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"))
    out = proc.stdout
    assert proc.returncode in (0, 1) and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    ratios = dict(re.findall(r"^(\w+)\s+.* = ([\d.]+)x", out, re.M))
    assert set(ratios) == {"input", "input_memory_1024", "input_memory_128", "parse_checks",
                           "keras", "keras_quiet", "keras_linear", "custom"}
    assert all(float(r) > 0 for r in ratios.values())
    assert re.search(r"^input .*\(bar 0\.9x: (met|MISSED)\)", out, re.M)
    assert re.search(r"^keras_linear .*\(bar 1\.5x: (met|MISSED)\)", out, re.M)
    assert re.search(r"^parse_checks .*\(bar 0\.8x: (met|MISSED)\)", out, re.M)
    for size in (1024, 128):
        assert re.search(rf"^input_memory_{size} --cache in memory, batch {size} .* / plain "
                         r"gather pipeline .*\(bar 0\.9x: (met|MISSED)\); process CPU per "
                         r"example [\d.]+ us / [\d.]+ us$", out, re.M), size
    assert not re.search(r"^(keras|keras_quiet|custom) .*\(bar ", out, re.M)
    assert (proc.returncode == 1) == ("MISSED" in out)
    for stage in ("read + un-block + batch", "read + un-block + shuffle + batch",
                  "parse + decode + normalize", "from_tensor_slices shuffle + batch"):
        assert re.search(rf"^  {re.escape(stage)} .*: \d+$", out, re.M), stage
    for key in ("keras", "keras_quiet", "custom"):
        assert f"{key}: information, no bar" in out


def test_benchmark_measures_the_named_ratios_on_a_given_dataset(tmp_path):
    from tests import trainer_data
    data = str(tmp_path / "data")
    trainer_data.write_dataset(data, num_train=1100, num_test=10, train_shards=2, test_shards=1)
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.trainer_benchmark", f"--data={data}",
         "--ratios=input_memory_1024,input_memory_128", "--repeats=1",
         "--memory_examples=4096"],
        cwd=REPO, capture_output=True, text=True, timeout=600,
        env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"))
    out = proc.stdout
    assert proc.returncode in (0, 1) and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert f"1,100 train examples in 2 file(s) ({data})" in out
    assert re.findall(r"^(\w+) .* = [\d.]+x", out, re.M) == ["input_memory_1024",
                                                              "input_memory_128"]
