"""What the commands answer before TensorFlow loads, and without it.

A mistyped local path answers before TensorFlow's seconds of import; a
Python without TensorFlow (or Beam) gets one line naming the package. Both
are run as the user runs them, in a process whose ``import tensorflow``
(or ``import apache_beam``) fails as on a Python without it: a path's line
that arrives there arrived without TensorFlow. Also the inputs that would
block or trace back once TensorFlow is there: a FIFO given as an image, a
``saved_model.pb`` of garbage.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.helpers import REPO
from tests.trainer.trainer_runs import one_error

MISSING = "raise ModuleNotFoundError(\"No module named '{0}'\", name='{0}')\n"


def without(tmp_path, module: str) -> dict:
    """An environment whose ``import MODULE`` fails as on a Python without it."""
    shadow = tmp_path / f"without-{module}"
    (shadow / module).mkdir(parents=True)
    (shadow / module / "__init__.py").write_text(MISSING.format(module))
    return dict(os.environ, PYTHONPATH=os.pathsep.join([str(shadow), str(REPO)]),
                TF_CPP_MIN_LOG_LEVEL="2")


def run(env: dict, *argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", *argv], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=300)


def missing_line(name: str, extra: str) -> str:
    return (f"error: {name} is not installed for {sys.executable}; use .venv/bin/python "
            f"(bash scripts/bootstrap.sh makes it) or pip install '.[{extra}]'\n")


@pytest.fixture
def export_like(tmp_path):
    """A model_dir and a PNG path that pass the checks made before TensorFlow loads."""
    model_dir = tmp_path / "m"
    (model_dir / "export").mkdir(parents=True)
    (model_dir / "export" / "saved_model.pb").write_bytes(b"")
    image = tmp_path / "digit.png"
    image.write_bytes(b"")
    return str(model_dir), str(image)


def test_predict_without_tensorflow_is_one_line(tmp_path, export_like):
    model_dir, image = export_like
    proc = run(without(tmp_path, "tensorflow"), "trainer.predict",
               f"--model_dir={model_dir}", image)
    assert (proc.returncode, proc.stdout, proc.stderr) == (
        1, "", missing_line("TensorFlow", "trainer"))


def test_the_trainer_without_tensorflow_is_one_line(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    (data / "manifest.json").write_text("{}")
    proc = run(without(tmp_path, "tensorflow"), "trainer", f"--data={data}",
               f"--model_dir={tmp_path}/m")
    assert (proc.returncode, proc.stdout, proc.stderr) == (
        1, "", missing_line("TensorFlow", "trainer"))


def test_the_job_without_beam_is_one_line(tmp_path):
    proc = run(without(tmp_path, "apache_beam"), "pipeline", f"--output={tmp_path}/out",
               "--source=synthetic:10", "--runner=DirectRunner")
    assert (proc.returncode, proc.stdout, proc.stderr) == (
        1, "", missing_line("Apache Beam", "pipeline"))


def test_a_wrong_model_dir_answers_before_tensorflow(tmp_path, export_like):
    _, image = export_like
    proc = run(without(tmp_path, "tensorflow"), "trainer.predict",
               f"--model_dir={tmp_path}/nothing", image)
    assert (proc.returncode, proc.stdout, proc.stderr) == (
        2, "", f"error: {tmp_path}/nothing/export: no SavedModel (train with "
               f"--model_dir={tmp_path}/nothing first)\n")


@pytest.mark.parametrize("command", ["trainer", "trainer.predict"])
def test_a_wrong_data_answers_before_tensorflow(tmp_path, export_like, command):
    """A missing folder, and one the job did not convert (it names the command that does)."""
    model_dir = export_like[0] if command == "trainer.predict" else f"{tmp_path}/new"
    env = without(tmp_path, "tensorflow")
    proc = run(env, command, f"--data={tmp_path}/nothing", f"--model_dir={model_dir}")
    assert (proc.returncode, proc.stdout, proc.stderr) == (
        2, "", f"error: {tmp_path}/nothing: data directory not found\n")
    raw = tmp_path / "raw"
    raw.mkdir()
    proc = run(env, command, f"--data={raw}", f"--model_dir={model_dir}")
    assert (proc.returncode, proc.stdout, proc.stderr) == (
        2, "", f"error: {raw}/manifest.json: no manifest.json (not a complete pipeline "
               "output; the pipeline writes it last); convert the digits with `python -m "
               "pipeline --output=DIR [--source=sample|mnist|IDX_FOLDER]`, then pass "
               "--data=DIR\n")


def test_a_folder_of_idx_files_names_itself_as_the_source(tmp_path, capsys):
    """The trainer's reader (here gs://'s path, past the local check) says the same."""
    from trainer.data import splits
    from trainer.errors import TrainerError
    folder = tmp_path / "mnist"
    folder.mkdir()
    (folder / "train-images-idx3-ubyte.gz").write_bytes(b"")
    with pytest.raises(TrainerError) as error:
        splits.load_manifest(str(folder))
    assert str(error.value) == (
        f"{folder}/manifest.json: no manifest.json (not a complete pipeline output; the "
        f"pipeline writes it last); convert the digits with `python -m pipeline "
        f"--output=DIR --source={folder}`, then pass --data=DIR")


def test_predict_refuses_a_fifo_before_opening_it(tmp_path, export_like):
    """A FIFO named as an image would block the read for ever: refused from its mode."""
    model_dir, _ = export_like
    fifo = tmp_path / "digit.png"
    fifo.unlink()
    os.mkfifo(fifo)
    proc = run(without(tmp_path, "tensorflow"), "trainer.predict",
               f"--model_dir={model_dir}", str(fifo))
    assert (proc.returncode, proc.stdout, proc.stderr) == (
        2, "", f"error: {fifo}: a FIFO, not a regular file; give an image file\n")


def test_predict_reads_no_fifo_in_process(tmp_path):
    from trainer import serving
    from trainer.errors import TrainerError
    fifo = tmp_path / "digit.png"
    os.mkfifo(fifo)
    for read in (serving.read_png, serving.read_image):
        with pytest.raises(TrainerError, match="a FIFO, not a regular file"):
            read(str(fifo))


def test_a_saved_model_pb_of_garbage_is_one_line(model_dir, tmp_path, capsys):
    from trainer import predict
    image = tmp_path / "digit.png"
    image.write_bytes(b"\x89PNG\r\n\x1a\n")
    pb = os.path.join(model_dir, "export", "saved_model.pb")
    with open(pb, "wb") as f:
        f.write(b"garbage, not a protocol buffer")
    assert predict.main([f"--model_dir={model_dir}", str(image)]) == 2
    assert one_error(capsys) == (f"error: {pb}: not a SavedModel (Error parsing message "
                                 "with type 'tensorflow.SavedModel')")
