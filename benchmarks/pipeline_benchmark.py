"""Conversion speed and memory: the Beam job against a plain TFRecordWriter script.

    python -m benchmarks.pipeline_benchmark [--factors=1,10] [--repeats=3] [--skip_scale]
        [--mnist_dir=FOLDER] [--py_spy=PATH]

0. The job's fixed start-up cost: a run on 100 + 100 digits (interpreter,
   imports, runner, publish), wall and CPU time.
1. MNIST-sized input (60,000 + 10,000 real digits) and 10x that (600,000 +
   100,000, ~600 MB of shards). The digits are MNIST's 60,000 training
   digits from ``--mnist_dir`` (the test split is the last 10,000 of them),
   or the offline sample's 4,000 without it, tiled into gzip IDX files:
   whole-process wall time, CPU time (user and sys, all threads) and peak
   RSS of ``python -m pipeline`` on the local DirectRunner, next to
   ``plain_writer.py`` (one process, same Example encoding,
   ``tf.io.TFRecordWriter``), and their ratio. Both run alternately in this
   same invocation, so machine noise hits both. Bars: job/plain <= 1.5x at
   MNIST size, <= 1.3x at 10x. Beside them, the physical floor of the same
   input and output, measured in this process after each job run: gunzip
   of the IDX files, writing the job's shard bytes in large blocks (buffered
   and with ``O_DIRECT``: the lesser wall and CPU time of the two), sha256
   and crc32c over those bytes, each step's wall and CPU time; the job's
   wall time is printed as a multiple of the steps' wall-time sum and its
   CPU time as one of their CPU-time sum (goals at 10x: 2.0x and 2.5x; the
   CPU sums hold still when other processes load the machine). With ``--py_spy``
   each job runs once more under that sampling profiler, and the CPU time
   is split by stage (`job_stages`).
2. Scale: ``synthetic`` data of about ``--scale_gb`` (and of half that, to show
   how memory moves with size), printing shard sizes, time and peak RSS.
"""

from __future__ import annotations

import argparse
import dataclasses
import gzip
import hashlib
import mmap
import os
import statistics
import subprocess
import sys
import tempfile
import time
import zlib
from pathlib import Path

import google_crc32c
import numpy as np

import mnist_contract as contract
from benchmarks import job_stages
from pipeline.source import idx
from pipeline.source.sources import SampleSource

REPO = Path(__file__).resolve().parent.parent

FLOOR_BLOCK = 8 << 20  # bytes per write, hash and checksum call of the floor
DIRECT_ALIGN = 4096  # O_DIRECT's alignment of buffer, offset and length
GUNZIP_PIECE = 1 << 20  # compressed bytes per inflate call of the floor


# Runs argv[1:] and prints its wall time and peak RSS. A process started
# straight from this benchmark would inherit this process's own peak RSS (Linux
# keeps ru_maxrss across fork and exec, and this process holds the 10x IDX
# data while writing it), so a small fresh interpreter starts the measured one.
# The CPU time is the child's and that of every process it waited for
# (user and sys, all threads), as ``wait4`` reports it.
_MEASURE = """
import os, resource, subprocess, sys, time
start = time.perf_counter()
child = subprocess.Popen(sys.argv[1:], stdout=subprocess.DEVNULL)
_, status, usage = os.wait4(child.pid, 0)
print(time.perf_counter() - start, usage.ru_maxrss, usage.ru_utime, usage.ru_stime,
      os.waitstatus_to_exitcode(status))
"""


@dataclasses.dataclass(frozen=True)
class Measured:
    """One child process: wall seconds, CPU seconds (user, sys) and peak RSS."""

    wall: float
    user: float
    sys: float
    rss_mib: float

    @property
    def cpu(self) -> float:
        return self.user + self.sys


def run_measured(cmd: list[str], tree: Path = REPO) -> Measured:
    """Wall time, CPU time and peak RSS of one child process, run in ``tree``."""
    result = subprocess.run([sys.executable, "-c", _MEASURE, *cmd], cwd=tree,
                            capture_output=True, text=True, env=child_env(tree))
    wall, maxrss, user, system, code = result.stdout.split()
    if int(code) != 0:
        raise RuntimeError(f"{cmd} failed:\n{result.stderr[-3000:]}")
    return Measured(float(wall), float(user), float(system), int(maxrss) / 1024)


TEST_DIGITS = 10_000  # the test split carved from the real training digits
STARTUP_DIGITS = 100  # per split, for the job's fixed cost
WALL_GOAL, CPU_GOAL = 2.0, 2.5  # job wall and CPU time over the floor's serial sum


def load_digits(mnist_dir: Path | None) -> tuple[np.ndarray, np.ndarray]:
    """(images, labels) to tile: the real training digits in ``mnist_dir``, or
    the offline sample's 4,000 when no folder is given."""
    if mnist_dir is None:
        digits = next(SampleSource().read("train", None))
        return digits.images, digits.labels
    images_name, labels_name = idx.MNIST_FILES["train"]
    return idx.decode_split((mnist_dir / images_name).read_bytes(),
                            (mnist_dir / labels_name).read_bytes(),
                            str(mnist_dir / images_name), str(mnist_dir / labels_name))


def write_idx(folder: Path, factor: int, images: np.ndarray, labels: np.ndarray,
              sizes: dict[str, int] | None = None) -> None:
    """``factor`` x MNIST's split sizes (or ``sizes``) from real digits, as gzip IDX files.

    With MNIST's 60,000 training digits: ``train`` is all of them and ``test``
    the last `TEST_DIGITS` of them (MNIST's own test digits are not in that
    folder), 70,000 records in all, each tiled ``factor`` times.
    """
    sizes = sizes or {"train": 60_000, "test": TEST_DIGITS}
    test = min(sizes["test"], len(labels))
    splits = {"train": np.arange(sizes["train"] * factor) % len(labels),
              "test": len(labels) - test + np.arange(sizes["test"] * factor) % test}
    for split, take in splits.items():
        images_name, labels_name = idx.MNIST_FILES[split]
        (folder / images_name).write_bytes(
            gzip.compress(idx.encode_idx(images[take]), compresslevel=6))
        (folder / labels_name).write_bytes(
            gzip.compress(idx.encode_idx(labels[take].astype(np.uint8))))


def _timed(step) -> tuple[float, float]:
    """(wall seconds, CPU seconds of this process) of ``step()``."""
    start, cpu = time.perf_counter(), time.process_time()
    step()
    return time.perf_counter() - start, time.process_time() - cpu


def gunzip_streamed(data: bytes) -> int:
    """Decompresses gzip ``data`` fed in `GUNZIP_PIECE` pieces, as a streaming
    reader would (zlib checks the trailer's CRC and size); the bytes it held."""
    inflate, size = zlib.decompressobj(wbits=31), 0
    view = memoryview(data)
    for at in range(0, len(data), GUNZIP_PIECE):
        size += len(inflate.decompress(view[at:at + GUNZIP_PIECE]))
    size += len(inflate.flush())
    if not inflate.eof:
        raise ValueError("truncated gzip data")
    return size


def write_direct(blocks: list[bytes], path: Path, buffer: mmap.mmap) -> bool:
    """Writes ``blocks`` back to back into ``path`` past the page cache
    (``O_DIRECT``), through ``buffer`` (`FLOOR_BLOCK` bytes, page-aligned);
    False where the file system does not take it.

    Written apart from the job's own writer (`pipeline.storage.open_uncached`)
    on purpose: the floor must not move when the job's code does.
    """
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_DIRECT", 0)
                     | os.O_CLOEXEC, 0o644)
    except OSError:
        return False
    view, fill, total = memoryview(buffer), 0, 0
    try:
        for block in blocks:
            block = memoryview(block)
            while len(block):
                take = min(len(block), FLOOR_BLOCK - fill)
                view[fill:fill + take] = block[:take]
                fill, total, block = fill + take, total + take, block[take:]
                if fill == FLOOR_BLOCK:
                    os.write(fd, view)
                    fill = 0
        padded = -(-fill // DIRECT_ALIGN) * DIRECT_ALIGN
        view[fill:padded] = bytes(padded - fill)
        if padded:
            os.write(fd, view[:padded])
        os.ftruncate(fd, total)
        return True
    except OSError:
        return False
    finally:
        view.release()
        os.close(fd)


def floor_seconds(data: Path, shards: list[Path], scratch: Path
                  ) -> tuple[dict[str, tuple[float, float]], dict[str, tuple[float, float]]]:
    """(wall, CPU) seconds of the work no converter of this input into these
    shards can skip, by step; and the write's by way of writing.

    Inputs and output are read into memory first (untimed), so each step is
    measured alone: gunzip of every IDX file, writing the shards' bytes into
    one file in large blocks, sha256 and crc32c over the same bytes. The
    gunzip streams (`gunzip_streamed`): decompressing a whole file into one
    buffer costs more, in page faults of fresh memory, than the inflate
    itself. The write is timed buffered and with ``O_DIRECT`` (the job's
    way on a local disk, `write_direct`); the floor takes the lesser wall
    and the lesser CPU time of the two.
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

    gunzip = _timed(lambda: [gunzip_streamed(b) for b in inputs])
    writes = {"buffered": _timed(write)}
    scratch.unlink()
    buffer = mmap.mmap(-1, FLOOR_BLOCK)
    buffer.write(bytes(FLOOR_BLOCK))  # touched before the timing, as the job reuses its own
    direct = {}
    writes["O_DIRECT"] = _timed(lambda: direct.setdefault("ok", write_direct(blocks, scratch,
                                                                             buffer)))
    if not direct["ok"]:
        del writes["O_DIRECT"]
    scratch.unlink(missing_ok=True)
    seconds = {"gunzip": gunzip,
               "write": (min(w for w, _ in writes.values()), min(c for _, c in writes.values())),
               "sha256": _timed(sha256), "crc32c": _timed(crc32c)}
    return seconds, writes


def shard_bytes(output: Path) -> dict[str, bytes]:
    """{file name: bytes} of a job's shards."""
    return {f.name: f.read_bytes() for f in sorted(output.glob("mnist-*"))}


def child_env(tree: Path) -> dict[str, str]:
    """The environment of a child run from the checkout ``tree``."""
    return {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONPATH": str(tree)}


def job_command(data: Path, output: Path) -> list[str]:
    return [sys.executable, "-m", "pipeline", f"--source={data}", f"--output={output}",
            "--runner=DirectRunner", "--overwrite"]


def start_up(work: Path, images: np.ndarray, labels: np.ndarray) -> Measured:
    """The job on a few digits: its fixed cost (interpreter, imports, runner, publish)."""
    data = work / "idx-tiny"
    data.mkdir()
    write_idx(data, 1, images[:STARTUP_DIGITS], labels[:STARTUP_DIGITS],
              sizes={"train": STARTUP_DIGITS, "test": STARTUP_DIGITS})
    measured = run_measured(job_command(data, work / "tiny-out"))
    subprocess.run(["rm", "-rf", str(data), str(work / "tiny-out")], check=True)
    return measured


def profile_stages(py_spy: str, data: Path, output: Path, cpu: float,
                   tree: Path = REPO) -> dict[str, float]:
    """The job of ``tree`` once under py-spy: {stage: seconds}, its samples' shares of ``cpu``."""
    raw = output.parent / "profile.txt"
    subprocess.run([py_spy, "record", "--threads", "--subprocesses", "--rate", "100",
                    "--format", "raw", "--output", str(raw), "--",
                    *job_command(data, output)], cwd=tree, check=True,
                   capture_output=True, env=child_env(tree))
    samples = job_stages.stage_samples(raw.read_text().splitlines())
    raw.unlink()
    subprocess.run(["rm", "-rf", str(output)], check=True)
    return job_stages.stage_seconds(samples, cpu)


def print_breakdown(runs: dict[str, list[dict[str, float]]]) -> None:
    """Median seconds per stage over the profiled runs of each job."""
    names = list(runs)
    print("  CPU by stage (py-spy samples' shares of each job's CPU time, median): "
          + " | ".join(names))
    for stage in (*job_stages.STAGES, "total"):
        cells = []
        for name in names:
            per_run = [sum(run.values()) if stage == "total" else run[stage]
                       for run in runs[name]]
            cells.append(f"{statistics.median(per_run):6.2f} s")
        title = job_stages.STAGE_TITLES.get(stage, "total")
        print(f"    {title:<26} " + " | ".join(cells))


def run_baseline(job, data: Path, work: Path, baseline: Path, py_spy: str | None,
                 stages: list) -> None:
    """The job of another checkout on the same input, right after this one:
    its time and CPU beside this job's, and whether the shards are the same bytes."""
    old = run_measured(job_command(data, work / "baseline"), baseline)
    same = shard_bytes(work / "baseline") == shard_bytes(work / "beam")
    print(f"         job of {baseline}: {old.wall:.1f} s, CPU {old.cpu:.2f} s, "
          f"RSS {old.rss_mib:.0f} MiB | this/that {job.wall / old.wall:.2f}x wall, "
          f"{job.cpu / old.cpu:.2f}x CPU | shards byte-identical: {same}")
    subprocess.run(["rm", "-rf", str(work / "baseline")], check=True)
    if py_spy:
        stages.append(profile_stages(py_spy, data, work / "baseline", old.cpu, baseline))


def against_floor(job, data: Path, work: Path) -> tuple[float, float]:
    """The floor of this input and the job's shards, measured now; prints it and
    returns the job's wall and CPU time as multiples of the floor's serial sums."""
    floor, writes = floor_seconds(data, sorted((work / "beam").glob("mnist-*")),
                                  work / "floor.bin")
    serial = sum(wall for wall, _ in floor.values())
    serial_cpu = sum(cpu for _, cpu in floor.values())
    wall_ratio, cpu_ratio = job.wall / serial, job.cpu / serial_cpu
    print("         floor: " + ", ".join(f"{k} {v:.2f} s" for k, (v, _) in floor.items())
          + f" = {serial:.2f} s | job/floor {wall_ratio:.2f}x")
    print("         floor's write, the lesser wall and CPU of: " + ", ".join(
        f"{way} {wall:.2f} s (CPU {cpu:.2f} s)" for way, (wall, cpu) in writes.items()))
    print(f"         job CPU: user {job.user:.2f} s + sys {job.sys:.2f} s = "
          f"{job.cpu:.2f} s | floor CPU {serial_cpu:.2f} s | job CPU/floor CPU "
          f"{cpu_ratio:.2f}x | load {os.getloadavg()[0]:.1f}")
    return wall_ratio, cpu_ratio


def compare(work: Path, factor: int, bar: float, repeats: int, digits,
            py_spy: str | None, baseline: Path | None) -> None:
    """Plain script and job on the same IDX files, alternating, ``repeats`` times."""
    data = work / f"idx-{factor}x"
    data.mkdir()
    write_idx(data, factor, *digits)
    records = 70_000 * factor
    print(f"{factor}x MNIST ({records:,} records, raw images), whole process, "
          f"IDX input {sum(f.stat().st_size for f in data.iterdir()) / 1e6:.0f} MB:")
    ratios, floor_ratios, cpu_ratios = [], [], []
    stages: dict[str, list] = {"this job": []}
    if baseline:
        stages[f"job of {baseline}"] = []
    for attempt in range(repeats):
        plain = run_measured(
            [sys.executable, "-m", "benchmarks.plain_writer", f"--source={data}",
             f"--output={work / 'plain'}"])
        job = run_measured(job_command(data, work / "beam"))
        shards = sum(f.stat().st_size for f in (work / "beam").glob("mnist-*")) / 1e6
        ratios.append(job.wall / plain.wall)
        print(f"  run {attempt + 1}: plain TFRecordWriter {plain.wall:6.1f} s, "
              f"RSS {plain.rss_mib:6.0f} MiB | job (DirectRunner) {job.wall:6.1f} s, "
              f"RSS {job.rss_mib:6.0f} MiB, {shards:.0f} MB of shards | "
              f"job/plain {job.wall / plain.wall:4.2f}x time, "
              f"{job.rss_mib / plain.rss_mib:4.2f}x memory")
        if baseline:
            run_baseline(job, data, work, baseline, py_spy, stages[f"job of {baseline}"])
        wall_ratio, cpu_ratio = against_floor(job, data, work)
        floor_ratios.append(wall_ratio)
        cpu_ratios.append(cpu_ratio)
        if py_spy:
            stages["this job"].append(profile_stages(py_spy, data, work / "beam-profiled",
                                                     job.cpu))
        subprocess.run(["rm", "-rf", str(work / "plain"), str(work / "beam")], check=True)
    median = statistics.median(ratios)
    print(f"  job/plain time ratio: median {median:.2f}x (bar <= {bar}x: "
          f"{'met' if median <= bar else 'MISSED'}), best {min(ratios):.2f}x, "
          f"worst {max(ratios):.2f}x")
    for name, values, goal in (("job/floor time", floor_ratios, WALL_GOAL),
                               ("job CPU/floor CPU", cpu_ratios, CPU_GOAL)):
        print(f"  {name} ratio: median {statistics.median(values):.2f}x "
              f"(goal at 10x <= {goal}x), best {min(values):.2f}x, worst {max(values):.2f}x")
    if py_spy:
        print_breakdown(stages)
    subprocess.run(["rm", "-rf", str(data)], check=True)


def scale(work: Path, gigabytes: float) -> None:
    print("Scale (synthetic, DirectRunner, target 100 MB shards):")
    for fraction in (0.5, 1.0):
        records = int(gigabytes * fraction * 1e9 / contract.RECORD_SIZES["raw"].typical)
        out = work / f"scale-{fraction}"
        job = run_measured(
            [sys.executable, "-m", "pipeline", f"--source=synthetic:{records}",
             f"--output={out}", "--splits=train", "--runner=DirectRunner"])
        manifest = contract.Manifest.from_json((out / "manifest.json").read_text())
        sizes = [s.num_bytes / 1e6 for s in manifest.split("train").shards]
        print(f"  {records:>9,} records, {sum(sizes):7.0f} MB: {len(sizes)} shards of "
              f"{min(sizes):.1f}-{max(sizes):.1f} MB, {job.wall:6.1f} s, "
              f"{records / job.wall:8,.0f} records/s, peak RSS {job.rss_mib:6.0f} MiB")
        subprocess.run(["rm", "-rf", str(out)], check=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scale_gb", type=float, default=0.99)
    parser.add_argument("--skip_scale", action="store_true")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--factors", default="1,10",
                        help="MNIST multiples to compare (1: 70,000 records, 10: 700,000)")
    parser.add_argument("--mnist_dir", type=Path, default=None,
                        help="folder of MNIST's train-*-ubyte.gz files: the digits to "
                             "tile (default: the offline sample's 4,000)")
    parser.add_argument("--py_spy", default=None,
                        help="py-spy executable: profile each job run once more and "
                             "print its CPU by stage")
    parser.add_argument("--baseline", type=Path, default=None,
                        help="another checkout of this project: its job runs after each "
                             "job run too (A/B in one invocation; output compared)")
    args = parser.parse_args()
    bars = {1: 1.5, 10: 1.3}
    digits = load_digits(args.mnist_dir)
    with tempfile.TemporaryDirectory(prefix="pipeline-bench-") as tmp:
        work = Path(tmp)
        fixed = start_up(work, *digits)
        print(f"Job start-up ({STARTUP_DIGITS} + {STARTUP_DIGITS} digits: interpreter, "
              f"imports, runner, publish): {fixed.wall:.2f} s wall, CPU user "
              f"{fixed.user:.2f} s + sys {fixed.sys:.2f} s, RSS {fixed.rss_mib:.0f} MiB "
              f"| load {os.getloadavg()[0]:.1f}")
        for factor in map(int, args.factors.split(",")):
            compare(work, factor, bars.get(factor, 1.3), args.repeats, digits, args.py_spy,
                    args.baseline)
        if not args.skip_scale:
            scale(work, args.scale_gb)


if __name__ == "__main__":
    main()
