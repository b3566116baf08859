"""One exit-status table for every command (docs/README.md, "Exit status").

Each command's rows, in-process. Rows whose case takes a long run are tested
beside it: SIGINT 130, SIGTERM 143 and SIGHUP 129 in the job
(test_pipeline_interrupt.py) and in verify (test_pipeline_verify.py), SIGTERM 143
and SIGINT 130 in the trainer (test_trainer_preemption.py), storage failing
during the job 1 (test_pipeline_storage_errors.py), a trainer run that
cannot commit its export 1 and a successful run 0 (test_trainer_export_commit.py,
test_trainer_cli.py), predict's bad PNGs 2 and its run on a split 0
(test_trainer_export.py), predict's SIGINT, SIGTERM and SIGHUP
(test_trainer_predict_signals.py); the launchers' rows in tests/launch/.
"""

from __future__ import annotations

import os
import signal

import pytest

from mnist_common import console


def test_the_table():
    assert (console.OK, console.FAILURE, console.BAD_INPUT) == (0, 1, 2)
    assert (console.GAVE_UP, console.TIMED_OUT, console.LOST) == (75, 124, 255)
    assert (console.INTERRUPTED, console.TERMINATED) == (130, 143)
    assert console.stopped_by(signal.SIGHUP) == 129


def test_the_table_users_read_has_a_row_for_every_named_status():
    """docs/README.md, "Exit status": one row per status `console` names, and 128+N."""
    from tests.helpers import REPO
    text = (REPO / "docs" / "README.md").read_text()
    section = text.split("## Exit status", 1)[1].split("\n## ", 1)[0]
    rows = [line.split("|")[1].strip() for line in section.splitlines()
            if line.startswith("| ") and not line.startswith("| status")]
    named = [console.OK, console.FAILURE, console.BAD_INPUT, console.GAVE_UP,
             console.TIMED_OUT, console.LOST]
    assert rows == [*map(str, named), "128+N"]
    for program in ("mnist-launch-dataflow", "mnist-launch-tpu", "python -m trainer.predict"):
        assert program in section


@pytest.fixture
def no_credentials(monkeypatch, tmp_path):
    """google.auth finds no credentials: its key file is missing."""
    monkeypatch.delenv("STORAGE_EMULATOR_HOST", raising=False)
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(tmp_path / "no-key.json"))


def test_pipeline_rows(tmp_path, no_credentials, capsys):
    from pipeline.__main__ import main
    out = str(tmp_path / "out")
    assert main([f"--output={out}", "--bogus_flag=1"]) == 2
    assert main([f"--output={out}", "--source=synthetic:0"]) == 2
    assert main(["--output=gs://bkt/mnist"]) == 1  # the environment, not the flags
    assert "no Google credentials" in capsys.readouterr().err
    assert main([f"--output={out}", "--source=synthetic:40", "--runner=DirectRunner"]) == 0


def test_verify_rows(tmp_path, no_credentials, capsys):
    from pipeline.__main__ import main as convert
    from pipeline.verify import main
    out = str(tmp_path / "out")
    assert convert([f"--output={out}", "--source=synthetic:40"]) == 0
    assert main([out]) == 0
    with pytest.raises(SystemExit) as usage:
        main([out, "--bogus"])
    assert usage.value.code == 2
    assert main([out, "--preview_count=0"]) == 2
    assert main([str(tmp_path)]) == 2  # no manifest: bad input
    assert main(["gs://bkt/mnist"]) == 1
    assert "no Google credentials" in capsys.readouterr().err
    assert main([out, f"--preview={tmp_path}/missing-folder/p.png"]) == 1


def test_trainer_rows(tmp_path, monkeypatch, capsys):
    from tests import trainer_data
    from trainer import __main__ as cli
    from trainer.errors import TrainerError
    from trainer.run import lock as run_lock
    (tmp_path / "empty").mkdir()
    flags = [f"--data={tmp_path}/empty", f"--model_dir={tmp_path}/m"]
    with pytest.raises(SystemExit) as usage:
        cli.main([*flags, "--bogus"])
    assert usage.value.code == 2
    capsys.readouterr()
    assert cli.main([*flags, "--preset=smoke", "--epochs=0"]) == 2  # refused by the config
    assert capsys.readouterr().err.splitlines() == ["error: --epochs must be >= 1, not 0"]

    def unreachable(config):
        raise TrainerError("no TPU behind --tpu=t")
    monkeypatch.setattr(cli, "_quiet_tensorflow_start", lambda config: None)
    monkeypatch.setattr(cli, "strategy_is_tpu", unreachable)
    (tmp_path / "converted").mkdir()  # a local --data is checked first, before TensorFlow
    (tmp_path / "converted" / "manifest.json").write_text("{}")
    assert cli.main([f"--data={tmp_path}/converted", f"--model_dir={tmp_path}/m",
                     "--preset=auto"]) == 1  # while choosing the preset: not a flag
    assert capsys.readouterr().err.splitlines() == ["error: no TPU behind --tpu=t"]
    monkeypatch.undo()
    assert cli.main([*flags, "--preset=smoke"]) == 2  # the dataset: bad input
    assert "no manifest.json" in capsys.readouterr().err
    data, model_dir = str(tmp_path / "data"), str(tmp_path / "held")
    trainer_data.write_dataset(data, num_train=32, num_test=8)
    os.makedirs(model_dir)
    held = run_lock.acquire(model_dir)  # another run holds --model_dir: a run-time failure
    try:
        assert cli.main([f"--data={data}", f"--model_dir={model_dir}", "--preset=smoke",
                         "--global_batch_size=8"]) == 1
    finally:
        held.release()
    assert f"{model_dir}: in use by run {held.run_id}" in capsys.readouterr().err


def test_predict_rows(tmp_path, capsys):
    from trainer import predict
    with pytest.raises(SystemExit) as usage:
        predict.main([f"--model_dir={tmp_path}"])  # neither PNG files nor --data
    assert usage.value.code == 2
    assert predict.main([f"--model_dir={tmp_path}", "digit.png"]) == 2  # no export
    assert "no SavedModel" in capsys.readouterr().err


_SLEEPER = """
import sys, time
from mnist_common.stop import exit_on_signals
with exit_on_signals("demo", note="nothing saved"):
    print("ready", flush=True)
    time.sleep(600)
"""


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP])
def test_exit_on_signals_is_one_line_and_128_plus_n(signum):
    import subprocess
    import sys
    proc = subprocess.Popen([sys.executable, "-c", _SLEEPER], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    assert proc.stdout.readline() == "ready\n"
    proc.send_signal(signum)
    _, err = proc.communicate(timeout=60)  # hang bound; exits within a second here
    assert proc.returncode == 128 + signum
    name = signal.Signals(signum).name
    assert err == f"error: demo: stopped by {name}; nothing saved\n"


def test_exit_on_signals_leaves_an_ignored_signal_ignored():
    import subprocess
    import sys
    code = ("import signal; signal.signal(signal.SIGHUP, signal.SIG_IGN)\n" + _SLEEPER
            + "\n")
    code = code.replace('print("ready", flush=True)',
                        'print("ready", flush=True); import os; '
                        'os.kill(os.getpid(), signal.SIGHUP); print("alive", flush=True)')
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    assert proc.stdout.readline() == "ready\n"
    assert proc.stdout.readline() == "alive\n"
    proc.terminate()
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 143 and err.count("\n") == 1
