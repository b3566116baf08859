"""Conversion speed and memory: the Beam job against a plain TFRecordWriter script.

    python benchmarks/pipeline_benchmark.py [--scale_gb=1.0] [--skip_scale]

1. MNIST-sized input (60,000 + 10,000 real digits: the offline sample tiled
   into IDX files): whole-process wall time and peak RSS of
   ``python -m pipeline`` on the local DirectRunner, next to
   ``plain_writer.py`` (one process, same Example encoding,
   ``tf.io.TFRecordWriter``), and their ratio. Both run in this same
   invocation, so machine noise hits both.
2. Scale: ``synthetic`` data of about ``--scale_gb`` (and of half that, to show
   how memory moves with size), printing shard sizes, time and peak RSS.
"""

from __future__ import annotations

import argparse
import gzip
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import mnist_contract as contract

from pipeline import idx  # noqa: E402
from pipeline.sources import SampleSource  # noqa: E402

RECORD_BYTES = 856  # a raw-format synthetic record with its TFRecord framing


def run_measured(cmd: list[str]) -> tuple[float, float]:
    """(wall seconds, peak RSS in MiB) of one child process."""
    start = time.perf_counter()
    process = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.DEVNULL,
                               stderr=subprocess.PIPE,
                               env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"})
    _, status, usage = os.wait4(process.pid, 0)
    wall = time.perf_counter() - start
    stderr = process.stderr.read().decode()
    process.stderr.close()
    if os.waitstatus_to_exitcode(status) != 0:
        raise RuntimeError(f"{cmd} failed:\n{stderr[-3000:]}")
    return wall, usage.ru_maxrss / 1024


def write_mnist_sized_idx(folder: Path) -> None:
    """60k/10k real digits: the 5,000-digit sample, tiled."""
    source = SampleSource()
    digits = next(source.read("train", None))
    for split, count in (("train", 60_000), ("test", 10_000)):
        take = np.arange(count) % len(digits.labels)
        images_name, labels_name = idx.MNIST_FILES[split]
        (folder / images_name).write_bytes(
            gzip.compress(idx.encode_idx(digits.images[take]), compresslevel=6))
        (folder / labels_name).write_bytes(
            gzip.compress(idx.encode_idx(digits.labels[take].astype(np.uint8))))


def mnist_sized(work: Path) -> None:
    data = work / "idx"
    data.mkdir()
    write_mnist_sized_idx(data)
    plain_wall, plain_rss = run_measured(
        [sys.executable, "benchmarks/plain_writer.py", f"--source={data}",
         f"--output={work / 'plain'}"])
    beam_wall, beam_rss = run_measured(
        [sys.executable, "-m", "pipeline", f"--source={data}",
         f"--output={work / 'beam'}", "--runner=DirectRunner"])
    print("MNIST-sized (70,000 records, raw images), whole process:")
    print(f"  plain tf.io.TFRecordWriter : {plain_wall:6.1f} s  peak RSS {plain_rss:7.0f} MiB")
    print(f"  Beam job (DirectRunner)    : {beam_wall:6.1f} s  peak RSS {beam_rss:7.0f} MiB")
    print(f"  ratio Beam/plain           : {beam_wall / plain_wall:6.2f}x time  "
          f"{beam_rss / plain_rss:5.2f}x memory   (bar: time <= 2.5x)")


def scale(work: Path, gigabytes: float) -> None:
    print(f"Scale (synthetic, DirectRunner, target 100 MB shards):")
    for fraction in (0.5, 1.0):
        records = int(gigabytes * fraction * 1e9 / RECORD_BYTES)
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
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="pipeline-bench-") as tmp:
        work = Path(tmp)
        mnist_sized(work)
        if not args.skip_scale:
            scale(work, args.scale_gb)


if __name__ == "__main__":
    main()
