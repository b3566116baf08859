"""Small trainer runs for the trust tests: in-process (`run`) or as a process (`start`),
and what a run left in its checkpoints (`saved_step`, `final_variables`).

Every run passes ``--preset=smoke`` and tiny sizes, so each takes seconds.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import tensorflow as tf

from tests.helpers import REPO, with_defaults
from trainer import __main__ as cli
from trainer.run import checkpoints, outputs

FLAGS = ["--preset=smoke", "--global_batch_size=8", "--steps_per_execution=2",
         "--verbose=0", "--log_every=1000"]


def run(data: str, model_dir: str, *flags: str) -> int:
    """``python -m trainer`` in this process; returns the exit status. ``flags``
    replace the `FLAGS` of the same name."""
    return cli.main([f"--data={data}", f"--model_dir={model_dir}",
                     *with_defaults(FLAGS, flags)])


def start(data: str, model_dir: str, *flags: str, env: dict = None) -> subprocess.Popen:
    """``python -m trainer`` as a process (stdout and stderr piped, text);
    ``flags`` replace the `FLAGS` of the same name; ``env``: variables to add
    to this process's."""
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", **(env or {}))
    return subprocess.Popen(
        [sys.executable, "-m", "trainer", f"--data={data}", f"--model_dir={model_dir}",
         *with_defaults(FLAGS, flags)],
        cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def errors(err: str) -> list[str]:
    """The ``error:`` lines of a run's stderr (a traceback fails the caller)."""
    assert "Traceback" not in err, err[-3000:]
    return [line for line in err.splitlines() if line.startswith("error: ")]


def one_error(capsys) -> str:
    lines = errors(capsys.readouterr().err)
    assert len(lines) == 1, lines
    return lines[0]


def two_epoch_run(root) -> tuple[str, str]:
    """(data, model_dir): two custom-loop epochs of 4 steps at batch 8 on a
    small dataset under ``root``, leaving ckpt-4 and ckpt-8."""
    from tests import trainer_data
    data = str(root / "data")
    trainer_data.write_dataset(data, num_train=40, num_test=20, train_shards=2,
                               test_shards=1)
    model_dir = str(root / "trained")
    assert run(data, model_dir, "--epochs=2", "--loop=custom", "--steps_per_epoch=4") == 0
    return data, model_dir


def copy_of(model_dir: str, tmp_path) -> str:
    """A copy of ``model_dir`` for one test to change."""
    import shutil
    copy = str(tmp_path / "m")
    shutil.copytree(model_dir, copy)
    return copy


def saved_step(model_dir: str) -> int:
    """The step of the checkpoint a restart will resume from (both loops)."""
    latest = tf.train.latest_checkpoint(os.path.join(model_dir, outputs.CHECKPOINTS))
    return int(latest.rsplit("-", 1)[1]) if latest else 0


def state_file(model_dir: str) -> str:
    """The file a checkpoint manager writes (atomically) once a checkpoint is complete."""
    return os.path.join(model_dir, outputs.CHECKPOINTS, "checkpoint")


def final_variables(model_dir: str) -> dict:
    """Every variable (model and optimizer) of the run's last checkpoint."""
    reader = tf.train.load_checkpoint(
        tf.train.latest_checkpoint(os.path.join(model_dir, outputs.CHECKPOINTS)))
    return {k: reader.get_tensor(k) for k in reader.get_variable_to_shape_map()
            if k.endswith("VARIABLE_VALUE") and not k.startswith("save_counter")
            and not k.startswith(checkpoints.STATE_NAME)}  # the history, compared apart


def free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("localhost", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def start_workers(argv_for, log_level: bool = True, count: int = 2
                  ) -> list[subprocess.Popen]:
    """``count`` worker processes of one cluster (TF_CONFIG on localhost);
    ``argv_for(index)``: worker ``index``'s arguments after the interpreter.

    ``log_level=False``: without TF_CPP_MIN_LOG_LEVEL, as a user starts them
    (``python -m trainer`` then mutes TensorFlow's start-up itself).
    """
    cluster = {"worker": [f"localhost:{p}" for p in free_ports(count)]}
    procs = []
    for index in range(count):
        env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
        if log_level:
            env["TF_CPP_MIN_LOG_LEVEL"] = "2"
        env["TF_CONFIG"] = json.dumps(
            {"cluster": cluster, "task": {"type": "worker", "index": index}})
        procs.append(subprocess.Popen(
            [sys.executable, *argv_for(index)], cwd=REPO, env=env,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    return procs


def finish_workers(procs: list[subprocess.Popen], timeout: int = 240
                   ) -> list[tuple[int, str, str, int]]:
    """Waits for every worker; ``(rc, out, err, pid)`` each (all killed on a timeout)."""
    results = []
    for proc in procs:
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            for p in procs:
                p.kill()
            raise
        results.append((proc.returncode, out, err, proc.pid))
    return results
