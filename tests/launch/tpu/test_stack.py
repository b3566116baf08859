"""The software a TPU VM host gets, checked here without a TPU.

`tests.launch.tpu.stack` builds the host's environment with the launcher's own
install script (tensorflow-tpu, the pinned libtpu, tf-keras, the project
wheel). On it: TensorFlow imports with libtpu loaded, the trainer asked for
a TPU that is not there ends with one line, and the trainer tests that
cover what a TPU run uses (both loops, two replicas, bfloat16 and the TPU
preset, resume, export, predict) pass on that TensorFlow with libtpu left
unloaded (``TPU_LOAD_LIBRARY=0``: tensorflow-tpu as CPU TensorFlow).

The install check's reply to a libtpu that aborts TensorFlow is checked
first, against a stand-in ``python3`` (no second libtpu to download).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from launch.tpu.config import DEFAULT_LIBTPU, DEFAULT_TENSORFLOW, TpuConfig
from tests.launch.tpu import stack as tpu_vm_stack
from tests.helpers import REPO
from tests.launch.helpers import PYPROJECT, fake_program

tc = tpu_vm_stack.tc

# Hang bounds, not speed bars, each over 10x the times recorded in
# docs/benchmarks.md (The test suite). The first test to use `stack` builds
# it: the host's install took 71-106 s, downloads aside, and each of its two
# steps has an hour (the bound in `tests.launch.tpu.stack`). The trainer
# tests on the host's TensorFlow took 201-438 s.
BUILD_BOUND_S = 7200
STACK_TESTS_BOUND_S = 4500
pytestmark = pytest.mark.timeout(BUILD_BOUND_S)

# TensorFlow's last words when libtpu 0.0.32 is loaded by tensorflow-tpu 2.20.0.
ABORT = ("2026-12-01 09:19:22.682455: F external/local_xla/xla/stream_executor/"
         "tpu/tpu_executor_init_fns.inc:128] TpuExecutable_FreeMaybeOwningDevice"
         "MemoryArray not available in this library.")

# The trainer tests run on the host's TensorFlow: those of both loops (and
# their steps per call), two replicas, bfloat16 and the tpu preset, the
# optimizers, resume, export and predict, and malloc's thresholds under two
# replicas. Of the command line's tests, the runs the host makes (both loops,
# bfloat16, the train split in memory) and the answers to a TPU that is not
# there: its other tests check flags and files, which no TensorFlow build
# changes. Tests marked ``tf221`` need the CPU build.
STACK_TESTS = ["tests/trainer/test_trainer_distributed.py",
               "tests/trainer/test_trainer_optimizer.py",
               "tests/trainer/test_trainer_export.py",
               "tests/trainer/test_trainer_cli.py::test_in_process_run_prints_final_metrics",
               "tests/trainer/test_trainer_cli.py::test_bad_tpu_off_a_tpu",
               "tests/trainer/test_trainer_loops.py",
               "tests/trainer/test_trainer_steps_per_call.py",
               "tests/trainer/test_trainer_model.py",
               "tests/trainer/test_trainer_strategy.py",
               "tests/trainer/test_trainer_imports.py",
               "tests/trainer/test_trainer_malloc.py"]


# ------------------------------------------- the install check, stand-in

def check_with_stand_in(tmp_path: Path, import_stderr: str, code: int,
                        cfg: TpuConfig | None = None) -> subprocess.CompletedProcess:
    """The install script against a ``python3`` whose TensorFlow import fails.

    Exit status 134 is a death by SIGABRT, as TensorFlow's fatal log ends.
    """
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (tmp_path / "import.err").write_text(import_stderr + "\n")
    fake_program(bin_dir / "python3", f"""
case "$*" in
  *"print(tf.__version__)"*) echo 2.20.0 ;;
  *"import tensorflow as tf, tf_keras, google.cloud.storage, trainer"*)
    cat {shlex.quote(str(tmp_path / 'import.err'))} >&2
    if [ {code} = 134 ]; then kill -ABRT $$; fi; exit {code} ;;
  *"pip show libtpu"*) printf "Name: libtpu\\nVersion: 0.0.32\\n" ;;
esac
""")
    cfg = cfg or TpuConfig(name="n", zone="z")
    env = dict(os.environ, HOME=str(tmp_path),
               PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    return subprocess.run(["bash", "-c", tc.install_script(cfg, PYPROJECT)], env=env,
                          capture_output=True, text=True, timeout=60)


def test_a_libtpu_that_aborts_tensorflow_is_one_line(tmp_path):
    proc = check_with_stand_in(tmp_path, "WARNING: noise\n" + ABORT, 134)
    assert proc.returncode == 1
    [line] = proc.stderr.splitlines()
    assert re.fullmatch(
        r"error: \S+: libtpu 0\.0\.32 does not load with TensorFlow 2\.20\.0 "
        r"\(TpuExecutable_FreeMaybeOwningDeviceMemoryArray not available in this "
        r"library\); pass --libtpu=libtpu==0\.0\.31, the libtpu that loads with it",
        line), line
    assert ABORT in (tmp_path / "mnist-tpu" / "install-check.log").read_text()


def test_another_tensorflow_gets_no_pin_to_pass(tmp_path):
    cfg = TpuConfig(name="n", zone="z", tensorflow="tensorflow-tpu==2.19.0")
    proc = check_with_stand_in(tmp_path, ABORT, 134, cfg)
    [line] = proc.stderr.splitlines()
    assert line.endswith("; pass --libtpu=libtpu==X with a libtpu that matches it")


def test_any_other_import_failure_is_its_last_line(tmp_path):
    proc = check_with_stand_in(
        tmp_path, "Traceback (most recent call last):\n  ...\n"
        "ModuleNotFoundError: No module named 'tf_keras'", 1)
    assert proc.returncode == 1
    [line] = proc.stderr.splitlines()
    assert line.endswith(": the import check failed: ModuleNotFoundError: No module "
                         "named 'tf_keras' (full output in ~/mnist-tpu/install-check.log)")


def test_the_tpu_extra_pins_what_the_hosts_install():
    assert tpu_vm_stack.lw.extra_requirements(PYPROJECT, "tpu") == [
        DEFAULT_TENSORFLOW, DEFAULT_LIBTPU]


def test_the_jit_compile_check_passes_where_xla_runs_on_the_cpu():
    """This suite's own TensorFlow (2.21, CPU) compiles with XLA: no error."""
    import tensorflow as tf
    from trainer import strategy as strategy_lib
    assert strategy_lib.xla_missing(tf.distribute.get_strategy()) == ""


# ------------------------------------------------------ the real stack

@pytest.fixture(scope="module")
def stack(tmp_path_factory) -> tpu_vm_stack.Stack:
    try:
        return tpu_vm_stack.build(tmp_path_factory.mktemp("tpu-vm-dist"))
    except tpu_vm_stack.Unavailable as e:
        pytest.skip(f"cannot build a TPU VM host's environment here: {e}")


def run_on_host(stack, args: list[str], cwd: Path, timeout: float = 300,
                **env: str) -> subprocess.CompletedProcess:
    return tpu_vm_stack.run(["python3", *args], dict(stack.env, **env), cwd, timeout)


VERSIONS = """
import json, importlib.metadata as m
import tensorflow as tf, tf_keras
print(json.dumps({"tensorflow": tf.__version__, "tf_keras": tf_keras.__version__,
                  "libtpu": m.version("libtpu"),
                  "devices": [d.device_type for d in tf.config.list_logical_devices()]}))
"""


@pytest.mark.slow
def test_tensorflow_imports_with_the_pinned_libtpu(stack, tmp_path):
    # The install script's own check printed TensorFlow's and tf-keras's versions.
    assert re.search(r"^2\.20\.0 2\.20\.\d+$", stack.install_output, re.M), \
        stack.install_output[-2000:]
    proc = run_on_host(stack, ["-c", VERSIONS], tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    found = json.loads(proc.stdout.splitlines()[-1])
    assert found["tensorflow"] == "2.20.0"
    assert re.fullmatch(r"2\.20\.\d+", found["tf_keras"])
    assert "libtpu==" + found["libtpu"] == DEFAULT_LIBTPU
    # libtpu was loaded: it registers the TPU system device (no TPU cores here).
    assert "TPU_SYSTEM" in found["devices"]


@pytest.fixture(scope="module")
def dataset(tmp_path_factory) -> Path:
    from tests import trainer_data
    folder = tmp_path_factory.mktemp("stack-data")
    trainer_data.write_dataset(str(folder), num_train=32, num_test=8)
    return folder


@pytest.mark.slow
def test_tpu_strategy_off_a_tpu_is_one_error_line(stack, dataset, tmp_path):
    # From the installed wheel (cwd is not the source tree), libtpu loaded.
    proc = run_on_host(stack, ["-m", "trainer", "--strategy=tpu", "--tpu=local",
                               f"--data={dataset}", f"--model_dir={tmp_path}/m"],
                       tmp_path)
    assert proc.returncode == 1, proc.stderr[-3000:]
    errors = [l for l in proc.stderr.splitlines() if l.startswith("error:")]
    assert errors and errors == proc.stderr.splitlines()[-1:], proc.stderr[-3000:]
    assert errors[0].startswith("error: --tpu=local: no TPU found")
    assert "Traceback" not in proc.stderr


@pytest.mark.slow
def test_jit_compile_off_a_tpu_is_one_error_line(stack, dataset, tmp_path):
    proc = run_on_host(stack, ["-m", "trainer", "--jit_compile=true", "--strategy=default",
                               f"--data={dataset}", f"--model_dir={tmp_path}/m"],
                       tmp_path, TPU_LOAD_LIBRARY="0")
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    last = proc.stderr.splitlines()[-1]
    assert last.startswith("error: --jit_compile=true off a TPU: this TensorFlow "
                           "build has no XLA CPU backend ("), proc.stderr[-3000:]


@pytest.mark.slow
@pytest.mark.timeout(BUILD_BOUND_S + STACK_TESTS_BOUND_S)
def test_trainer_tests_pass_on_the_tpu_build(stack, tmp_path):
    args = ["-m", "pytest", "-p", "no:cacheprovider", "-q", "-m", "not tf221",
            f"--basetemp={tmp_path}/t", *STACK_TESTS]
    proc = run_on_host(stack, args, REPO, timeout=STACK_TESTS_BOUND_S, TPU_LOAD_LIBRARY="0",
                       TF_CPP_MIN_LOG_LEVEL="2")
    summary = proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else ""
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-3000:]
    assert re.search(r"\d+ passed", summary) and "failed" not in summary, summary


@pytest.mark.slow
def test_the_gs_round_trip_through_the_tpu_builds_gcs_client(stack, gcs_tls, tmp_path):
    """TensorFlow 2.20's own gs:// client, the one a TPU VM uses, against the
    local GCS server (`tests.gcs_tls`): the installed trainer trains from and
    into gs:// and its export, read back by predict, matches metrics.json."""
    from tests.helpers import EMULATOR_BUCKET
    root = f"gs://{EMULATOR_BUCKET}/stack-{uuid.uuid4().hex[:8]}"
    out = gcs_tls.run([sys.executable, "-m", "pipeline", f"--output={root}/mnist",
                       "--source=sample", "--runner=DirectRunner"], timeout=120, cwd=REPO)
    assert out.returncode == 0, out.stderr[-3000:]
    gcs = {k: v for k, v in gcs_tls.env().items() if os.environ.get(k) != v
           and k not in ("PATH", "HOME") and not k.startswith(("PYTHON", "VIRTUAL_ENV"))}
    flags = [f"--data={root}/mnist", f"--model_dir={root}/model"]
    proc = run_on_host(stack, ["-m", "trainer", *flags, "--preset=smoke", "--epochs=1",
                               "--steps_per_epoch=5", "--global_batch_size=32", "--verbose=0"],
                       tmp_path, timeout=300, TPU_LOAD_LIBRARY="0", **gcs)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    metrics = json.loads(gcs_tls.emulator.download(
        f"{root[len(f'gs://{EMULATOR_BUCKET}/'):]}/model/metrics.json"))
    proc = run_on_host(stack, ["-m", "trainer.predict", f"--model_dir={root}/model",
                               f"--data={root}/mnist", "--split=test"],
                       tmp_path, timeout=300, TPU_LOAD_LIBRARY="0", **gcs)
    assert proc.returncode == 0, proc.stderr[-3000:]
    correct, total = map(int, re.search(r"^accuracy=[\d.]+ \((\d+)/(\d+)\) on split test$",
                                        proc.stdout, re.M).groups())
    assert total == metrics["test_examples"] == 1000
    assert correct == round(metrics["test_accuracy"] * total)
