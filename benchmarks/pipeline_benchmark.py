"""Conversion speed and memory: the Beam job against a plain TFRecordWriter script.

    python benchmarks/pipeline_benchmark.py [--factors=1,10] [--repeats=3] [--skip_scale]

1. MNIST-sized input (60,000 + 10,000 real digits: the offline sample tiled
   into IDX files) and 10x that (600,000 + 100,000, ~570 MB of shards):
   whole-process wall time and peak RSS of ``python -m pipeline`` on the
   local DirectRunner, next to ``plain_writer.py`` (one process, same
   Example encoding, ``tf.io.TFRecordWriter``), and their ratio. Both run
   alternately in this same invocation, so machine noise hits both.
   Bars: job/plain <= 1.5x at MNIST size, <= 1.3x at 10x. Beside them, the
   physical floor of the same input and output, measured in this process
   after each job run: gunzip of the IDX files, writing the job's shard
   bytes in large blocks, sha256 and crc32c over those bytes; the job's
   time is printed as a multiple of their sum.
2. Scale: ``synthetic`` data of about ``--scale_gb`` (and of half that, to show
   how memory moves with size), printing shard sizes, time and peak RSS.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import google_crc32c
import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import mnist_contract as contract

from pipeline.source import idx  # noqa: E402
from pipeline.source.sources import SampleSource  # noqa: E402

FLOOR_BLOCK = 8 << 20  # bytes per write, hash and checksum call of the floor


# Runs argv[1:] and prints its wall time and peak RSS. A process started
# straight from this benchmark would inherit this process's own peak RSS (Linux
# keeps ru_maxrss across fork and exec, and this process holds the 10x IDX
# data while writing it), so a small fresh interpreter starts the measured one.
_MEASURE = """
import os, resource, subprocess, sys, time
start = time.perf_counter()
child = subprocess.Popen(sys.argv[1:], stdout=subprocess.DEVNULL)
_, status, usage = os.wait4(child.pid, 0)
print(time.perf_counter() - start, usage.ru_maxrss, os.waitstatus_to_exitcode(status))
"""


def run_measured(cmd: list[str]) -> tuple[float, float]:
    """(wall seconds, peak RSS in MiB) of one child process."""
    result = subprocess.run([sys.executable, "-c", _MEASURE, *cmd], cwd=REPO,
                            capture_output=True, text=True,
                            env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"})
    wall, maxrss, code = result.stdout.split()
    if int(code) != 0:
        raise RuntimeError(f"{cmd} failed:\n{result.stderr[-3000:]}")
    return float(wall), int(maxrss) / 1024


def write_idx(folder: Path, factor: int) -> None:
    """``factor`` x MNIST's 60k/10k real digits: the 5,000-digit sample, tiled."""
    source = SampleSource()
    digits = next(source.read("train", None))
    for split, count in (("train", 60_000 * factor), ("test", 10_000 * factor)):
        take = np.arange(count) % len(digits.labels)
        images_name, labels_name = idx.MNIST_FILES[split]
        (folder / images_name).write_bytes(
            gzip.compress(idx.encode_idx(digits.images[take]), compresslevel=6))
        (folder / labels_name).write_bytes(
            gzip.compress(idx.encode_idx(digits.labels[take].astype(np.uint8))))


def _timed(step) -> float:
    start = time.perf_counter()
    step()
    return time.perf_counter() - start


def floor_seconds(data: Path, shards: list[Path], scratch: Path) -> dict[str, float]:
    """Seconds of the work no converter of this input into these shards can skip.

    Inputs and output are read into memory first (untimed), so each step is
    measured alone: gunzip of every IDX file, writing the shards' bytes into
    one file in large blocks, sha256 and crc32c over the same bytes.
    """
    inputs = [f.read_bytes() for f in sorted(data.iterdir())]
    blocks = []
    for shard in shards:
        with open(shard, "rb") as f:
            blocks.extend(iter(lambda: f.read(FLOOR_BLOCK), b""))

    def write():
        with open(scratch, "wb") as f:
            for block in blocks:
                f.write(block)

    def sha256():
        digest = hashlib.sha256()
        for block in blocks:
            digest.update(block)

    def crc32c():
        crc = 0
        for block in blocks:
            crc = google_crc32c.extend(crc, block)

    seconds = {"gunzip": _timed(lambda: [gzip.decompress(b) for b in inputs]),
               "write": _timed(write), "sha256": _timed(sha256), "crc32c": _timed(crc32c)}
    scratch.unlink()
    return seconds


def compare(work: Path, factor: int, bar: float, repeats: int) -> None:
    """Plain script and job on the same IDX files, alternating, ``repeats`` times."""
    data = work / f"idx-{factor}x"
    data.mkdir()
    write_idx(data, factor)
    records = 70_000 * factor
    print(f"{factor}x MNIST ({records:,} records, raw images), whole process, "
          f"IDX input {sum(f.stat().st_size for f in data.iterdir()) / 1e6:.0f} MB:")
    ratios, floor_ratios = [], []
    for attempt in range(repeats):
        plain_wall, plain_rss = run_measured(
            [sys.executable, "benchmarks/plain_writer.py", f"--source={data}",
             f"--output={work / 'plain'}"])
        beam_wall, beam_rss = run_measured(
            [sys.executable, "-m", "pipeline", f"--source={data}",
             f"--output={work / 'beam'}", "--runner=DirectRunner", "--overwrite"])
        shards = sum(f.stat().st_size for f in (work / "beam").glob("mnist-*")) / 1e6
        ratios.append(beam_wall / plain_wall)
        print(f"  run {attempt + 1}: plain TFRecordWriter {plain_wall:6.1f} s, "
              f"RSS {plain_rss:6.0f} MiB | job (DirectRunner) {beam_wall:6.1f} s, "
              f"RSS {beam_rss:6.0f} MiB, {shards:.0f} MB of shards | "
              f"job/plain {beam_wall / plain_wall:4.2f}x time, "
              f"{beam_rss / plain_rss:4.2f}x memory")
        floor = floor_seconds(data, sorted((work / "beam").glob("mnist-*")),
                              work / "floor.bin")
        floor_ratios.append(beam_wall / sum(floor.values()))
        print("         floor: " + ", ".join(f"{k} {v:.2f} s" for k, v in floor.items())
              + f" = {sum(floor.values()):.2f} s | job/floor {floor_ratios[-1]:.2f}x")
        subprocess.run(["rm", "-rf", str(work / "plain"), str(work / "beam")], check=True)
    median = statistics.median(ratios)
    print(f"  job/plain time ratio: median {median:.2f}x (bar <= {bar}x: "
          f"{'met' if median <= bar else 'MISSED'}), best {min(ratios):.2f}x, "
          f"worst {max(ratios):.2f}x")
    print(f"  job/floor time ratio: median {statistics.median(floor_ratios):.2f}x, "
          f"best {min(floor_ratios):.2f}x, worst {max(floor_ratios):.2f}x")
    subprocess.run(["rm", "-rf", str(data)], check=True)


def scale(work: Path, gigabytes: float) -> None:
    print("Scale (synthetic, DirectRunner, target 100 MB shards):")
    for fraction in (0.5, 1.0):
        records = int(gigabytes * fraction * 1e9 / contract.RECORD_SIZES["raw"].typical)
        out = work / f"scale-{fraction}"
        wall, rss = run_measured(
            [sys.executable, "-m", "pipeline", f"--source=synthetic:{records}",
             f"--output={out}", "--splits=train", "--runner=DirectRunner"])
        manifest = contract.Manifest.from_json((out / "manifest.json").read_text())
        sizes = [s.num_bytes / 1e6 for s in manifest.split("train").shards]
        print(f"  {records:>9,} records, {sum(sizes):7.0f} MB: {len(sizes)} shards of "
              f"{min(sizes):.1f}-{max(sizes):.1f} MB, {wall:6.1f} s, "
              f"{records / wall:8,.0f} records/s, peak RSS {rss:6.0f} MiB")
        subprocess.run(["rm", "-rf", str(out)], check=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scale_gb", type=float, default=0.99)
    parser.add_argument("--skip_scale", action="store_true")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--factors", default="1,10",
                        help="MNIST multiples to compare (1: 70,000 records, 10: 700,000)")
    args = parser.parse_args()
    bars = {1: 1.5, 10: 1.3}
    with tempfile.TemporaryDirectory(prefix="pipeline-bench-") as tmp:
        work = Path(tmp)
        for factor in map(int, args.factors.split(",")):
            compare(work, factor, bars.get(factor, 1.3), args.repeats)
        if not args.skip_scale:
            scale(work, args.scale_gb)


if __name__ == "__main__":
    main()
