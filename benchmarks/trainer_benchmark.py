#!/usr/bin/env python3
"""Trainer throughput ratios, each measured within one run on this machine.

    python -m benchmarks.trainer_benchmark [--examples=20000] [--batch=128]
        [--data=DIR] [--ratios=input_memory_1024,input_memory_128]

1. Input: examples/s of the trainer's TFRecord pipeline (`trainer.data.input_pipeline`,
   training mode: interleave, shuffle, repeat, batch, vectorized parse,
   normalize) ÷ examples/s of the same arrays through ``from_tensor_slices``
   with the same shuffle/batch/normalize, uncached. Bar: >= 0.9. Stage
   lines then show where the TFRecord side spends its time.
   In memory (``--cache``): examples/s of the trainer's in-memory path
   (`trainer.data.in_memory`: the share decoded once, each epoch a seeded
   permutation, batches gathered and normalized) ÷ examples/s of the plain
   in-memory gather pipeline (the same uint8 arrays, each epoch
   ``tf.random.shuffle`` of the indices, ``tf.gather`` and normalize), at
   batch 1024 and at 128 whatever ``--batch`` is. Bar: >= 0.9 each. The
   decode happens when the pipeline is built, outside the timed window.
   The parse's checks (every label a class, every image 28x28:
   `trainer.data.input_pipeline.decode_batch`): examples/s of the checked
   parse ÷ the same parse unchecked, on batches in memory. Bar: >= 0.8
   (parsing alone runs at hundreds of thousands of examples/s on 2 cores,
   far above what a training step takes in).
2. The host-bound reference: steps/s of ``fit`` on a linear model (almost
   no compute per step) with ``steps_per_execution=50`` ÷ ``=1``. Bar:
   >= 1.5. It measures the per-step cost outside the graph that multi-step
   execution removes (Python loop, callbacks, function dispatch), which is
   what a TPU step, taking microseconds on the device, is dominated by.
3. Information, no bar (the CNN's step is compute-bound on a CPU): Keras
   ``fit`` spe=50 ÷ 1 with the small CNN, as the trainer runs it (progress
   bar to /dev/null, TensorBoard callback) and with ``verbose=0``; the custom
   loop's multi-step ``tf.function`` (50 steps per call) ÷ single-step. The
   ratio for a real model is (step + saved cost) / step, so it shrinks as
   the step's own time grows; the last lines say by how much here.

The data is synthetic (class prototypes + noise, `synthetic_data.py`),
written as TFRecord shards to a temporary directory. Each timing follows a
warm-up (tracing, first fill of buffers). Each ratio's two sides are then
timed in short windows, alternately, ``--repeats`` times; the ratio is the
median of the per-pair ratios (a pair's two windows are adjacent in time, so
they see the same machine), printed with its interquartile range. On a
shared 2-core VM single windows vary by +-30%, which a best-of-3 of either
side does not cancel. The ratios are what transfers to other machines, not
the absolute rates.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import statistics
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from mnist_common import console  # noqa: E402

console.use_tf_keras()  # before TensorFlow loads
import tensorflow as tf  # noqa: E402
import tf_keras as keras  # noqa: E402

import mnist_contract as contract  # noqa: E402
from benchmarks import synthetic_data  # noqa: E402
from mnist_contract import examples  # noqa: E402
from trainer.config import TrainConfig  # noqa: E402
from trainer.data import input_pipeline, splits  # noqa: E402
from trainer.loop import custom_loop, keras_loop  # noqa: E402
from trainer.model import models as model_lib  # noqa: E402

BARS = {"input": 0.9, "input_memory_1024": 0.9, "input_memory_128": 0.9,
        "parse_checks": 0.8, "keras_linear": 1.5}
MEMORY_BATCHES = (1024, 128)  # the batch sizes of the in-memory ratios


def rate(fn, units: int) -> float:
    t0 = time.perf_counter()
    fn()
    return units / (time.perf_counter() - t0)


@dataclasses.dataclass(frozen=True)
class Paired:
    """Rates of two sides measured in alternating windows (pair i: a[i], b[i])."""

    a: tuple[float, ...]
    b: tuple[float, ...]
    # Process CPU microseconds per unit of each window, where measured.
    cpu_a: tuple[float, ...] = ()
    cpu_b: tuple[float, ...] = ()

    @property
    def ratios(self) -> list[float]:
        return sorted(x / y for x, y in zip(self.a, self.b))

    @property
    def ratio(self) -> float:
        return statistics.median(self.ratios)

    def spread(self) -> str:
        r = self.ratios
        if len(r) < 4:
            return f"{r[0]:.2f}..{r[-1]:.2f}"
        q1, _, q3 = statistics.quantiles(r, n=4)
        return f"{q1:.2f}..{q3:.2f}"


def paired(repeats: int, a, b) -> Paired:
    """Alternates the two measurements ``repeats`` times."""
    ra, rb = [], []
    for _ in range(repeats):
        ra.append(a())
        rb.append(b())
    return Paired(tuple(ra), tuple(rb))


def input_ratio(split: splits.SplitFiles, images, labels, batch: int, batches: int,
                repeats: int) -> Paired:
    """Examples/s of the trainer's input ÷ ``from_tensor_slices``, in paired windows.

    Each window has its pipeline alone: a fresh iterator, a warm-up that
    fills the shuffle buffer, the timed batches, then the iterator is
    deleted. With both iterators alive, one pipeline's background threads
    refill its buffers while the other is being timed.
    """
    def records():
        return input_pipeline.train_dataset(split, batch, tf.distribute.InputContext(),
                                            shuffle_buffer=10_000)

    def normalize(x, y):
        return tf.cast(x, tf.float32) / 255.0, y

    def arrays():
        return (tf.data.Dataset.from_tensor_slices((images, labels))
                .shuffle(10_000).repeat().batch(batch, drop_remainder=True)
                .map(normalize, num_parallel_calls=tf.data.AUTOTUNE))

    warm_up = 10_000 // batch + 50

    def window(build):
        return lambda: timed_window(build, warm_up, batches, batch)
    return paired(repeats, window(records), window(arrays))


def gather_pipeline(images, labels, batch: int) -> tf.data.Dataset:
    """The plain in-memory pipeline: uint8 arrays, each epoch a shuffle of the
    indices cut into batches (the epoch's remainder dropped), gathered and
    normalized."""
    images, labels = tf.constant(images), tf.constant(labels)
    n = int(labels.shape[0])

    def epoch(_):
        order = tf.random.shuffle(tf.range(n, dtype=tf.int64))
        return tf.data.Dataset.from_tensor_slices(
            tf.reshape(order[:n // batch * batch], [-1, batch]))

    def gather(rows):
        return tf.cast(tf.gather(images, rows), tf.float32) / 255.0, tf.gather(labels, rows)
    return (tf.data.Dataset.range(2**62).flat_map(epoch)
            .map(gather, num_parallel_calls=tf.data.AUTOTUNE))


def memory_ratio(split: splits.SplitFiles, images, labels, batch: int, examples: int,
                 repeats: int) -> Paired:
    """Examples/s of the trainer's in-memory path (``--cache`` with a seed) ÷
    `gather_pipeline`'s, in paired windows of ``examples`` examples each."""
    if len(labels) < batch:
        raise SystemExit(f"the in-memory ratio at batch {batch} needs at least {batch} "
                         f"train examples, not {len(labels)}")

    def trainer_side():
        return input_pipeline.train_dataset(split, batch, tf.distribute.InputContext(),
                                            cache=True, seed=0)

    batches = max(1, examples // batch)
    warm_up = max(20, batches // 10)
    cpu_a, cpu_b = [], []

    def window(build, cpu):
        return lambda: timed_window(build, warm_up, batches, batch, cpu)
    pair = paired(repeats, window(trainer_side, cpu_a),
                  window(lambda: gather_pipeline(images, labels, batch), cpu_b))
    return dataclasses.replace(pair, cpu_a=tuple(cpu_a), cpu_b=tuple(cpu_b))


def timed_window(build, warm_up: int, batches: int, batch: int,
                 cpu: list | None = None) -> float:
    """Examples/s of ``batches`` batches of a fresh iterator over ``build()``,
    after ``warm_up`` batches; the iterator is deleted after. ``cpu``: gets
    the process CPU microseconds per example of the window appended (the
    pipeline's threads alone run in the process then)."""
    it = iter(build().prefetch(tf.data.AUTOTUNE))
    for _ in range(warm_up):
        next(it)
    c0, t0 = time.process_time(), time.perf_counter()
    for _ in range(batches):
        next(it)
    seconds, cpu_seconds = time.perf_counter() - t0, time.process_time() - c0
    del it
    if cpu is not None:
        cpu.append(1e6 * cpu_seconds / (batches * batch))
    return batches * batch / seconds


def parse_check_ratio(split: splits.SplitFiles, batch: int, batches: int,
                      repeats: int) -> Paired:
    """Examples/s of `input_pipeline.decode_batch` with its checks ÷ without,
    on 64 serialized batches held in memory (parsing alone), in paired windows."""
    held = (tf.data.TFRecordDataset(list(split.files)).batch(batch, drop_remainder=True)
            .take(64).cache())
    for _ in held:  # fills the cache
        pass

    def window(checked: bool):
        def build():
            return held.repeat().map(
                lambda s: input_pipeline.decode_batch(s, split.image_format, checked),
                num_parallel_calls=tf.data.AUTOTUNE)
        return lambda: timed_window(build, 20, batches, batch)
    return paired(repeats, window(True), window(False))


def _stage_pipelines(split: splits.SplitFiles, images, batch: int) -> dict:
    """The TFRecord side's stages as separate tf.data pipelines, and the arrays
    side's shuffle + batch, each a function building its dataset.

    Rebuilt from the same tf.data ops as `trainer.data.input_pipeline` (reading in blocks
    of ``input_pipeline.RECORDS_PER_READ`` through a parallel interleave, un-blocking,
    shuffling serialized records, batching, one ``tf.io.parse_example`` per
    batch), so each stage's cost shows on its own.
    """
    autotune = tf.data.AUTOTUNE

    def read():
        return tf.data.Dataset.from_tensor_slices(list(split.files)).interleave(
            lambda f: tf.data.TFRecordDataset(f).batch(input_pipeline.RECORDS_PER_READ),
            cycle_length=len(split.files), num_parallel_calls=autotune,
            deterministic=False).unbatch().repeat()

    def parse(serialized):
        feats = tf.io.parse_example(serialized, examples.parse_spec())
        pixels = tf.io.decode_raw(feats[contract.IMAGE_KEY], tf.uint8)
        return (tf.cast(tf.reshape(pixels, (-1,) + contract.IMAGE_SHAPE), tf.float32) / 255.0,
                feats[contract.LABEL_KEY])

    return {
        "read + un-block + batch (serialized)":
            lambda: read().batch(batch, drop_remainder=True),
        "read + un-block + shuffle + batch (serialized)":
            lambda: read().shuffle(10_000).batch(batch, drop_remainder=True),
        "parse + decode + normalize (batches in memory)":
            lambda: read().batch(batch, drop_remainder=True).take(64).cache().repeat()
            .map(parse, num_parallel_calls=autotune),
        "from_tensor_slices shuffle + batch (no normalize)":
            lambda: tf.data.Dataset.from_tensor_slices(images).shuffle(10_000).repeat()
            .batch(batch, drop_remainder=True),
    }


def input_stages(split: splits.SplitFiles, images, batch: int, batches: int,
                 repeats: int) -> dict[str, float]:
    """Microseconds per batch of each stage of `_stage_pipelines`, timed alone."""
    out = {}
    for name, build in _stage_pipelines(split, images, batch).items():
        it = iter(build().prefetch(tf.data.AUTOTUNE))
        for _ in range(min(batches, 200)):  # warm-up
            next(it)

        def go(it=it):
            for _ in range(batches):
                next(it)
        out[name] = 1e6 / max(rate(go, batches) for _ in range(repeats))
        del it, go
    return out


def linear_model() -> keras.Model:
    """Almost no compute per step: shows what steps_per_execution can save."""
    return keras.Sequential([keras.layers.Input((28, 28, 1)), keras.layers.Flatten(),
                             keras.layers.Dense(10)])


class EpochTimer(keras.callbacks.Callback):
    """Times the epoch alone, not fit()'s set-up."""
    seconds = 0.0

    def on_epoch_begin(self, epoch, logs=None):
        self.t0 = time.perf_counter()

    def on_epoch_end(self, epoch, logs=None):
        EpochTimer.seconds = time.perf_counter() - self.t0


def _compiled(build, dataset, spe: int, steps: int) -> keras.Model:
    """A model from ``build`` compiled at ``steps_per_execution=spe``, warmed up."""
    model = build()
    model.compile(optimizer=keras.optimizers.Adam(1e-3),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"], steps_per_execution=spe)
    model.fit(dataset, epochs=1, steps_per_epoch=steps, verbose=0)  # warm-up
    return model


def keras_ratio(split: splits.SplitFiles, batch: int, steps: int, repeats: int,
                build=lambda: model_lib.build_model("small"),
                verbose: int = 1) -> Paired:
    """fit spe=50 and spe=1 steps/s; ``verbose=1`` as the trainer runs fit.

    With ``verbose=1`` the progress bar goes to /dev/null and a TensorBoard
    callback (epoch summaries, as in `trainer.loop.keras_loop`) is attached.
    """
    strategy = tf.distribute.get_strategy()
    config = TrainConfig(data="-", model_dir="-", global_batch_size=batch)
    dist = input_pipeline.train_input(strategy, split, config, postprocess=keras_loop.keras_batch)
    m50, m1 = _compiled(build, dist, 50, steps), _compiled(build, dist, 1, steps)
    logs = tempfile.mkdtemp(prefix="trainer-benchmark-tb-")

    def fit(model):
        def go():
            callbacks = [EpochTimer()]
            if verbose:
                callbacks.append(keras.callbacks.TensorBoard(logs, profile_batch=0))
            with open(os.devnull, "w") as null, contextlib.redirect_stdout(null):
                model.fit(dist, epochs=1, steps_per_epoch=steps, verbose=verbose,
                          callbacks=callbacks)
            return steps / EpochTimer.seconds
        return go
    try:
        return paired(repeats, fit(m50), fit(m1))
    finally:
        tf.io.gfile.rmtree(logs)


def custom_ratio(split: splits.SplitFiles, batch: int, steps: int,
                 repeats: int) -> Paired:
    strategy = tf.distribute.get_strategy()
    dist = input_pipeline.train_input(strategy, split, TrainConfig(
        data="-", model_dir="-", global_batch_size=batch))

    def loop(spe):
        config = TrainConfig(data="-", model_dir="-", epochs=1, steps_per_epoch=steps,
                             global_batch_size=batch, steps_per_execution=spe)
        lp = custom_loop.CustomLoop(config, strategy,
                                    *model_lib.build(config, strategy, steps),
                                    lambda step: dist)
        lp.start(0)
        lp.train(steps)  # warm-up
        float(lp.train_loss.result())
        return lp

    multi, single = loop(50), loop(1)

    def run(lp):
        def go():
            lp.train(steps)
            float(lp.train_loss.result())  # wait for the last step
        return lambda: rate(go, steps)
    return paired(repeats, run(multi), run(single))


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    p.add_argument("--examples", type=int, default=20_000)
    p.add_argument("--shards", type=int, default=8)
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--input_batches", type=int, default=250,
                   help="batches per input window")
    p.add_argument("--steps", type=int, default=150, help="steps per fit/loop window")
    p.add_argument("--repeats", type=int, default=15, help="window pairs per input ratio")
    p.add_argument("--fit_repeats", type=int, default=7,
                   help="window pairs per steps_per_execution ratio")
    p.add_argument("--memory_examples", type=int, default=300_000,
                   help="examples per window of the in-memory ratios")
    p.add_argument("--data", default=None,
                   help="a pipeline output folder whose train split to use instead "
                        "of synthetic data")
    p.add_argument("--ratios", default=None,
                   help="comma-separated ratio names to measure (default: all); the "
                        "stage lines and details come with the full set only")
    return p.parse_args()


def measurements(args: argparse.Namespace, split: splits.SplitFiles, images,
                 labels) -> dict:
    """Every ratio: key → (function measuring its pair, unit, name of a, name of b)."""
    b, n, r, fr, steps = args.batch, args.input_batches, args.repeats, args.fit_repeats, args.steps
    found = {
        "input": (lambda: input_ratio(split, images, labels, b, n, r),
                  "examples/s", "TFRecord shards", "from_tensor_slices uncached"),
        "parse_checks": (lambda: parse_check_ratio(split, b, n, r),
                         "examples/s", "parse with checks", "without"),
        "keras": (lambda: keras_ratio(split, b, steps, fr),
                  "steps/s", "fit (progress bar) steps_per_execution=50", "=1"),
        "keras_quiet": (lambda: keras_ratio(split, b, steps, fr, verbose=0),
                        "steps/s", "reference, fit verbose=0: spe=50", "=1"),
        "keras_linear": (lambda: keras_ratio(split, b, steps, fr, linear_model, verbose=0),
                         "steps/s", "reference, linear model: fit spe=50", "=1"),
        "custom": (lambda: custom_ratio(split, b, steps, fr),
                   "steps/s", "custom multi-step (50)", "single-step"),
    }
    for size in MEMORY_BATCHES:
        found[f"input_memory_{size}"] = (
            lambda size=size: memory_ratio(split, images, labels, size,
                                           args.memory_examples, r),
            "examples/s", f"--cache in memory, batch {size}", "plain gather pipeline")
    return found


def measure(args: argparse.Namespace, split: splits.SplitFiles, images, labels) -> dict:
    """The ratios ``--ratios`` names (all by default): key → (pair, unit, a, b)."""
    found = measurements(args, split, images, labels)
    keys = args.ratios.split(",") if args.ratios else list(found)
    unknown = sorted(set(keys) - set(found))
    if unknown:
        raise SystemExit(f"--ratios: unknown {', '.join(unknown)}; known: "
                         f"{', '.join(found)}")
    return {key: (found[key][0](), *found[key][1:]) for key in keys}


def report_ratios(results: dict) -> bool:
    """One line per ratio; whether every bar (`BARS`) was met."""
    ok = True
    median = statistics.median
    for key, (pair, unit, name_a, name_b) in results.items():
        line = (f"{key:12s} {name_a} {median(pair.a):,.1f} {unit} / {name_b} "
                f"{median(pair.b):,.1f} {unit} = {pair.ratio:.2f}x "
                f"(median of {len(pair.a)} pairs, quartiles {pair.spread()})")
        if key in BARS:
            passed = pair.ratio >= BARS[key]
            ok &= passed
            line += f" (bar {BARS[key]}x: {'met' if passed else 'MISSED'})"
        if pair.cpu_a:
            line += (f"; process CPU per example {median(pair.cpu_a):.2f} us / "
                     f"{median(pair.cpu_b):.2f} us")
        print(line, flush=True)
    return ok


def report_details(results: dict, stages: dict, batch: int) -> None:
    """The input stages, and what steps_per_execution saves per step."""
    median = statistics.median
    inp = results["input"][0]
    print(f"input stages, us per batch of {batch} (each alone; in the pipeline they "
          f"overlap on parallel threads): TFRecord pipeline "
          f"{1e6 * batch / median(inp.a):.0f}, from_tensor_slices pipeline "
          f"{1e6 * batch / median(inp.b):.0f}")
    for name, micros in stages.items():
        print(f"  {name}: {micros:.0f}")
    linear = results["keras_linear"][0]
    saved = 1000 / median(linear.b) - 1000 / median(linear.a)
    print(f"steps_per_execution saves ~{saved:.2f} ms per step here (linear model: "
          f"Python loop, callbacks, function dispatch)")
    for key in ("keras", "keras_quiet", "custom"):
        pair = results[key][0]
        step = 1000 / median(pair.a)
        print(f"{key}: information, no bar: a small-CNN step takes {step:.2f} ms at "
              f"steps_per_execution=50 on {os.cpu_count()} CPU core(s), so removing "
              f"{1000 / median(pair.b) - step:.2f} ms per step gives (step + saved) / step "
              f"= {pair.ratio:.2f}x; on a TPU the step is microseconds and the host cost "
              f"dominates, as in the linear line")


def train_split(args: argparse.Namespace, tmp: str):
    """``(split, images, labels)``: ``--data``'s train split decoded, or
    synthetic data written to ``tmp``."""
    if args.data:
        split = splits.split_files(args.data, splits.load_manifest(args.data), "train")
        arrays = input_pipeline.decode_share(split, tf.distribute.InputContext())
        return (split, arrays[contract.IMAGE_KEY].numpy(),
                arrays[contract.LABEL_KEY].numpy())
    images, labels = synthetic_data.write_dataset(
        tmp, num_train=args.examples, num_test=10, train_shards=args.shards,
        test_shards=1)
    return splits.split_files(tmp, splits.load_manifest(tmp), "train"), images, labels


def main() -> int:
    args = parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        split, images, labels = train_split(args, tmp)
        print(f"TensorFlow {tf.__version__}, tf-keras {keras.__version__}, "
              f"{os.cpu_count()} CPU(s); batch {args.batch}; small model "
              f"({model_lib.build_model('small').count_params():,} parameters); "
              f"{split.num_examples:,} train examples in {len(split.files)} file(s) "
              f"({args.data or 'synthetic'}); load average {os.getloadavg()[0]:.1f}")
        results = measure(args, split, images, labels)
        stages = (None if args.ratios else
                  input_stages(split, images, args.batch, args.input_batches, args.repeats))
    ok = report_ratios(results)
    if stages is not None:
        report_details(results, stages, args.batch)
    print(f"load average at the end {os.getloadavg()[0]:.1f}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
