"""Time to accuracy: the bare trainer command against Keras's ``mnist_convnet`` example.

    python -m benchmarks.time_to_accuracy DATA [--epochs_example=15]
        [--batch_example=128] [--trainer_flags="--epochs=3"] [--work_dir=DIR]

DATA is a folder the pipeline wrote (manifest.json + shards). Both
contenders train on its ``train`` split and validate after every epoch on
its ``test`` split, one after the other in this invocation:

1. the example (`keras_mnist_convnet.py`): keras.io's model and fit on
   in-memory arrays, 15 epochs of batch 128 by default. Before it starts,
   this script reads the split's shards once (each checked against the
   manifest's size and sha256) into an ``.npz`` of the layout
   ``keras.datasets.mnist.load_data`` reads; the example loads it as that
   function does, and reports digests of what it loaded, which must equal
   those of the arrays written.
2. the bare command: ``python -m trainer --data=DATA --model_dir=TMP``
   plus ``--trainer_flags`` (none by default). With no preset flag it runs
   preset ``auto``, which off a TPU is ``cpu``; ``--cpu_replicas`` defaults
   to 0, so on a CPU-only machine it runs the default strategy, one replica
   (add ``--trainer_flags=--cpu_replicas=2`` for two). Its ``metrics.json``
   must name the sha256 of the same manifest.json, and its evaluations the
   test split's count.

Clock: every time is wall time from launching the contender's process, so
interpreter and TensorFlow start-up, reading the data and building the
model count for both; an epoch's time is the moment its validation line is
read from the process's output. The target is the example's final
validation accuracy; each contender's time to target is the first epoch
whose accuracy, at the 4 decimals both print, reaches it. The ratio is
bare ÷ example: below 1.0 the bare command gets there first. Exit status 0
when the ratio is below 1.0, 1 when it is not (or the bare command never
reaches the target), 2 for bad input, 3 when a contender fails.
"""

from __future__ import annotations

import argparse
import dataclasses
import gzip
import hashlib
import io
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable, Optional, Sequence

import numpy as np

import mnist_contract as contract
from benchmarks.keras_mnist_convnet import data_line
from mnist_contract import framing, wire

REPO = Path(__file__).resolve().parent.parent
EXAMPLE_MODULE = "benchmarks.keras_mnist_convnet"
TRAIN, VAL = "train", "test"  # the manifest's splits; "test" is the validation split
BAD_INPUT, CONTENDER_FAILED = 2, 3

_TRAINER_EPOCH = re.compile(r"epoch (\d+)/(\d+) test_loss \S+ test_accuracy ([\d.]+) "
                            r"\((\d+) examples\)")
_EXAMPLE_EPOCH = re.compile(r"epoch (\d+)/(\d+) val_accuracy ([\d.]+)")
_DATA = re.compile(r"^data train=\d+ val=\d+ train_sha256=[0-9a-f]{64} "
                   r"val_sha256=[0-9a-f]{64}$")


class BadInput(Exception):
    """One line naming the file and what is wrong with it."""


class ContenderFailed(Exception):
    """A contender's process ended badly, or reported other digits."""


@dataclasses.dataclass(frozen=True)
class Options:
    data: Path
    epochs_example: int = 15
    batch_example: int = 128
    trainer_flags: tuple[str, ...] = ()
    work_dir: Optional[Path] = None

    def __post_init__(self):
        for name in ("epochs_example", "batch_example"):
            if getattr(self, name) < 1:
                raise BadInput(f"--{name} must be >= 1, not {getattr(self, name)}")
        for flag in self.trainer_flags:
            if flag.split("=", 1)[0] in ("--data", "--model_dir"):
                raise BadInput(f"--trainer_flags: {flag.split('=', 1)[0]} is set by "
                               "the benchmark")


@dataclasses.dataclass(frozen=True)
class Epoch:
    number: int
    of: int
    accuracy: float
    seconds: float  # wall time from launching the process


@dataclasses.dataclass(frozen=True)
class Run:
    name: str
    epochs: tuple[Epoch, ...]
    total_seconds: float  # launch to exit
    output: tuple[str, ...]  # stdout lines

    @property
    def final_accuracy(self) -> float:
        return self.epochs[-1].accuracy


# -- pure functions ---------------------------------------------------------------

def parse_trainer_epoch(line: str) -> Optional[tuple[int, int, float, int]]:
    """``(epoch, epochs, test_accuracy, examples)`` from the trainer's
    end-of-epoch line (`trainer.loop.controller.Controller.end_epoch`), found
    anywhere in the line (Keras's progress output may precede it), else None."""
    m = _TRAINER_EPOCH.search(line)
    return None if m is None else (int(m[1]), int(m[2]), float(m[3]), int(m[4]))


def parse_example_epoch(line: str) -> Optional[tuple[int, int, float]]:
    """``(epoch, epochs, val_accuracy)`` from the example's epoch line, else None."""
    m = _EXAMPLE_EPOCH.search(line)
    return None if m is None else (int(m[1]), int(m[2]), float(m[3]))


def time_to_target(epochs: Sequence[Epoch], target: float) -> Optional[Epoch]:
    """The first epoch whose accuracy reaches ``target``, compared at 4
    decimals (what both contenders print), or None."""
    goal = round(target, 4)
    return next((e for e in epochs if round(e.accuracy, 4) >= goal), None)


def ratio(bare: Optional[Epoch], example: Optional[Epoch]) -> Optional[float]:
    """bare ÷ example time to target; None when either never reaches it."""
    if bare is None or example is None:
        return None
    return bare.seconds / example.seconds


def outcome(example: Run, bare: Run) -> tuple[float, dict[str, Optional[Epoch]],
                                                Optional[float]]:
    """The target (the example's final accuracy at 4 decimals), each run's
    first epoch reaching it by name, and the ratio bare ÷ example."""
    target = round(example.final_accuracy, 4)
    hits = {run.name: time_to_target(run.epochs, target) for run in (example, bare)}
    return target, hits, ratio(hits[bare.name], hits[example.name])


def goal_met(example: Run, bare: Run) -> bool:
    """Whether the bare command reached the target in less time (ratio < 1.0)."""
    r = outcome(example, bare)[2]
    return r is not None and r < 1.0


def report(example: Run, bare: Run) -> list[str]:
    """The lines the benchmark ends with: target, per contender its time to
    target, final accuracy and total time, then the ratio."""
    target, hits, r = outcome(example, bare)
    lines = [f"target (example's final validation accuracy): {target:.4f}"]
    for run in (example, bare):
        hit = hits[run.name]
        reached = ("not reached" if hit is None
                   else f"{hit.seconds:.1f} s (epoch {hit.number}/{hit.of})")
        lines.append(f"{run.name}: time to target {reached}; final accuracy "
                     f"{run.final_accuracy:.4f} after {len(run.epochs)} epoch(s); "
                     f"total {run.total_seconds:.1f} s")
    lines.append("ratio bare/example: " + ("n/a (bare command did not reach the target)"
                                           if r is None else f"{r:.3f}")
                 + " (goal < 1.0: " + ("met" if goal_met(example, bare) else "MISSED")
                 + ")")
    return lines


# -- the data -----------------------------------------------------------------------

def read_manifest(data: Path) -> tuple[contract.Manifest, bytes]:
    """The folder's manifest and its bytes (whose sha256 the trainer's
    metrics.json must name); `BadInput` for a missing folder or manifest, a
    damaged one, or one without the two splits."""
    path = data / contract.MANIFEST_FILE
    if not data.is_dir():
        raise BadInput(f"{data}: no such folder (give the pipeline's output folder)")
    if not path.is_file():
        raise BadInput(f"{path}: no {contract.MANIFEST_FILE} (not a complete pipeline "
                       "output)")
    raw = path.read_bytes()
    try:
        manifest = contract.Manifest.from_json(raw, origin=str(path))
    except contract.ContractError as e:
        raise BadInput(str(e)) from None
    missing = [s for s in (TRAIN, VAL) if s not in manifest.splits]
    if missing:
        raise BadInput(f"{path}: no {' or '.join(missing)} split (has "
                       f"{', '.join(sorted(manifest.splits))})")
    return manifest, raw


def read_split(data: Path, manifest: contract.Manifest, split: str
               ) -> tuple[np.ndarray, np.ndarray]:
    """``(images uint8 [N,28,28], labels uint8 [N])`` of a split, in file order;
    each shard checked against the manifest's size, sha256 and count."""
    images, labels = [], []
    for shard in manifest.split(split).shards:
        path = data / shard.file
        if not path.is_file():
            raise BadInput(f"{path}: missing (listed in {contract.MANIFEST_FILE})")
        blob = path.read_bytes()
        if len(blob) != shard.num_bytes or hashlib.sha256(blob).hexdigest() != shard.sha256:
            raise BadInput(f"{path}: size or sha256 differs from {contract.MANIFEST_FILE}")
        if manifest.compression == "gzip":  # TFRecord GZIP: the whole file is one gzip stream
            blob = gzip.decompress(blob)
        before = len(labels)
        try:
            for record in framing.iter_records(io.BytesIO(blob), str(path)):
                example = wire.decode_example(record, manifest.image_format)
                images.append(example[contract.IMAGE_KEY])
                labels.append(example[contract.LABEL_KEY])
        except ValueError as e:  # FramingError is a ValueError
            raise BadInput(f"{path}: {e}") from None
        if len(labels) - before != shard.num_examples:
            raise BadInput(f"{path}: {len(labels) - before} records, "
                           f"{contract.MANIFEST_FILE} says {shard.num_examples}")
    return (np.stack(images).reshape(-1, 28, 28).astype(np.uint8),
            np.asarray(labels, dtype=np.uint8))


def write_npz(path: Path, train: tuple[np.ndarray, np.ndarray],
              val: tuple[np.ndarray, np.ndarray]) -> str:
    """The arrays in ``keras.datasets.mnist.load_data``'s file layout; returns
    the `data_line` the example must print after loading them."""
    np.savez(path, x_train=train[0], y_train=train[1], x_test=val[0], y_test=val[1])
    return data_line(train[0], train[1], val[0], val[1])


# -- the contenders -------------------------------------------------------------------

def stream(name: str, cmd: Sequence[str], parse: Callable[[str], Optional[tuple]],
           stderr_path: Path) -> Run:
    """Runs ``cmd``, timestamping each line of its output from the launch.

    Its stderr goes to ``stderr_path`` (quoted when it fails). If this
    process is interrupted (Ctrl-C, SIGTERM: `main`), the contender is
    killed rather than left training on a shared machine.
    """
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONUNBUFFERED": "1"}
    with open(stderr_path, "w") as err:
        start = time.perf_counter()
        with subprocess.Popen(list(cmd), cwd=REPO, stdout=subprocess.PIPE, stderr=err,
                              text=True, env=env) as proc:
            try:
                lines, epochs = _read_epochs(proc, start, name, parse)
            except BaseException:
                proc.kill()
                raise
            code = proc.wait()
        total = time.perf_counter() - start
    if code != 0 or not epochs:
        tail = stderr_path.read_text().strip().splitlines()[-5:]
        raise ContenderFailed(f"{name} ({shlex.join(cmd)}) exited {code} after "
                              f"{len(epochs)} epoch line(s); its stderr ends: "
                              + " | ".join(tail))
    return Run(name, tuple(epochs), total, tuple(lines))


def _read_epochs(proc: subprocess.Popen, start: float, name: str,
                 parse: Callable[[str], Optional[tuple]]) -> tuple[list[str], list[Epoch]]:
    """Each output line, and each epoch line timed from ``start`` as it is
    read. Text mode splits at carriage returns too, so an epoch line that
    follows a progress bar's ``\\r`` updates is read when its own newline
    arrives."""
    lines, epochs = [], []
    for line in proc.stdout:
        seconds = time.perf_counter() - start
        lines.append(line.rstrip("\n"))
        found = parse(line)
        if found is not None:
            epochs.append(Epoch(found[0], found[1], found[2], seconds))
            print(f"  {name} epoch {found[0]}/{found[1]} accuracy {found[2]:.4f} "
                  f"at {seconds:.1f} s", flush=True)
    return lines, epochs


def check_example_data(example: Run, expected: str) -> None:
    """The example loaded the digits written for it, in the same order."""
    loaded = [line for line in example.output if _DATA.match(line)]
    if loaded != [expected]:
        raise ContenderFailed(f"example: loaded {loaded or 'no data line'}, "
                              f"expected [{expected!r}]")


def check_bare(model_dir: Path, manifest_raw: bytes, bare: Run, val_count: int) -> str:
    """The bare command read the same manifest and evaluated on the whole
    validation split; returns what it ran (preset, strategy, replicas)."""
    path = model_dir / "metrics.json"
    if not path.is_file():
        raise ContenderFailed(f"bare: exited 0 without {path}")
    metrics = json.loads(path.read_text())
    pinned = metrics["dataset"]["manifest_sha256"]
    if pinned != hashlib.sha256(manifest_raw).hexdigest():
        raise ContenderFailed(f"bare: trained on manifest sha256 {pinned}, not the "
                              "benchmark's")
    counts = {parse_trainer_epoch(line)[3] for line in bare.output
              if parse_trainer_epoch(line) is not None} | {metrics["test_examples"]}
    if counts != {val_count}:
        raise ContenderFailed(f"bare: evaluated on {sorted(counts)} examples, the "
                              f"validation split has {val_count}")
    return (f"preset {metrics['preset']}, {metrics['strategy']} with "
            f"{metrics['replicas']} replica(s), {metrics['epochs']} epochs of "
            f"{metrics['steps_per_epoch']} steps of {metrics['global_batch_size']}")


def example_cmd(npz: Path, options: Options) -> list[str]:
    return [sys.executable, "-m", EXAMPLE_MODULE, f"--npz={npz}",
            f"--epochs={options.epochs_example}", f"--batch_size={options.batch_example}"]


def bare_cmd(model_dir: Path, options: Options) -> list[str]:
    return [sys.executable, "-m", "trainer", f"--data={options.data.resolve()}",
            f"--model_dir={model_dir}", *options.trainer_flags]


def check_trainer_flags(options: Options) -> None:
    """`BadInput` now, rather than after the example's run, if the trainer's
    own parser (``python -m trainer.check_flags``, no TensorFlow) refuses
    ``--trainer_flags``."""
    argv = bare_cmd(Path("model_dir"), options)[3:]
    found = subprocess.run([sys.executable, "-m", "trainer.check_flags", *argv],
                           capture_output=True, text=True)
    if found.returncode != 0:
        line = (found.stderr.strip().splitlines() or ["refused"])[-1]
        raise BadInput(f"--trainer_flags: {line.removeprefix('error: ')}")


def benchmark(options: Options, manifest: contract.Manifest, raw: bytes,
              work: Path) -> int:
    """Both contenders, one after the other, on the folder's splits; prints
    the report; 0 when bare ÷ example is below 1.0, else 1."""
    train, val = (read_split(options.data, manifest, s) for s in (TRAIN, VAL))
    expected = write_npz(work / "mnist.npz", train, val)
    print(f"data {options.data}: {len(train[1])} train, {len(val[1])} validation digits; "
          f"{expected}", flush=True)

    print(f"example: {shlex.join(example_cmd(work / 'mnist.npz', options))}", flush=True)
    example = stream("example", example_cmd(work / "mnist.npz", options),
                     parse_example_epoch, work / "example.stderr")
    check_example_data(example, expected)

    print(f"bare: {shlex.join(bare_cmd(work / 'model', options))}", flush=True)
    bare = stream("bare", bare_cmd(work / "model", options), parse_trainer_epoch,
                  work / "bare.stderr")
    print(f"bare ran: {check_bare(work / 'model', raw, bare, len(val[1]))}", flush=True)

    for line in report(example, bare):
        print(line, flush=True)
    return 0 if goal_met(example, bare) else 1


# -- the command line -----------------------------------------------------------------

def parse_options(argv: Optional[Sequence[str]]) -> Options:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("data", type=Path, help="the pipeline's output folder "
                                                "(manifest.json + shards)")
    parser.add_argument("--epochs_example", type=int, default=15,
                        help="the example's epochs (keras.io: 15)")
    parser.add_argument("--batch_example", type=int, default=128,
                        help="the example's batch size (keras.io: 128)")
    parser.add_argument("--trainer_flags", default="",
                        help="extra flags for the bare command, one string "
                             "(e.g. '--epochs=3 --cpu_replicas=2'); none by default")
    parser.add_argument("--work_dir", type=Path, default=None,
                        help="keep the arrays, logs and model_dir here (a new or "
                             "empty folder); default: a temporary folder, deleted")
    args = parser.parse_args(argv)
    return Options(args.data, args.epochs_example, args.batch_example,
                   tuple(shlex.split(args.trainer_flags)), args.work_dir)


def _run(options: Options) -> int:
    """`benchmark` on the folder's manifest (read first, so that bad input
    leaves nothing behind) in ``--work_dir`` (checked empty) or a temporary folder."""
    manifest, raw = read_manifest(options.data)
    check_trainer_flags(options)
    if options.work_dir is None:
        with tempfile.TemporaryDirectory(prefix="tta-") as tmp:
            return benchmark(options, manifest, raw, Path(tmp))
    if options.work_dir.exists() and not options.work_dir.is_dir():
        raise BadInput(f"{options.work_dir}: not a folder")
    if options.work_dir.exists() and any(options.work_dir.iterdir()):
        raise BadInput(f"{options.work_dir}: not empty (the bare command would resume "
                       "from a model_dir in it)")
    options.work_dir.mkdir(parents=True, exist_ok=True)
    return benchmark(options, manifest, raw, options.work_dir)


def _exit_on_sigterm(signum, frame) -> None:
    """SIGTERM as `SystemExit`, so `stream` kills the running contender."""
    sys.exit(128 + signum)


def main(argv: Optional[Sequence[str]] = None) -> int:
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    try:
        return _run(parse_options(argv))
    except BadInput as e:
        print(f"error: {e}", file=sys.stderr)
        return BAD_INPUT
    except ContenderFailed as e:
        print(f"error: {e}", file=sys.stderr)
        return CONTENDER_FAILED


if __name__ == "__main__":
    sys.exit(main())
