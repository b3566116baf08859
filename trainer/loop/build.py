"""Builds the controller's parts for one run and hands them in (`build_controller`).

Both inner loops are wired here, the same way: each gets the model, the
optimizer (custom loop) and a function giving the training stream as it
stands at a global step (`trainer.data.input_pipeline.train_input`).
"""

from __future__ import annotations

import functools
from typing import Sequence

import trainer  # noqa: F401  (sets TF_USE_LEGACY_KERAS before TF loads)
import tf_keras as keras

import mnist_contract as contract
from trainer import strategy as strategy_lib
from trainer.data import input_pipeline
from trainer.loop import actions, summaries
from trainer.loop.controller import Controller, Schedule
from trainer.loop.custom_loop import CustomLoop
from trainer.loop.evaluator import Evaluator
from trainer.loop.keras_loop import KerasLoop
from trainer.preflight import Run
from trainer.run import outputs
from trainer.run.checkpoints import RunCheckpoints
from trainer.run.claim import Claim
from trainer.run.preemption import StopSignals


def inner_loop(run: Run, model: keras.Model, optimizer, callbacks: Sequence = ()):
    """The ``--loop`` inner loop: `KerasLoop` or `CustomLoop`."""
    config, strategy = run.config, run.strategy
    stream = functools.partial(input_pipeline.train_input, strategy, run.train_files, config)

    def train_stream(step: int, postprocess=None):
        return stream(start_step=step, postprocess=postprocess)
    if config.loop == "keras":
        return KerasLoop(config, model, train_stream, callbacks)
    return CustomLoop(config, strategy, model, optimizer, train_stream)


def evaluator(run: Run, model: keras.Model) -> Evaluator:
    """The exact evaluation of the whole test split, held to the manifest's count."""
    test_ds, eval_steps = input_pipeline.eval_input(run.strategy, run.test_files, run.config)
    return Evaluator(run.strategy, model, test_ds, eval_steps,
                     expected_examples=run.test_files.num_examples,
                     origin=contract.join_path(run.config.data, contract.MANIFEST_FILE))


def build_controller(run: Run, model: keras.Model, optimizer, claim: Claim,
                     callbacks: Sequence = ()) -> Controller:
    """The controller of one run, its parts built here and handed in; those
    that write into ``model_dir`` hold to the run's ``claim`` (`trainer.run.claim`)."""
    config = run.config
    evaluate = evaluator(run, model)
    signals = StopSignals()
    share = strategy_lib.sum_over_replicas(run.strategy)
    checkpoints = RunCheckpoints(config, run.role, model, optimizer, run.steps_per_epoch,
                                 share=share, replicas=run.strategy.num_replicas_in_sync,
                                 claim=claim)
    logs_dir = run.role.write_dir(config.model_dir, outputs.LOGS)
    writers = summaries.Summaries(
        logs_dir, config, run.steps_per_epoch,
        preview=lambda: summaries.train_preview(config, model, run.train_files),
        before_write=claim.check)
    profile = ([actions.Profiler(config.profile_steps, logs_dir, before_write=claim.check)]
               if config.profile_steps else [])
    controller = Controller(
        inner_loop(run, model, optimizer, callbacks), evaluate, checkpoints, writers, profile,
        schedule=Schedule.of(config, run.steps_per_epoch), signals=signals, share=share,
        check_inputs=run.pin.check)
    run.role.log_write_dirs(config.model_dir)
    return controller

