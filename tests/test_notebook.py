"""notebooks/use_tpus.ipynb, executed on the CPU, offline, with small settings.

The notebook runs in a kernel of this interpreter (ipykernel's own ``python3``
spec, never one installed elsewhere on the machine), through nbclient, with
its parameters set the way papermill sets them: a cell inserted after the one
tagged ``parameters``. The install is skipped (the project is installed
here), the data is the offline sample converted into a temporary folder, the
strategy falls back to 2 logical CPU replicas, and training takes the small
model for 2 epochs. A cell that raises fails the run.
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
from jupyter_client.kernelspec import KernelSpecManager
from jupyter_client.manager import KernelManager
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError

from pipeline.source.sources import parse_source
from tests.helpers import REPO

NOTEBOOK = REPO / "notebooks" / "use_tpus.ipynb"
EPOCHS = 2
BATCH = 128
STEPS_PER_EXECUTION = 10
TRAIN_EXAMPLES = 4000  # the offline sample's train split
REPLICAS = 2  # logical CPUs: strategy.run and training on more than one replica
# Seconds a cell may take: over 20x the slowest, a training run (about 15 s here).
CELL_TIMEOUT = 600


def small_settings(work_dir: Path) -> dict:
    return {"install": False, "work_dir": str(work_dir), "source": "sample",
            "model": "small", "epochs": EPOCHS, "global_batch_size": BATCH,
            "steps_per_execution": STEPS_PER_EXECUTION, "mixed_precision": "none",
            "cpu_replicas": REPLICAS}


def tagged(nb, tag: str) -> int:
    """The index of the one cell tagged ``tag``."""
    (index,) = [i for i, cell in enumerate(nb.cells) if tag in cell.metadata.get("tags", [])]
    return index


def with_parameters(nb, values: dict):
    """The notebook with a cell after the ``parameters`` cell setting ``values``,
    tagged ``injected-parameters``, as papermill inserts one."""
    cell = nbformat.v4.new_code_cell(
        "\n".join(f"{name} = {value!r}" for name, value in values.items()))
    cell.metadata["tags"] = ["injected-parameters"]
    nb.cells.insert(tagged(nb, "parameters") + 1, cell)
    return nb


def this_interpreters_kernel() -> KernelManager:
    """A kernel manager for ipykernel's ``python3`` spec, which runs ``sys.executable``:
    no kernel directory is searched, so no installed spec can name another Python."""
    km = KernelManager(kernel_name="python3",
                       kernel_spec_manager=KernelSpecManager(kernel_dirs=[]))
    assert km.kernel_spec.argv[0] == sys.executable
    return km


def execute(nb, cwd: Path, **env: str):
    """Runs ``nb`` in a kernel started in ``cwd``, with ``env`` over this environment."""
    client = NotebookClient(nb, km=this_interpreters_kernel(), timeout=CELL_TIMEOUT,
                            resources={"metadata": {"path": str(cwd)}})
    client.execute(env={**os.environ, **env})
    return nb


def up_to(nb, tag: str):
    """The notebook's cells up to the one tagged ``tag``, that one included."""
    nb.cells = nb.cells[:tagged(nb, tag) + 1]
    return nb


def offline() -> dict:
    """Environment for a kernel off the internet: every https request goes to a
    closed local port, whatever this machine can reach."""
    closed = "http://127.0.0.1:9"
    return {"https_proxy": closed, "HTTPS_PROXY": closed, "http_proxy": closed,
            "HTTP_PROXY": closed, "no_proxy": "", "NO_PROXY": ""}


def fake_checkout(tmp_path: Path) -> Path:
    """A folder the notebook takes for a checkout (pyproject.toml, trainer/),
    the notebook in its notebooks/; the project itself is imported from PYTHONPATH."""
    checkout = tmp_path / "checkout"
    (checkout / "trainer").mkdir(parents=True)
    (checkout / "notebooks").mkdir()
    (checkout / "pyproject.toml").write_text("")
    return checkout


def source_of(data: Path) -> str:
    return json.loads((data / "manifest.json").read_text())["source"]


def text_of(cell) -> str:
    return "".join(out.get("text", "") for out in cell.get("outputs", [])
                   if out.output_type == "stream")


def pngs_of(cell) -> list[bytes]:
    return [base64.b64decode(out.data["image/png"]) for out in cell.get("outputs", [])
            if out.output_type == "display_data" and "image/png" in out.get("data", {})]


def test_committed_notebook_has_no_outputs_and_one_parameters_cell():
    nb = nbformat.read(NOTEBOOK, as_version=4)
    nbformat.validate(nb)
    code = [cell for cell in nb.cells if cell.cell_type == "code"]
    assert all(not cell.outputs and cell.execution_count is None for cell in code)
    assert tagged(nb, "parameters") == nb.cells.index(code[0])
    assert "/work/" not in NOTEBOOK.read_text() and "/tmp/" not in NOTEBOOK.read_text()


@pytest.mark.slow
def test_notebook_runs_on_cpu_and_shows_data_model_and_results(tmp_path):
    work = tmp_path / "work"
    nb = execute(with_parameters(nbformat.read(NOTEBOOK, as_version=4),
                                 small_settings(work)), tmp_path)
    everything = "".join(text_of(cell) for cell in nb.cells)
    assert "install = False" in everything
    assert f"no TPU here: fell back to MirroredStrategy with {REPLICAS} replica(s)" in everything
    # strategy.run's matmul, on every replica
    assert everything.count(": [[22.0, 28.0], [49.0, 64.0]]") == REPLICAS

    preview = pngs_of(nb.cells[tagged(nb, "preview")])
    assert preview == [(work / "preview.png").read_bytes()]

    steps = EPOCHS * (TRAIN_EXAMPLES // BATCH)
    run_dirs = {p.parent.name: p.parent for p in work.glob("runs/*/*/metrics.json")}
    assert sorted(run_dirs) == ["custom-1", "custom-n", "keras"]
    for name, run_dir in run_dirs.items():
        metrics = json.loads((run_dir / "metrics.json").read_text())
        assert metrics["train_steps"] == steps, name
        assert metrics["test_examples"] == 1000
        assert metrics["replicas"] == REPLICAS
        assert metrics["test_accuracy"] > 0.5, name  # chance is 0.1
        assert (run_dir / "export" / "saved_model.pb").is_file()

    timings = text_of(nb.cells[tagged(nb, "timings")])
    assert "custom loop, steps_per_execution=1 " in timings
    assert f"custom loop, steps_per_execution={STEPS_PER_EXECUTION} " in timings
    assert "ms per step" in timings

    # The same seed, data and steps: the same numbers, and a cell says why.
    finals = {name: json.loads((run_dir / "metrics.json").read_text())
              for name, run_dir in run_dirs.items()}
    assert len({(m["test_accuracy"], m["test_loss"]) for m in finals.values()}) == 1, finals
    same = nb.cells[nb.cells.index(nb.cells[tagged(nb, "timings")]) - 2]
    assert same.cell_type == "markdown"
    assert "print the same losses and the same test accuracy" in same.source

    results = nb.cells[tagged(nb, "results")]
    assert "keras     test_accuracy=" in text_of(results)
    assert len(pngs_of(results)) >= 1  # the confusion matrix (misclassified: if any)
    assert ("confusion matrix: rows = true label (green, 0-9 top to bottom), columns = "
            "predicted label (red, 0-9 left to right)") in text_of(results)
    predictions = nb.cells[tagged(nb, "predictions")]
    assert len(pngs_of(predictions)) == 1
    assert text_of(predictions).count("predicted=") == 16


def test_a_misspelled_option_fails_its_cell_with_its_error(tmp_path):
    nb = with_parameters(nbformat.read(NOTEBOOK, as_version=4), small_settings(tmp_path / "w"))
    training = nb.cells[tagged(nb, "train-keras")]
    assert "steps_per_execution=steps_per_execution" in training.source
    training.source = training.source.replace("steps_per_execution=steps_per_execution",
                                              "steps_per_executon=steps_per_execution")
    with pytest.raises(CellExecutionError) as failure:
        execute(nb, tmp_path)
    assert failure.value.ename == "TypeError"
    assert "steps_per_executon" in failure.value.evalue
    assert [out.output_type for out in training.outputs][-1] == "error"
    after = nb.cells[nb.cells.index(training) + 1:]
    assert all(not cell.get("outputs") for cell in after)


def test_offline_mnist_converts_the_sample_into_the_checkouts_out(tmp_path):
    """``source = "mnist"`` off the internet: one line says the sample is
    converted instead, and it is; by default the outputs go to the checkout's
    out/use_tpus (git ignores it), not beside the notebook."""
    checkout = fake_checkout(tmp_path)
    settings = {k: v for k, v in small_settings(tmp_path).items() if k != "work_dir"}
    nb = up_to(with_parameters(nbformat.read(NOTEBOOK, as_version=4),
                               {**settings, "source": "mnist"}), "convert")
    execute(nb, checkout / "notebooks", XDG_CACHE_HOME=str(tmp_path / "cache"), **offline())
    text = text_of(nb.cells[tagged(nb, "convert")])
    fallback = [line for line in text.splitlines() if "cannot be reached" in line]
    assert len(fallback) == 1 and fallback[0].startswith(
        "source = 'mnist' cannot be reached (error: https://"), text
    assert fallback[0].endswith("converting the offline sample instead, 5,000 real digits "
                                "(not all of MNIST)")
    data = checkout / "out" / "use_tpus" / "mnist"
    assert source_of(data) == parse_source("sample").description
    assert not (checkout / "notebooks" / "use_tpus").exists()
    outputs = ["out/use_tpus/mnist/manifest.json",  # the default, and work_dir = "use_tpus"
               "notebooks/use_tpus/mnist/manifest.json"]  # run from notebooks/
    ignored = subprocess.run(["git", "check-ignore", *outputs], cwd=REPO,
                             capture_output=True, text=True)
    assert ignored.stdout.splitlines() == outputs, ignored.stderr


def test_a_dataset_is_used_again_only_for_its_own_source(tmp_path):
    """The manifest's source decides: a dataset of another source is converted
    over, one of the source asked for is used as it is; a job that fails
    shows its own ``error:`` line, not a traceback."""
    def convert(source: str):
        nb = up_to(with_parameters(nbformat.read(NOTEBOOK, as_version=4),
                                   {**small_settings(tmp_path / "w"), "source": source}),
                   "convert")
        try:
            execute(nb, tmp_path)
        finally:
            cell = nb.cells[tagged(nb, "convert")]
        return text_of(cell), cell

    data = tmp_path / "w" / "mnist"
    convert("sample")
    assert source_of(data) == parse_source("sample").description
    text, _ = convert("synthetic:500")
    assert f"{data} holds {parse_source('sample').description}: converting " \
           "'synthetic:500' over it" in text
    assert source_of(data) == parse_source("synthetic:500").description
    text, _ = convert("synthetic:500")
    assert f"{data}: converted already ({parse_source('synthetic:500').description})" in text

    with pytest.raises(CellExecutionError) as failure:
        convert(str(tmp_path / "no-idx-files"))
    assert failure.value.ename == "JobFailed"
    assert failure.value.evalue == (
        f"error: {tmp_path / 'no-idx-files' / 'train-images-idx3-ubyte.gz'}: source file "
        "not found")
