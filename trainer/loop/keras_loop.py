"""The Keras inner loop: ``Model.fit`` with ``steps_per_execution``.

``compile(steps_per_execution=N)`` (done in `trainer.model.models.build`)
makes Keras run N steps inside one ``tf.function`` call; on a TPU that
removes a host round trip per step (the "Use TPUs" guide reports ~1.5x),
and on CPU it removes Python and dispatch overhead.

Everything else comes from the shared skeleton. Fit owns its loop, so the
controller cannot drive it as it drives the custom loop
(`trainer.loop.controller.Controller.train`); instead a thin callback adapter
hands each call's end, and each epoch's, to the same
`trainer.loop.controller.Controller` decisions, which log, checkpoint, evaluate
and profile exactly as for the custom loop (fit gets no validation data and
no TensorBoard or checkpoint callbacks of its own).

Checkpoints: fit returns to Python only between train-function calls, so
a ``--checkpoint_every`` boundary inside a call is saved at the end of that
call; `checkpoint_steps` lists where, and the run logs it when that differs
from the custom loop's exact multiples.

Resuming mid-epoch: fit's epochs all have ``steps_per_epoch`` steps, so a
run restored at step s inside epoch e first fits the rest of epoch e alone,
then the remaining epochs. Each fit reads a training stream built for the
step it starts at, so a seeded run sees the batches an uninterrupted one
would have seen.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Callable, Sequence

import tensorflow as tf
import tf_keras as keras

import mnist_contract as contract
from trainer.run.plan import Plan

if TYPE_CHECKING:
    from trainer.loop.controller import Controller

log = logging.getLogger(__name__)


def keras_batch(batch: dict) -> tuple[tf.Tensor, tf.Tensor]:
    """The ``(image, label)`` form ``Model.fit`` takes."""
    return batch[contract.IMAGE_KEY], batch[contract.LABEL_KEY]


class _Hooks(keras.callbacks.Callback):
    """Passes each train-function call's end, and each epoch's, to the controller."""

    def __init__(self, controller: Controller):
        super().__init__()
        self.controller = controller
        self.epoch_start = 0

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch_start = self.controller.step

    def on_train_batch_end(self, batch, logs=None):
        # `batch`: the index in this fit epoch of the last step the call ran.
        self.controller.after_train(self.epoch_start + batch + 1, logs)

    def on_epoch_end(self, epoch, logs=None):
        self.controller.end_epoch(self.controller.step, logs)


def checkpoint_steps(steps_per_epoch: int, per_call: int, every: int,
                     count: int = 3) -> list[int]:
    """The first ``count`` steps (from step 0) at which fit's calls of
    ``per_call`` steps save a ``checkpoint_every=every`` checkpoint inside
    an epoch; the custom loop saves at the multiples of ``every`` themselves."""
    found, step = [], 0
    while every and len(found) < count and step < count * (every + per_call + steps_per_epoch):
        end = min(step + per_call, (step // steps_per_epoch + 1) * steps_per_epoch)
        if end // every > step // every and end % steps_per_epoch:
            found.append(end)
        step = end
    return found


def _log_checkpoint_cadence(plan: Plan) -> None:
    """One line when fit's call boundaries move the ``--checkpoint_every`` saves."""
    steps_per_epoch = plan.steps_per_epoch
    every, per_call = plan.checkpoint_every, plan.steps_per_execution
    keras_steps = checkpoint_steps(steps_per_epoch, per_call, every)
    exact = checkpoint_steps(steps_per_epoch, 1, every)
    if keras_steps != exact:
        log.info("Keras checkpoints after the --steps_per_execution=%d-step call that "
                 "crosses each multiple of --checkpoint_every=%d: %s (the custom "
                 "loop: steps %s, ...)", per_call, every,
                 f"steps {', '.join(map(str, keras_steps))}, ..." if keras_steps
                 else "at epoch ends only",
                 ", ".join(map(str, exact)))


class KerasLoop:
    """``Model.fit`` from the controller's step to the end of the last epoch.

    ``train_stream(step, postprocess)`` gives the distributed training
    dataset as it stands at global step ``step``
    (`trainer.data.input_pipeline.train_input`).
    """

    drives_itself = True  # fit owns its loop; `_Hooks` call the controller back
    prints_progress = True  # fit reports progress itself (Keras' bar, with --verbose)

    def __init__(self, model: keras.Model, train_stream: Callable[..., Any],
                 callbacks: Sequence[keras.callbacks.Callback] = (), verbose: int = 1):
        self.model, self.verbose = model, verbose  # verbose: ``--verbose``
        self.train_stream, self.callbacks = train_stream, tuple(callbacks)

    def start(self, step: int) -> None:
        """Each fit opens its own stream (`fit`)."""

    def fit(self, controller: Controller) -> None:
        """Fits from the controller's step to the end of the last epoch."""
        plan, step = controller.plan, controller.step
        spe = plan.steps_per_epoch
        _log_checkpoint_cadence(plan)
        # Keras appends its own progress bar after the given callbacks, so it would
        # end the bar's line only after the controller printed its epoch line onto
        # it. Given first, the bar ends its line before the controller prints.
        progress = ([keras.callbacks.ProgbarLogger(count_mode="steps")]
                    if self.verbose else [])
        hooks = [*progress, _Hooks(controller), *self.callbacks]
        epoch = step // spe
        if step % spe:  # resumed inside an epoch: finish it first
            self._fit(hooks, step, epoch, epoch + 1, spe - step % spe)
            epoch += 1
        if epoch < plan.epochs:
            self._fit(hooks, epoch * spe, epoch, plan.epochs, spe)

    def _fit(self, hooks: list, start: int, first_epoch: int, epochs: int,
             steps: int) -> None:
        dataset = self.train_stream(start, postprocess=keras_batch)
        self.model.fit(dataset, initial_epoch=first_epoch, epochs=epochs,
                       steps_per_epoch=steps, callbacks=hooks, verbose=self.verbose)
