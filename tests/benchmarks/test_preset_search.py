"""`benchmarks.preset_search`'s pure parts: its log, its summary, its flags
(the runs themselves take hours: docs/benchmarks.md, "The tpu preset's search")."""

from __future__ import annotations

import dataclasses
import json

import pytest

from benchmarks import preset_search
from trainer.config import parse_flags


def _row(name, seed, accuracy):
    return {"candidate": name, "seed": seed, "accuracy": accuracy, "wall_s": 1, "rc": 0}


def test_the_log_is_read_back_by_candidate_and_seed(tmp_path):
    log = tmp_path / "log.jsonl"
    assert preset_search.done_runs(str(log)) == {}
    rows = [_row("cpu", 1, 0.9963), _row("adam-512", 1, 0.9955)]
    log.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert preset_search.done_runs(str(log)) == {("cpu", 1): rows[0], ("adam-512", 1): rows[1]}


def test_the_summary_compares_each_candidate_with_cpu_on_the_same_seeds():
    rows = {(r["candidate"], r["seed"]): r for r in [
        _row("cpu", 1, 0.9963), _row("cpu", 2, 0.9964),
        _row("adam-512", 1, 0.9955), _row("adam-512", 2, 0.9975)]}
    assert preset_search.summary(rows, [1, 2]) == [
        "cpu: 0.9963, 0.9964  mean 0.99635  spread 0.0001",
        "adam-512: 0.9955, 0.9975  mean 0.99650  spread 0.0020  reaches cpu"]
    rows[("adam-512", 2)] = _row("adam-512", 2, 0.9958)
    assert preset_search.summary(rows, [1, 2])[1].endswith("below cpu")
    # A candidate with a seed missing or failed is not summarized.
    assert preset_search.summary(rows, [1, 2, 3]) == []


def test_the_reference_is_the_cpu_preset_and_the_candidates_run_in_float32():
    base = ["--data=d", "--model_dir=m"]
    reference = parse_flags(base + preset_search.CANDIDATES["cpu"])
    assert reference == parse_flags(base + ["--preset=cpu"])
    for name, flags in preset_search.CANDIDATES.items():
        if not name.startswith(("cpu", "tpu")):
            assert parse_flags(base + flags).mixed_precision == "none", name
    tpu = parse_flags(base + preset_search.CANDIDATES["tpu"])
    assert tpu.preset == "tpu"
    # The two runs that separate the preset's differences from cpu.
    stream = parse_flags(base + preset_search.CANDIDATES["tpu-stream"])
    assert stream == dataclasses.replace(tpu, cache=False)
    f32 = parse_flags(base + preset_search.CANDIDATES["tpu-f32"])
    assert f32 == dataclasses.replace(tpu, mixed_precision="none")
    with pytest.raises(SystemExit):
        preset_search.parse_args(["d", "log", "--only=cpu,nope"])
