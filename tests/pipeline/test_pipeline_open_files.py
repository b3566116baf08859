"""The file shuffle's open files: a shard's merge holds every spill file of
its split open, so a local job raises its open-file limit as far as that
needs, or refuses the run in one line before touching the output."""

import resource
import subprocess
import sys

import pytest

from tests.helpers import REPO


def _limited(soft: int, hard: int):
    """A ``preexec_fn`` that starts the child at these open-file limits."""
    return lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def _run(args, soft, hard, timeout=300):
    return subprocess.run([sys.executable, *args], cwd=REPO, capture_output=True, text=True,
                          timeout=timeout, preexec_fn=_limited(soft, hard))


def test_the_soft_limit_is_raised_as_asked_up_to_the_hard_limit():
    code = ("import resource\nfrom pipeline import storage\n"
            "print(*(storage.raise_open_file_limit(n) for n in (50, 500, 5000)),"
            " *resource.getrlimit(resource.RLIMIT_NOFILE))")
    done = _run(["-c", code], 100, 1000)
    assert done.stdout.split() == ["100", "500", "1000", "1000", "1000"], done.stderr


def test_a_hard_limit_below_the_merges_needs_is_one_line_before_anything_runs(tmp_path):
    out = tmp_path / "out"
    done = _run(["-m", "pipeline", "--source=synthetic:3000000", "--splits=train",
                 f"--output={out}", "--runner=DirectRunner"], 150, 150)
    assert done.returncode == 2, done.stderr[-2000:]
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert errors == [
        "error: train: a shard's merge holds its ~300 spill files open (556 open files in "
        "all with 1 worker(s)), over the 150 this process may open (ulimit -n, raised up "
        "to ulimit -Hn); raise the hard limit, or use a distributed runner "
        "(--shuffle=beam)"], done.stderr[-2000:]
    assert not out.exists()


@pytest.mark.slow
def test_a_job_with_more_spill_files_than_its_soft_limit_runs(tmp_path):
    """30 spill files at a soft limit of 25: the merges would fail to open them."""
    out = tmp_path / "out"
    done = _run(["-m", "pipeline", "--source=synthetic:300000", "--splits=train",
                 f"--output={out}", "--runner=DirectRunner"], 25,
                 resource.getrlimit(resource.RLIMIT_NOFILE)[1])
    assert done.returncode == 0, done.stderr[-2000:]
    assert len(list(out.glob("mnist-train.tfrecord-*"))) == 3
