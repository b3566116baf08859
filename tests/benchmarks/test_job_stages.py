"""`benchmarks/job_stages.py`: py-spy stacks charged to the conversion job's stages."""

import pytest

from benchmarks import job_stages
from tests.helpers import REPO


def _line_of(path: str, text: str) -> int:
    """The number of the first line of the job's file ``path`` that contains ``text``."""
    lines = (REPO / path).read_text().splitlines()
    return next(n for n, line in enumerate(lines, 1) if text in line)


def _frame(function: str, path: str, text: str) -> str:
    return f"{function} ({path}:{_line_of(path, text)})"


ROOT = ["process 1:\"python -m pipeline\"", "thread (7): MainThread",
        "<module> (pipeline/__main__.py:1)", "run (apache_beam/runners/runner.py:10)"]


@pytest.mark.parametrize("leaf, stage", [
    ("_GzipReader.read (gzip.py:507)", "read"),
    (_frame("encode_example_rows", "mnist_contract/wire.py", "np.unique(signature)"),
     "encode"),
    (_frame("frame_rows", "mnist_contract/framing.py", "google_crc32c.value(data"), "hash"),
    (_frame("frame_rows", "mnist_contract/framing.py", "framed = np.empty"), "write"),
    (_frame("ShardFileWriter._store", "pipeline/shard/shard_io.py",
            "self._sha256.update(data)"), "hash"),
    (_frame("ShardFileWriter._store", "pipeline/shard/shard_io.py",
            "self._file.write(data)"), "write"),
    (_frame("key_order", "pipeline/shard/batches.py", "np.lexsort"), "shuffle"),
    (_frame("merge_spill_ranges", "pipeline/shard/shard_io.py", "sizes = (ends - starts)"),
     "shuffle"),
    ("_compile_bytecode (<frozen importlib._bootstrap_external>:729)", "beam"),
])
def test_a_stack_is_charged_to_its_innermost_stage(leaf, stage):
    assert job_stages.stage_of_stack(ROOT + [leaf]) == stage


def test_a_frame_of_the_job_without_a_stage_passes_to_its_caller():
    caller = _frame("spill_batch", "pipeline/shard/batches.py", "order = key_order(keys)")
    helper = "raise_if_requested (pipeline/stop.py:1)"
    assert job_stages.stage_of_stack(ROOT + [caller, helper]) == "shuffle"


def test_samples_become_seconds_of_the_measured_cpu_time():
    lines = [";".join(ROOT + ["_GzipReader.read (gzip.py:507)"]) + " 30",
             ";".join(ROOT + ["Thread.run (threading.py:982)"]) + " 10", ""]
    samples = job_stages.stage_samples(lines)
    assert samples == {"read": 30, "encode": 0, "shuffle": 0, "write": 0, "hash": 0,
                       "beam": 10}
    seconds = job_stages.stage_seconds(samples, 8.0)
    assert seconds["read"] == pytest.approx(6.0) and seconds["beam"] == pytest.approx(2.0)
    assert job_stages.stage_seconds(dict.fromkeys(job_stages.STAGES, 0), 5.0)["read"] == 0
