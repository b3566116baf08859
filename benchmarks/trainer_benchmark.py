#!/usr/bin/env python3
"""Trainer throughput ratios, each measured within one run on this machine.

    python benchmarks/trainer_benchmark.py [--examples=20000] [--batch=128]

1. Input: examples/s of the trainer's TFRecord pipeline (`trainer.data`,
   training mode: interleave, shuffle, repeat, batch, vectorized parse,
   normalize) ÷ examples/s of the same arrays through ``from_tensor_slices``
   with the same shuffle/batch/normalize. Bar: >= 0.8. Measured twice: as
   read from the files every epoch, and with ``--cache`` (after the first
   epoch, records come from memory).
2. Keras: steps/s of ``fit`` with ``steps_per_execution=50`` ÷ with ``=1``,
   small model. Bar: >= 1.3. Measured as the trainer runs ``fit``
   (`trainer.keras_loop`, default ``verbose=1``): with the progress bar
   (written to /dev/null) and a TensorBoard callback. The progress bar reads
   the metrics back to Python after every call, so at ``=1`` every step ends
   with a host sync; a second line gives the same ratio with ``verbose=0``
   (no per-step reads), for reference.
3. Custom loop: steps/s of the multi-step ``tf.function`` (50 steps per call)
   ÷ the single-step one. Bar: >= 1.25.

A reference line times ``fit`` on a linear model (almost no compute per
step), which shows the per-step cost that steps_per_execution removes (Python
loop, callbacks, function dispatch); the ratio for a real model is then
(step + that cost) / step, so it shrinks as the step's own time grows.

The data is synthetic (class prototypes + noise, `tests/trainer_data.py`),
written as TFRecord shards to a temporary directory. Each timing follows a
warm-up (tracing, first fill of buffers), and each ratio's two sides are
timed alternately, ``--repeats`` times, taking each side's best; the ratios
are what transfers to other machines, not the absolute rates.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import trainer  # noqa: E402,F401  (TF_USE_LEGACY_KERAS before TensorFlow)
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
import tf_keras as keras  # noqa: E402

from tests import trainer_data  # noqa: E402
from trainer import custom_loop, data, model as model_lib  # noqa: E402

BARS = {"input": 0.8, "input_cached": 0.8, "keras": 1.3, "custom": 1.25}


def rate(fn, units: int) -> float:
    t0 = time.perf_counter()
    fn()
    return units / (time.perf_counter() - t0)


def best_of(repeats: int, a, b) -> tuple[float, float]:
    """Alternates the two measurements and keeps each one's best."""
    ra, rb = [], []
    for _ in range(repeats):
        ra.append(a())
        rb.append(b())
    return max(ra), max(rb)


def input_ratio(split: data.SplitFiles, images, labels, batch: int, batches: int,
                repeats: int, cache: bool = False) -> tuple[float, float]:
    records = data.SplitInput(split, batch, training=True, shuffle_buffer=10_000,
                              cache=cache)
    ds_records = records.dataset_fn(tf.distribute.InputContext())

    def normalize(x, y):
        return tf.cast(x, tf.float32) / 255.0, y

    ds_arrays = (tf.data.Dataset.from_tensor_slices((images, labels))
                 .shuffle(10_000).repeat().batch(batch, drop_remainder=True)
                 .map(normalize, num_parallel_calls=tf.data.AUTOTUNE)
                 .prefetch(tf.data.AUTOTUNE))
    it_records, it_arrays = iter(ds_records), iter(ds_arrays)

    def drain(it):
        def go():
            for _ in range(batches):
                next(it)
        return go

    for it in (it_records, it_arrays):  # warm-up: fill shuffle buffers
        drain(it)()
    return best_of(repeats, lambda: rate(drain(it_records), batches * batch),
                   lambda: rate(drain(it_arrays), batches * batch))


def linear_model() -> keras.Model:
    """Almost no compute per step: shows what steps_per_execution can save."""
    return keras.Sequential([keras.layers.Input((28, 28, 1)), keras.layers.Flatten(),
                             keras.layers.Dense(10)])


def keras_ratio(split: data.SplitFiles, batch: int, steps: int, repeats: int,
                build=lambda: model_lib.build_model("small"),
                verbose: int = 1) -> tuple[float, float]:
    """fit spe=50 and spe=1 steps/s; ``verbose=1`` as the trainer runs fit.

    With ``verbose=1`` the progress bar goes to /dev/null and a TensorBoard
    callback (epoch summaries, as in `trainer.keras_loop`) is attached.
    """
    strategy = tf.distribute.get_strategy()
    dist = data.SplitInput(split, batch, training=True, keras=True).distribute(strategy)

    class EpochTimer(keras.callbacks.Callback):
        """Times the epoch alone, not fit()'s set-up."""
        seconds = 0.0

        def on_epoch_begin(self, epoch, logs=None):
            self.t0 = time.perf_counter()

        def on_epoch_end(self, epoch, logs=None):
            EpochTimer.seconds = time.perf_counter() - self.t0

    def compiled(spe):
        model = build()
        model.compile(optimizer=keras.optimizers.Adam(1e-3),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                      metrics=["accuracy"], steps_per_execution=spe)
        model.fit(dist, epochs=1, steps_per_epoch=steps, verbose=0)  # warm-up
        return model

    m50, m1 = compiled(50), compiled(1)
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
        return best_of(repeats, fit(m50), fit(m1))
    finally:
        tf.io.gfile.rmtree(logs)


def custom_ratio(split: data.SplitFiles, batch: int, steps: int,
                 repeats: int) -> tuple[float, float]:
    strategy = tf.distribute.get_strategy()
    dist = data.SplitInput(split, batch, training=True).distribute(strategy)

    def loop(spe):
        options = custom_loop.LoopOptions(epochs=1, steps_per_epoch=steps,
                                          global_batch_size=batch, steps_per_execution=spe)
        lp = custom_loop.CustomLoop(strategy, "small", 1e-3, options)
        it = iter(dist)
        lp.train(it, steps)  # warm-up
        float(lp.train_loss.result())
        return lp, it

    (multi, it_m), (single, it_s) = loop(50), loop(1)

    def run(lp, it):
        def go():
            lp.train(it, steps)
            float(lp.train_loss.result())  # wait for the last step
        return lambda: rate(go, steps)
    return best_of(repeats, run(multi, it_m), run(single, it_s))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--examples", type=int, default=20_000)
    p.add_argument("--shards", type=int, default=8)
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--input_batches", type=int, default=1000)
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args()

    print(f"TensorFlow {tf.__version__}, tf-keras {keras.__version__}, "
          f"{os.cpu_count()} CPU(s); batch {args.batch}; small model "
          f"({model_lib.build_model('small').count_params():,} parameters)")
    with tempfile.TemporaryDirectory() as tmp:
        trainer_data.write_dataset(tmp, num_train=args.examples, num_test=10,
                                   train_shards=args.shards, test_shards=1)
        split = data.split_files(tmp, data.load_manifest(tmp), "train")
        images, labels = trainer_data.make_arrays(args.examples, 0)
        results = {}
        shards, arrays = input_ratio(split, images, labels, args.batch,
                                     args.input_batches, args.repeats)
        results["input"] = (shards, arrays, "examples/s", "TFRecord shards",
                            "from_tensor_slices")
        shards, arrays = input_ratio(split, images, labels, args.batch,
                                     args.input_batches, args.repeats, cache=True)
        results["input_cached"] = (shards, arrays, "examples/s",
                                   "TFRecord shards, --cache", "from_tensor_slices")
        s50, s1 = keras_ratio(split, args.batch, args.steps, args.repeats)
        results["keras"] = (s50, s1, "steps/s",
                            "fit (progress bar) steps_per_execution=50", "=1")
        s50, s1 = keras_ratio(split, args.batch, args.steps, args.repeats, verbose=0)
        results["keras_quiet"] = (s50, s1, "steps/s",
                                  "reference, fit verbose=0: spe=50", "=1")
        s50, s1 = keras_ratio(split, args.batch, args.steps, args.repeats, linear_model,
                              verbose=0)
        results["keras_linear"] = (s50, s1, "steps/s",
                                   "reference, linear model: fit spe=50", "=1")
        multi, single = custom_ratio(split, args.batch, args.steps, args.repeats)
        results["custom"] = (multi, single, "steps/s", "custom multi-step (50)",
                             "single-step")
    ok = True
    for key, (a, b, unit, name_a, name_b) in results.items():
        ratio = a / b
        line = f"{key:12s} {name_a} {a:,.1f} {unit} / {name_b} {b:,.1f} {unit} = {ratio:.2f}x"
        if key in BARS:
            passed = ratio >= BARS[key]
            ok &= passed
            line += f" (bar {BARS[key]}x: {'met' if passed else 'MISSED'})"
        print(line)
    s50, s1 = results["keras_linear"][:2]
    print(f"steps_per_execution saves ~{1000 / s1 - 1000 / s50:.2f} ms per step here "
          f"(linear model); a small-model step takes "
          f"{1000 / results['keras'][0]:.2f} ms even at steps_per_execution=50")
    for key in ("keras", "custom"):
        a, b = results[key][:2]
        if a / b < BARS[key]:
            saved, step = 1000 / b - 1000 / a, 1000 / a
            print(f"{key}: bar missed because multi-step execution only removes the "
                  f"per-step cost outside the graph ({saved:.2f} ms here), while the "
                  f"small CNN's step itself takes {step:.2f} ms on {os.cpu_count()} CPU "
                  f"core(s); the bar needs that cost to be >= "
                  f"{(BARS[key] - 1) * 100:.0f}% of the step "
                  f"(>= {(BARS[key] - 1) * step:.2f} ms)")
    if results["input"][0] / results["input"][1] < BARS["input"]:
        print("input: bar missed; the TFRecord side does what from_tensor_slices does "
              "plus reading, un-blocking and parsing every record "
              "(tf.io.parse_example), on the same CPU cores")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
