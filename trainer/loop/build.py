"""Builds the controller's parts for one run and hands them in (`build_controller`).

Each part is built from the run's values settled by `trainer.run.preflight`:
the inner loop, the TensorBoard writers, the evaluator, the checkpoints and
the batch-norm recalibration. The inner loops and the recalibration are
handed a function giving their stream when they need it (a resumed step's
training stream, the train split's sample at the last step:
`trainer.data.input_pipeline.train_input`, ``eval_input``); the evaluator
gets its stream at once.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Sequence

import tf_keras as keras

import mnist_contract as contract
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


def build_controller(run: Run, model: keras.Model, optimizer, claim: Claim,
                     callbacks: Sequence = ()) -> Controller:
    """The controller of one run, its parts built here and handed in; those
    that write into ``model_dir`` hold to the run's ``claim`` (`trainer.run.claim`)."""
    config, plan, strategy = run.config, run.plan, run.distribution.strategy
    inner = _inner_loop(run, model, optimizer, callbacks)
    logs_dir = run.role.write_dir(config.model_dir, outputs.LOGS)
    writers = summaries.Summaries(
        logs_dir, config, plan.steps_per_epoch,
        preview=lambda: summaries.train_preview(config.seed, model, run.train_files),
        before_write=claim.check)
    profile = ([actions.Profiler(config.profile_steps, logs_dir, before_write=claim.check)]
               if config.profile_steps else [])
    test_ds, eval_steps = input_pipeline.eval_input(strategy, run.test_files, run.reading)
    evaluate = Evaluator(strategy, model, test_ds, eval_steps,
                         expected_examples=run.test_files.num_examples,
                         origin=contract.join_path(config.data, contract.MANIFEST_FILE))
    signals = StopSignals()
    share = run.distribution.share
    checkpoints = RunCheckpoints(config.model_dir, run.role, model, optimizer,
                                 resume.saved_settings(config, plan.steps_per_epoch),
                                 keep=config.keep_checkpoints, restart=config.restart,
                                 share=share, replicas=plan.replicas, claim=claim)
    # A sample of the train split, not a pass to keep: uncached.
    sample = functools.partial(input_pipeline.eval_input, strategy, run.train_files,
                               dataclasses.replace(run.reading, cache=False))
    recalibrate = batch_norm.recalibration(strategy, model, sample,
                                           config.bn_recalibration_examples,
                                           plan.global_batch_size,
                                           run.train_files.num_examples)
    parts = Parts(inner, evaluate, checkpoints, writers, profile, signals=signals,
                  share=share, check_inputs=run.pin.check, recalibrate=recalibrate)
    run.role.log_write_dirs(config.model_dir)
    return Controller(parts, plan)


def _inner_loop(run: Run, model: keras.Model, optimizer, callbacks: Sequence):
    """The ``--loop`` inner loop: `KerasLoop` or `CustomLoop`, each handed a
    function giving the training stream as it stands at a global step."""
    config, plan, strategy = run.config, run.plan, run.distribution.strategy
    stream = functools.partial(input_pipeline.train_input, strategy, run.train_files,
                               run.reading)

    def train_stream(step: int, postprocess=None):
        return stream(start_step=step, postprocess=postprocess)
    if config.loop == "keras":
        return KerasLoop(model, train_stream, callbacks, verbose=config.verbose)
    step_settings = StepSettings(plan.global_batch_size, plan.steps_per_execution,
                                 run.model_spec.label_smoothing, run.model_spec.jit_compile)
    return CustomLoop(step_settings, strategy, model, optimizer, train_stream)
