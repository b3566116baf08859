"""`benchmarks/pipeline_benchmark.py` at its smallest size: the job, the plain
script and the floor."""

import gzip
import os
import re
import subprocess
import sys

import pytest

from tests.helpers import REPO

SECONDS = r"(\d+\.\d\d) s"


@pytest.mark.slow
def test_benchmark_prints_the_physical_floor_beside_the_baseline():
    proc = subprocess.run([sys.executable, "-m", "benchmarks.pipeline_benchmark", "--factors=1",
                           "--repeats=1", "--skip_scale"], cwd=REPO, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout
    job = float(re.search(r"job \(DirectRunner\)\s+(\d+\.\d) s", out).group(1))
    floor = re.search(rf"floor: gunzip {SECONDS}, write {SECONDS}, sha256 {SECONDS}, "
                      rf"crc32c {SECONDS} = {SECONDS} \| job/floor (\d+\.\d\d)x", out)
    assert floor, out
    *steps, total, ratio = map(float, floor.groups())
    # At 1x the crc32c of ~60 MB takes a few milliseconds, which can print as 0.00.
    assert all(v >= 0 for v in steps) and steps[0] > 0
    assert total == pytest.approx(sum(steps), abs=0.02)
    assert ratio == pytest.approx(job / total, rel=0.05)
    writes = re.search(rf"floor's write, the lesser wall and CPU of: buffered {SECONDS} "
                       rf"\(CPU {SECONDS}\)(?:, O_DIRECT {SECONDS} \(CPU {SECONDS}\))?", out)
    assert writes, out
    walls = [float(v) for v in writes.groups()[::2] if v is not None]
    assert steps[1] == min(walls)
    cpu = re.search(rf"job CPU: user {SECONDS} \+ sys {SECONDS} = {SECONDS} \| floor CPU "
                    rf"{SECONDS} \| job CPU/floor CPU (\d+\.\d\d)x", out)
    assert cpu, out
    user, system, job_cpu, floor_cpu, cpu_ratio = map(float, cpu.groups())
    assert user > 0 and job_cpu == pytest.approx(user + system, abs=0.02)
    assert cpu_ratio == pytest.approx(job_cpu / floor_cpu, rel=0.05)
    start_up = re.search(rf"Job start-up \(100 \+ 100 digits[^)]*\): {SECONDS} wall, "
                         rf"CPU user {SECONDS} \+ sys {SECONDS}", out)
    assert start_up and float(start_up.group(2)) > 0, out
    assert re.search(r"job/plain time ratio: median \d+\.\d\dx", out), out
    assert re.search(r"job/floor time ratio: median \d+\.\d\dx", out), out
    assert re.search(r"job CPU/floor CPU ratio: median \d+\.\d\dx", out), out


def test_the_floor_gunzips_in_pieces_and_refuses_a_cut_file():
    from benchmarks import pipeline_benchmark as benchmark
    data = os.urandom(3 * benchmark.GUNZIP_PIECE) + bytes(5 * benchmark.GUNZIP_PIECE)
    packed = gzip.compress(data)
    assert len(packed) > 3 * benchmark.GUNZIP_PIECE  # several pieces
    assert benchmark.gunzip_streamed(packed) == len(data)
    with pytest.raises(ValueError, match="truncated"):
        benchmark.gunzip_streamed(packed[:-100])


def test_the_floors_direct_write_writes_the_blocks_back_to_back(tmp_path):
    import mmap
    from benchmarks import pipeline_benchmark as benchmark
    blocks = [os.urandom(n) for n in (benchmark.FLOOR_BLOCK, 5, benchmark.FLOOR_BLOCK + 7, 0, 3)]
    buffer = mmap.mmap(-1, benchmark.FLOOR_BLOCK)
    if not benchmark.write_direct(blocks, tmp_path / "f", buffer):
        pytest.skip("this file system does not take O_DIRECT")
    assert (tmp_path / "f").read_bytes() == b"".join(blocks)


@pytest.mark.slow
def test_the_scale_runs_print_their_records_shards_time_and_memory(tmp_path, capsys):
    from benchmarks import pipeline_benchmark as benchmark
    benchmark.scale(tmp_path, 0.0001)  # two tiny jobs: ~60 and ~120 records
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("Scale (synthetic")
    assert len(lines) == 3
    for line in lines[1:]:
        assert re.fullmatch(r"\s+[\d,]+ records, +\d+ MB: 1 shards of [\d.]+-[\d.]+ MB, +"
                            r"\d+\.\d s, +[\d,]+ records/s, peak RSS +\d+ MiB", line), line
    assert list(tmp_path.iterdir()) == []
