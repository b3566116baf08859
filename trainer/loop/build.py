"""Builds the controller's parts for one run and hands them in (`build_controller`).

Both inner loops are wired here, the same way: each gets the model, the
optimizer (custom loop) and a function giving the training stream as it
stands at a global step (`trainer.data.input_pipeline.train_input`).
"""

from __future__ import annotations

import dataclasses
import functools
import time
from typing import Callable, Sequence

import tf_keras as keras

import mnist_contract as contract
from trainer import strategy as strategy_lib
from trainer.data import input_pipeline
from trainer.loop import actions, batch_norm, summaries
from trainer.loop.controller import Controller, Parts
from trainer.loop.custom_loop import CustomLoop
from trainer.loop.evaluator import Evaluator
from trainer.loop.keras_loop import KerasLoop
from trainer.run.preflight import Run
from trainer.run import outputs, resume
from trainer.run.checkpoints import RunCheckpoints
from trainer.run.claim import Claim
from trainer.run.plan import StepSettings
from trainer.run.preemption import StopSignals


def inner_loop(run: Run, model: keras.Model, optimizer, callbacks: Sequence = ()):
    """The ``--loop`` inner loop: `KerasLoop` or `CustomLoop`."""
    config, plan, strategy = run.config, run.plan, run.strategy
    stream = functools.partial(input_pipeline.train_input, strategy, run.train_files,
                               run.reading)

    def train_stream(step: int, postprocess=None):
        return stream(start_step=step, postprocess=postprocess)
    if config.loop == "keras":
        return KerasLoop(model, train_stream, callbacks, verbose=config.verbose)
    step_settings = StepSettings(plan.global_batch_size, plan.steps_per_execution,
                                 run.model_spec.label_smoothing, run.model_spec.jit_compile)
    return CustomLoop(step_settings, strategy, model, optimizer, train_stream)


def evaluator(run: Run, model: keras.Model) -> Evaluator:
    """The exact evaluation of the whole test split, held to the manifest's count."""
    test_ds, eval_steps = input_pipeline.eval_input(run.strategy, run.test_files, run.reading)
    return Evaluator(run.strategy, model, test_ds, eval_steps,
                     expected_examples=run.test_files.num_examples,
                     origin=contract.join_path(run.config.data, contract.MANIFEST_FILE))


def recalibrator(run: Run, model: keras.Model) -> Callable[[], None]:
    """``--bn_recalibration_examples``: the pass over the train split's first
    examples that recomputes the model's batch-norm statistics (none without
    batch-norm layers or with 0 examples)."""
    layers = batch_norm.batch_norm_layers(model)
    examples = run.config.bn_recalibration_examples
    if not (layers and examples):
        return lambda: None
    # A sample, not a pass to keep: uncached.
    reading = dataclasses.replace(run.reading, cache=False)

    def recalibrate():
        start = time.perf_counter()
        dataset, per_pass = input_pipeline.eval_input(run.strategy, run.train_files, reading)
        steps = batch_norm.recalibration_steps(examples, reading.global_batch_size, per_pass)
        batch_norm.Recalibrator(run.strategy, model, dataset, steps)()
        seen = min(steps * reading.global_batch_size, run.train_files.num_examples)
        print(f"batch norm: statistics of {len(layers)} layers recomputed over "
              f"{seen} train examples in {time.perf_counter() - start:.1f} s",
              flush=True)
    return recalibrate


def build_controller(run: Run, model: keras.Model, optimizer, claim: Claim,
                     callbacks: Sequence = ()) -> Controller:
    """The controller of one run, its parts built here and handed in; those
    that write into ``model_dir`` hold to the run's ``claim`` (`trainer.run.claim`)."""
    config, plan = run.config, run.plan
    evaluate = evaluator(run, model)
    signals = StopSignals()
    share = strategy_lib.sum_over_replicas(run.strategy)
    checkpoints = RunCheckpoints(config.model_dir, run.role, model, optimizer,
                                 resume.saved_settings(config, plan.steps_per_epoch),
                                 keep=config.keep_checkpoints, restart=config.restart,
                                 share=share, replicas=plan.replicas, claim=claim)
    logs_dir = run.role.write_dir(config.model_dir, outputs.LOGS)
    writers = summaries.Summaries(
        logs_dir, config, plan.steps_per_epoch,
        preview=lambda: summaries.train_preview(config.seed, model, run.train_files),
        before_write=claim.check)
    profile = ([actions.Profiler(config.profile_steps, logs_dir, before_write=claim.check)]
               if config.profile_steps else [])
    parts = Parts(inner_loop(run, model, optimizer, callbacks), evaluate, checkpoints,
                  writers, profile, signals=signals, share=share,
                  check_inputs=run.pin.check, recalibrate=recalibrator(run, model))
    run.role.log_write_dirs(config.model_dir)
    return Controller(parts, plan)
