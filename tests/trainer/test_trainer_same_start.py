"""Multi-worker: the workers' check that they resume at one step
(`RunCheckpoints._check_same_start`), in-process with a recorded collective;
tests/trainer/test_trainer_multiworker_preemption.py runs it on two workers."""

from __future__ import annotations

import pytest
import tensorflow as tf
import tf_keras

from trainer.errors import TrainerError
from trainer.run import outputs
from trainer.run.checkpoints import RunCheckpoints


class _Collective:
    """Sums as the other worker's step would make them; ``then`` is what the
    following calls do (None: answer zeros)."""

    def __init__(self, other_step: int, then: Exception | None = None):
        self.other, self.then, self.calls = other_step, then, []

    def __call__(self, values):
        self.calls.append(list(values))
        if len(self.calls) == 1:
            step, square = values
            return [step + self.other, square + self.other ** 2]
        if self.then is not None:
            raise self.then
        return [0.0] * len(values)


def _restore(tmp_path, share) -> int:
    model = tf_keras.Sequential([tf_keras.layers.Dense(1)])
    model.build((None, 2))
    checkpoints = RunCheckpoints(str(tmp_path), outputs.Role(), model,
                                 tf_keras.optimizers.Adam(), {}, share=share, replicas=2)
    return checkpoints.restore()


def test_workers_at_one_step_agree_in_one_collective(tmp_path):
    share = _Collective(other_step=0)
    assert _restore(tmp_path, share) == 0
    assert share.calls == [[0, 0]]


@pytest.mark.parametrize("then", [None, tf.errors.UnavailableError(None, None, "Socket closed"),
                                  tf.errors.AbortedError(None, None, "aborted")],
                         ids=["answered", "peer-gone", "aborted"])
def test_a_mismatch_waits_for_every_worker_then_is_reported(tmp_path, then):
    """A worker that saw the mismatch joins a second collective before it
    leaves: a peer still taking the first one's sums does not lose them to a
    closed socket. That second one failing changes nothing."""
    share = _Collective(other_step=12, then=then)
    with pytest.raises(TrainerError, match="the workers would resume at different steps "
                                           r"\(this one at 0\)"):
        _restore(tmp_path, share)
    assert share.calls == [[0, 0], [0, 0]]
