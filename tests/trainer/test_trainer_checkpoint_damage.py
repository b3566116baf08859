"""Damaged checkpoints cost only themselves: the run resumes from the newest one
that restores and never saves over an intact one.

A two-epoch run (``--steps_per_epoch=4``) leaves ckpt-4 and ckpt-8. Each case damages the state file
or a checkpoint, resumes for a third epoch in this process, and checks where
it resumed and that the intact checkpoints' files are byte-for-byte the same.
"""

from __future__ import annotations

import logging
import os

import pytest

# model_dir, trained: the shared fixtures.
from tests.trainer.trainer_runs import one_error, run
from tests.trainer_data import read_metrics

SPE = ["--steps_per_epoch=4", "--loop=custom"]


def ckpt(model_dir: str, step: int) -> dict:
    folder = os.path.join(model_dir, "checkpoints")
    return {name: open(os.path.join(folder, name), "rb").read()
            for name in os.listdir(folder) if name.startswith(f"ckpt-{step}.")}


def resume(data, model_dir, capsys, *flags) -> tuple[int, str, str]:
    capsys.readouterr()
    code = run(data, model_dir, "--epochs=3", *SPE, *flags)
    out, err = capsys.readouterr()
    return code, out, err


class _Lines(logging.Handler):
    """The messages logged at WARNING and above, but TensorFlow's retracing notice.

    TensorFlow counts a ``tf.function``'s traces per function code object across
    the whole process (``_frequent_tracing_detector``, checked in TF 2.21). A test
    worker runs many trainings in one process, each with its own loop and so its
    own trace, and after five of them the notice appears whatever this run does.
    A run of the command traces each step function once.
    """

    def __init__(self):
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record):
        message = record.getMessage()
        if "triggered tf.function retracing" not in message:
            self.messages.append(message)


@pytest.mark.parametrize("damage", ["garbage", "deleted"])
def test_damaged_state_file_resumes_from_the_newest_checkpoint(trained, model_dir, capsys,
                                                               caplog, damage):
    state = os.path.join(model_dir, "checkpoints", "checkpoint")
    if damage == "garbage":
        with open(state, "w") as f:
            f.write("not a checkpoint state\n")
    else:
        os.remove(state)
    before = {4: ckpt(model_dir, 4), 8: ckpt(model_dir, 8)}
    tf_logger, tf_lines = logging.getLogger("tensorflow"), _Lines()
    tf_logger.addHandler(tf_lines)  # TensorFlow's logger does not propagate to caplog
    try:
        code, out, err = resume(trained[0], model_dir, capsys)
    finally:
        tf_logger.removeHandler(tf_lines)
    assert code == 0, err
    assert "resuming at step 8/12" in out
    assert read_metrics(model_dir)["resumed_from_step"] == 8
    assert {4: ckpt(model_dir, 4), 8: ckpt(model_dir, 8)} == before
    # One warning of the trainer's naming the file; none of TensorFlow's (its
    # parse error, its deprecated state writer).
    what = "unreadable" if damage == "garbage" else "missing"
    assert f"{state}: {what}; rewriting it to name ckpt-8" in caplog.text
    assert tf_lines.messages == [], tf_lines.messages


def test_truncated_newest_checkpoint_falls_back_to_the_earlier_one(trained, model_dir,
                                                                   capsys, caplog):
    data_file = os.path.join(model_dir, "checkpoints", "ckpt-8.data-00000-of-00001")
    with open(data_file, "r+b") as f:
        f.truncate(100)
    before = ckpt(model_dir, 4)
    code, out, err = resume(trained[0], model_dir, capsys)
    assert code == 0, err
    assert "Traceback" not in err
    assert f"{model_dir}/checkpoints/ckpt-8: damaged, skipped" in caplog.text
    assert "resuming at step 4/12" in out
    assert ckpt(model_dir, 4) == before
    result = read_metrics(model_dir)
    assert result["resumed_from_step"] == 4 and result["train_steps"] == 12
    assert len(result["history"]["test_accuracy"]) == 3


def test_no_checkpoint_restores_stops_unless_restart(trained, model_dir, capsys):
    for step in (4, 8):
        with open(os.path.join(model_dir, "checkpoints",
                               f"ckpt-{step}.data-00000-of-00001"), "r+b") as f:
            f.truncate(100)
    before = {4: ckpt(model_dir, 4), 8: ckpt(model_dir, 8)}
    capsys.readouterr()
    assert run(trained[0], model_dir, "--epochs=3", *SPE) == 1
    line = one_error(capsys)
    assert line.startswith(f"error: {model_dir}/checkpoints/ckpt-8: cannot resume from "
                           "this checkpoint (")
    assert "pass --restart to train from step 0" in line
    assert {4: ckpt(model_dir, 4), 8: ckpt(model_dir, 8)} == before  # nothing saved over
    code, out, err = resume(trained[0], model_dir, capsys, "--restart")
    assert code == 0, err
    assert "resuming" not in out
    assert read_metrics(model_dir)["resumed_from_step"] == 0


def test_leftovers_of_a_cut_save_are_removed_with_a_warning(trained, model_dir, capsys,
                                                             caplog):
    temp = os.path.join(model_dir, "checkpoints", "ckpt-10_temp")
    os.makedirs(temp)
    with open(os.path.join(temp, "part-00000-of-00001.data-00000-of-00001"), "wb") as f:
        f.write(b"half")
    code, out, err = resume(trained[0], model_dir, capsys)
    assert code == 0, err
    assert f"{temp}: removing the leftovers of a checkpoint save" in caplog.text
    assert not os.path.exists(temp)
