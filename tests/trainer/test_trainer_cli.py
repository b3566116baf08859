"""The command line: a run end to end, and one clear line for each expected failure."""

from __future__ import annotations

import dataclasses
import os
import re
import subprocess
import sys
import uuid

import pytest

import mnist_contract as contract
from tests import trainer_data
from tests.helpers import LOG_LINE, REPO
from trainer import __main__ as cli
from trainer import config as config_lib
from trainer.config import TrainConfig
from trainer.errors import TrainerError


def run_cli(*args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    return subprocess.run([sys.executable, "-m", "trainer", *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=300)


def error_lines(stderr: str) -> list[str]:
    return [l for l in stderr.splitlines() if l.startswith("error: ")]


# The dataset these tests share (`trainer_dataset` in conftest).
DATASET = dict(num_train=128, num_test=21, train_shards=3)


@pytest.mark.parametrize("loop,extra", [
    ("keras", []), ("custom", []),
    ("keras", ["--mixed_precision=bfloat16", "--cache"]),
    ("custom", ["--mixed_precision=bfloat16", "--cache"]),
])
def test_in_process_run_prints_final_metrics(trainer_dataset, tmp_path, loop, extra, capsys):
    dataset = trainer_dataset(**DATASET)
    rc = cli.main([f"--data={dataset}", f"--model_dir={tmp_path}/m", "--preset=smoke",
                   f"--loop={loop}", "--epochs=1", "--global_batch_size=16",
                   "--steps_per_execution=3",
                   "--verbose=0", "--seed=3", *extra])
    out = capsys.readouterr().out
    assert rc == 0
    assert "test_examples=21 train_examples=128 train_steps=8 preset=smoke" in out
    assert f"({loop} loop, default, 1 replica(s))" in out
    metrics = trainer_data.read_metrics(f"{tmp_path}/m")
    assert metrics["test_examples"] == 21 and metrics["strategy"] == "default"
    assert metrics["preset"] == "smoke"


def summary_points(logs_dir: str) -> set[tuple[str, str, int]]:
    """(run, tag, step) of every summary in the TensorBoard event files under
    logs_dir (run "." for logs_dir itself, the run's root)."""
    import tensorflow as tf
    points = set()
    for run in [".", *sorted(os.listdir(logs_dir))]:
        if not os.path.isdir(os.path.join(logs_dir, run)):
            continue
        for name in os.listdir(os.path.join(logs_dir, run)):
            if not name.startswith("events.out.tfevents."):
                continue
            for event in tf.compat.v1.train.summary_iterator(
                    os.path.join(logs_dir, run, name)):
                points.update((run, v.tag, event.step) for v in event.summary.value)
    return points


def test_both_loops_write_the_same_summaries_and_checkpoints(trainer_dataset, tmp_path, capsys):
    """Overlayable TensorBoard runs: same tags at the same steps; same checkpoint names."""
    dataset = trainer_dataset(**DATASET)
    written = {}
    for loop in ("keras", "custom"):
        model_dir = str(tmp_path / loop)
        assert cli.main([f"--data={dataset}", f"--model_dir={model_dir}", "--preset=smoke",
                         f"--loop={loop}", "--epochs=2", "--global_batch_size=16",
                         "--steps_per_execution=4", "--log_every=4", "--verbose=1",
                         "--seed=1"]) == 0
        written[loop] = (summary_points(os.path.join(model_dir, "logs")),
                         sorted(os.listdir(os.path.join(model_dir, "checkpoints"))),
                         sorted(os.listdir(model_dir)))
    out = capsys.readouterr().out
    assert "examples:" not in out and "xent" not in out  # the Keras progress bar
    # Each epoch line starts its own line, not the end of the Keras bar's.
    epoch_lines = re.findall(r"epoch [12]/2 test_loss ", out)
    assert len(epoch_lines) == 4
    assert re.findall(r"(?m)^epoch [12]/2 test_loss ", out) == epoch_lines
    assert written["keras"] == written["custom"]
    points, checkpoints, top = written["keras"]
    assert points == ({("train", tag, step) for tag in ("loss", "accuracy",
                                                         "examples_per_second")
                       for step in (4, 8, 12, 16)}
                      | {("train", "inputs", 0)}
                      | {("validation", tag, step) for tag in ("loss", "accuracy",
                                                               "confusion_matrix",
                                                               "confusion_counts",
                                                               "misclassified")
                         for step in (8, 16)}
                      | {(".", "_hparams_/experiment", 0), (".", "_hparams_/session_start_info", 0),
                         (".", "test_accuracy", 16), (".", "test_loss", 16)})
    assert [c for c in checkpoints if c.endswith(".index")] == ["ckpt-16.index",
                                                                 "ckpt-8.index"]
    assert top == ["checkpoints", "dataset.json", "export", "logs", "metrics.json"]  # no backup/


def test_missing_data_dir(tmp_path, capsys):
    missing = str(tmp_path / "nope")
    assert cli.main([f"--data={missing}", f"--model_dir={tmp_path}/m"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"error: {missing}: data directory not found"]


def test_data_that_is_a_file(tmp_path, capsys):
    path = tmp_path / "data.tfrecord"
    path.write_bytes(b"x")
    assert cli.main([f"--data={path}", f"--model_dir={tmp_path}/m"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"error: {path}: --data is a file, not the pipeline's output folder"]


def test_data_on_gs_that_cannot_be_reached(tmp_path):
    """TensorFlow's GCS client sent to a closed port: the line says it cannot
    reach the data (a run-time failure, 1), not that the folder is missing."""
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", https_proxy="http://127.0.0.1:9",
               GOOGLE_AUTH_TOKEN_FOR_TESTING="test-token", NO_GCE_CHECK="true",
               GCS_RETRY_CONFIG_MAX_RETRIES="0")
    proc = subprocess.run([sys.executable, "-m", "trainer", "--data=gs://b/data",
                           f"--model_dir={tmp_path}/m", "--preset=smoke"], cwd=REPO,
                          env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1, proc.stderr
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith("error: gs://b/data: cannot reach it (Error executing an HTTP "
                           "request: libcurl code 7 "), line


def test_a_shard_that_is_a_directory(tmp_path, capsys):
    out = str(tmp_path / "data")
    trainer_data.write_dataset(out, num_train=16, num_test=4, test_shards=1)
    shard = f"{out}/{contract.shard_filename('test', 0, 1)}"
    os.remove(shard)
    os.mkdir(shard)
    assert cli.main([f"--data={out}", f"--model_dir={tmp_path}/m"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"error: {shard}: a directory, but manifest.json lists it as a shard file"]


def test_missing_manifest(tmp_path, capsys):
    out = str(tmp_path / "data")
    trainer_data.write_dataset(out, num_train=16, num_test=4, write_manifest=False)
    assert cli.main([f"--data={out}", f"--model_dir={tmp_path}/m"]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith(f"error: {out}/manifest.json: no manifest.json")


@pytest.mark.parametrize("loop", ["keras", "custom"])
@pytest.mark.parametrize("split,damage,reported", [
    ("train", "flip", "corrupted record at "),  # a byte of a record's payload
    ("train", "truncate", "bytes, but manifest.json lists"),  # caught by the size check
    ("test", "flip", "corrupted record at "),  # found by the evaluation
])
def test_corrupt_record_names_the_file(tmp_path, capsys, loop, split, damage, reported):
    out = str(tmp_path / "data")
    trainer_data.write_dataset(out, num_train=128, num_test=8, train_shards=3,
                               test_shards=2)
    bad = f"{out}/{contract.shard_filename(split, 1, 3 if split == 'train' else 2)}"
    if damage == "flip":
        trainer_data.corrupt(bad)
    else:
        os.truncate(bad, os.path.getsize(bad) - 100)
    rc = cli.main([f"--data={out}", f"--model_dir={tmp_path}/m", "--preset=smoke",
                   f"--loop={loop}", "--epochs=1", "--global_batch_size=16", "--verbose=0"])
    assert rc == 2
    (line,) = error_lines(capsys.readouterr().err)
    if damage == "truncate":  # the size no longer matches: refused before training
        size = os.path.getsize(bad)
        assert line.startswith(f"error: {bad}: {size} bytes, but manifest.json lists "
                               f"{size + 100} ")
    else:
        assert line.startswith(f"error: {bad}: corrupt TFRecord data ({reported}")


@pytest.mark.parametrize("loop", ["keras", "custom"])
@pytest.mark.parametrize("split", ["train", "test"])
def test_missing_shard_names_the_file(tmp_path, capsys, loop, split):
    out = str(tmp_path / "data")
    trainer_data.write_dataset(out, num_train=32, num_test=8, train_shards=3, test_shards=2)
    gone = f"{out}/{contract.shard_filename(split, 1, 3 if split == 'train' else 2)}"
    os.remove(gone)
    rc = cli.main([f"--data={out}", f"--model_dir={tmp_path}/m", "--preset=smoke",
                   f"--loop={loop}", "--epochs=1", "--global_batch_size=16", "--verbose=0"])
    assert rc == 2
    assert error_lines(capsys.readouterr().err) == [
        f"error: {gone}: listed in manifest.json but missing"]
    assert not os.path.exists(f"{tmp_path}/m")  # stopped before training


@pytest.mark.parametrize("argv,message", [
    (["--epochs=0"], "--epochs must be >= 1, not 0"),
    (["--checkpoint_every=-1"], "--checkpoint_every must be >= 0, not -1"),
    (["--cpu_replicas=2", "--jit_compile"], "--jit_compile does not work with --cpu_replicas > 1"),
    (["--cpu_replicas=2", "--strategy=tpu"],
     "--cpu_replicas works with --strategy=auto or mirrored"),
])
def test_bad_settings(argv, message, tmp_path, capsys):
    assert cli.main(["--data=x", f"--model_dir={tmp_path}", *argv]) == 2  # bad flags
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith(f"error: {message}")


@pytest.mark.parametrize("argv, message", [
    (["--cpu_replicas=2", "--global_batch_size=33"],
     "--global_batch_size=33 does not divide into 2 replicas"),
    (["--global_batch_size=16", "--profile_steps=1,1000"],
     "--profile_steps=1,1000 ends after the run's 8 steps"),
])
def test_flags_the_run_cannot_use_are_bad_flags(trainer_dataset, tmp_path, argv, message):
    """Checks that need the strategy or the data (`trainer.run.plan`) refuse
    a flag as the parser does: one line, exit 2."""
    dataset = trainer_dataset(**DATASET)
    proc = run_cli(f"--data={dataset}", f"--model_dir={tmp_path}/m", "--preset=smoke",
                   "--epochs=1", "--verbose=0", *argv)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert error_lines(proc.stderr) == [error_lines(proc.stderr)[-1]], proc.stderr
    assert error_lines(proc.stderr)[-1].startswith(f"error: {message}"), proc.stderr


def test_flags_fill_the_config():
    config = cli.parse_flags(["--data=gs://b/d", "--model_dir=gs://b/m", "--preset=smoke",
                              "--loop=custom", "--cache", "--mixed_precision=bfloat16",
                              "--tpu=local",
                              "--strategy=tpu", "--steps_per_execution=7",
                              "--jit_compile=false", "--seed=4", "--learning_rate=0.01"])
    assert config == TrainConfig(data="gs://b/d", model_dir="gs://b/m", loop="custom",
                                 cache=True, mixed_precision="bfloat16", tpu="local",
                                 strategy="tpu", steps_per_execution=7, seed=4,
                                 learning_rate=0.01, preset="smoke")
    with pytest.raises(TrainerError):
        TrainConfig(data="d", model_dir="m", loop="estimator")


def test_every_field_is_a_flag_and_help_shows_its_default(capsys):
    with pytest.raises(SystemExit):
        cli.parse_flags(["--help"])
    text = " ".join(capsys.readouterr().out.split())  # unwrap argparse's lines
    for f in dataclasses.fields(TrainConfig):
        assert f"--{f.name}" in text
    assert "(default: 128)" in text and "(default: keras)" in text
    assert "(default: train examples // global batch size)" in text
    assert ("Presets: smoke: the defaults shown; cpu: model=convnet_bn, augment=true, "
            "learning_rate=0.002, lr_schedule=cosine, warmup_steps=31, epochs=20, "
            "global_batch_size=128, bn_recalibration_examples=10000; tpu: "
            "model=convnet_bn, augment=true, learning_rate=0.002, lr_schedule=cosine, "
            "warmup_steps=31, epochs=20, global_batch_size=128, bn_recalibration_examples=10000, "
            "mixed_precision=bfloat16, steps_per_execution=50, cache=true; guide: model=guide, "
            "global_batch_size=1024, "
            "mixed_precision=bfloat16, steps_per_execution=50.") in text
    assert "[--preset {auto,smoke,cpu,tpu,guide}]" in text and "(default: auto)" in text


def test_presets_and_explicit_flags_override_them():
    base = ["--data=d", "--model_dir=m"]
    smoke = cli.parse_flags(base + ["--preset=smoke"])
    assert smoke == TrainConfig(data="d", model_dir="m", preset="smoke")
    cpu = cli.parse_flags(base + ["--preset=cpu", "--epochs=5"])
    assert (cpu.model, cpu.augment, cpu.learning_rate, cpu.lr_schedule, cpu.warmup_steps,
            cpu.epochs, cpu.preset) == ("convnet_bn", True, 2e-3, "cosine", 31, 5, "cpu")
    tpu = cli.parse_flags(base + ["--preset=tpu"])
    assert (tpu.model, tpu.augment, tpu.optimizer, tpu.learning_rate, tpu.lr_schedule,
            tpu.global_batch_size, tpu.mixed_precision, tpu.steps_per_execution, tpu.cache,
            tpu.warmup_steps, tpu.warmup_epochs) == (
        "convnet_bn", True, "adam", 2e-3, "cosine", 128, "bfloat16", 50, True, 31, 0.0)
    assert cpu.optimizer == "adam"
    guide = cli.parse_flags(base + ["--preset=guide"])
    assert (guide.model, guide.augment, guide.global_batch_size, guide.mixed_precision,
            guide.steps_per_execution, guide.epochs) == ("guide", False, 1024, "bfloat16",
                                                         50, 3)
    mine = cli.parse_flags(base + ["--preset=guide", "--global_batch_size=2048",
                                   "--mixed_precision=none"])
    assert (mine.model, mine.global_batch_size, mine.mixed_precision) == (
        "guide", 2048, "none")
    assert config_lib.from_preset("tpu", data="d", model_dir="m") == tpu
    with pytest.raises(TrainerError, match="--preset must be one of auto, smoke, cpu, "
                                           "tpu, guide, not 'gpu'"):
        config_lib.from_preset("gpu", data="d", model_dir="m")
    with pytest.raises(TrainerError, match="preset must be one of smoke, cpu, tpu, guide"):
        TrainConfig(data="d", model_dir="m", preset="auto")


def test_tpu_recipe_is_the_cpu_one_in_bfloat16():
    """tpu = cpu's recipe as it is (its batch, its schedule per example) with
    bfloat16, 50 steps per call and the in-memory input: no larger-batch
    candidate reached cpu's validation mean (docs/benchmarks.md, "The tpu
    preset's search")."""
    cpu, tpu = config_lib.PRESETS["cpu"], config_lib.PRESETS["tpu"]
    assert tpu == {**cpu, "mixed_precision": "bfloat16", "steps_per_execution": 50,
                   "cache": True}


@pytest.mark.parametrize("flags,steps,epochs", [
    ([], 31, 0.0),
    (["--warmup_steps=10"], 10, 0.0),
    (["--warmup_steps=0"], 0, 0.0),
    (["--warmup_epochs=0.5"], 0, 0.5),
])
def test_an_explicit_warmup_in_either_unit_replaces_the_presets(flags, steps, epochs):
    config = cli.parse_flags(["--data=d", "--model_dir=m", "--preset=tpu", *flags])
    assert (config.warmup_steps, config.warmup_epochs) == (steps, epochs)
    cpu = cli.parse_flags(["--data=d", "--model_dir=m", "--preset=cpu", *flags])
    assert (cpu.warmup_steps, cpu.warmup_epochs) == (steps, epochs)


def test_warmup_epochs_become_the_same_share_of_any_run():
    """2 of 20 epochs: 96 steps at 48 an epoch, 4 at 2; never 0 steps."""
    from trainer.run import plan as plan_lib  # imports TensorFlow
    config = TrainConfig(data="d", model_dir="m", epochs=20, warmup_epochs=2.0)
    assert [plan_lib.warmup_steps(config, n) for n in (960, 40, 4)] == [96, 4, 1]
    assert plan_lib.warmup_steps(TrainConfig(data="d", model_dir="m", warmup_steps=7),
                                 960) == 7
    assert plan_lib.warmup_steps(TrainConfig(data="d", model_dir="m"), 960) == 0


@pytest.mark.parametrize("on_tpu,expected", [(True, "tpu"), (False, "cpu")])
def test_auto_preset_follows_the_strategy(on_tpu, expected):
    assert config_lib.resolve_preset("auto", on_tpu) == expected
    assert config_lib.resolve_preset("guide", on_tpu) == "guide"
    asked = []

    def strategy_is_tpu(flags: TrainConfig) -> bool:
        asked.append((flags.strategy, flags.tpu, flags.cpu_replicas))
        return on_tpu
    config = cli.parse_flags(["--data=d", "--model_dir=m", "--strategy=tpu", "--tpu=t1",
                              "--epochs=2"], on_tpu=strategy_is_tpu)
    assert asked == [("tpu", "t1", 0)]  # the strategy from the flags, no preset's
    assert config == config_lib.from_preset(expected, data="d", model_dir="m",
                                            strategy="tpu", tpu="t1", epochs=2)
    assert config.preset == expected and config.epochs == 2


@pytest.mark.slow
def test_the_bare_command_trains_the_cpu_recipe_off_a_tpu(trainer_dataset, tmp_path):
    """No --preset: auto, which off a TPU is cpu (the --epochs flag still wins)."""
    dataset = trainer_dataset(**DATASET)
    env = {k: v for k, v in os.environ.items() if k not in ("TPU_NAME", "TF_CONFIG")}
    env["TF_CPP_MIN_LOG_LEVEL"] = "2"
    proc = subprocess.run([sys.executable, "-m", "trainer", f"--data={dataset}",
                           f"--model_dir={tmp_path}/m", "--epochs=1", "--verbose=0"],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "train_examples=128 train_steps=1 preset=cpu (keras loop" in proc.stdout
    metrics = trainer_data.read_metrics(f"{tmp_path}/m")
    assert (metrics["preset"], metrics["global_batch_size"], metrics["epochs"]) == (
        "cpu", 128, 1)


@pytest.mark.parametrize("argv,message", [
    (["--epochs=1.5"], "argument --epochs: invalid int value: '1.5'"),
    (["--cache=maybe"], "argument --cache: expected true/false, not 'maybe'"),
    (["--loop=estimator"], "argument --loop: invalid choice: 'estimator'"),
    (["--preset=gpu"], "argument --preset: invalid choice: 'gpu'"),
    # No abbreviations: --res would be --restart, which deletes the checkpoints.
    (["--res"], "unrecognized arguments: --res; did you mean --restart, not --res?"),
    (["--epoch=2"], "unrecognized arguments: --epoch=2; did you mean --epochs, not --epoch?"),
    # A flag given twice: the last value used to win silently.
    (["--epochs=2", "--epochs=3"], "--epochs given twice (--epochs=2, then --epochs=3)"),
    (["--cache", "--cache=false"], "--cache given twice (--cache, then --cache=false)"),
    (["--model_dir=n"], "--model_dir given twice (--model_dir=m, then --model_dir=n)"),
])
def test_bad_flags_are_usage_errors(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["--data=d", "--model_dir=m", *argv])
    assert exit_info.value.code == 2
    line, = capsys.readouterr().err.splitlines()
    assert line.startswith(f"error: {message}") and line.endswith(" (see --help)"), line


def test_a_misspelled_required_flag_is_named(capsys):
    with pytest.raises(SystemExit):
        cli.main(["--dat=d", "--model_dir=m"])
    assert capsys.readouterr().err.splitlines() == [
        "error: the following arguments are required: --data; "
        "did you mean --data, not --dat? (see --help)"]


@pytest.mark.parametrize("kwargs,message", [
    (dict(global_batch_size=0), "--global_batch_size must be >= 1, not 0"),
    (dict(learning_rate=float("nan")), "--learning_rate must be a positive number"),
    (dict(warmup_steps=-1), "--warmup_steps must be >= 0, not -1"),
    (dict(warmup_epochs=-0.5), "--warmup_epochs must be >= 0, not -0.5"),
    (dict(warmup_epochs=float("inf")), "--warmup_epochs must be >= 0, not inf"),
    (dict(warmup_steps=3, warmup_epochs=1.0),
     "--warmup_steps and --warmup_epochs: give one of them"),
    (dict(label_smoothing=1.0), "--label_smoothing must be >= 0 and < 1, not 1.0"),
    (dict(dropout=1.0), "--dropout must be >= 0 and < 1, not 1.0"),
    (dict(dropout=-0.1), "--dropout must be >= 0 and < 1, not -0.1"),
    (dict(weight_decay=-1e-4), "--weight_decay must be >= 0, not -0.0001"),
    (dict(weight_decay=float("nan")), "--weight_decay must be >= 0, not nan"),
    (dict(label_smoothing=float("nan")), "--label_smoothing must be >= 0 and < 1, not nan"),
    (dict(model="huge"),
     "--model must be one of guide, small, convnet, convnet_bn, not 'huge'"),
    (dict(model="convnet_bn", bn_virtual_batch_size=-1),
     "--bn_virtual_batch_size must be >= 0, not -1"),
    (dict(bn_virtual_batch_size=4), "--bn_virtual_batch_size: --model=small has no batch "
                                    "normalization (models with it: convnet_bn)"),
    (dict(mixed_precision="fp16"), "--mixed_precision must be one of none, bfloat16"),
])
def test_config_checks_once_on_creation(kwargs, message):
    with pytest.raises(TrainerError, match=re.escape(message)):
        TrainConfig(data="d", model_dir="m", **kwargs)
    from trainer.run import plan as plan_lib  # imports TensorFlow
    with pytest.raises(TrainerError, match="does not divide into 3 replicas"):
        plan_lib.check_replicas(TrainConfig(data="d", model_dir="m", global_batch_size=8), 3)


@pytest.mark.parametrize("on_tpu, preset", [(False, "cpu"), (True, "tpu")])
def test_ghost_batches_are_a_flag_of_either_auto_preset(on_tpu, preset):
    """Both presets auto settles on train convnet_bn: the flag is checked
    against them, not against the bare defaults' model (small)."""
    config = config_lib.parse_flags(["--data=d", "--model_dir=m", "--bn_virtual_batch_size=32"],
                             on_tpu=lambda flags: on_tpu)
    assert (config.preset, config.model, config.bn_virtual_batch_size) == (
        preset, "convnet_bn", 32)
    with pytest.raises(TrainerError, match="--model=small has no batch normalization"):
        config_lib.parse_flags(["--data=d", "--model_dir=m", "--model=small",
                         "--bn_virtual_batch_size=32"], on_tpu=lambda flags: on_tpu)


def test_ghost_batches_must_divide_each_replicas_batch():
    from trainer.run import plan as plan_lib  # imports TensorFlow
    config = TrainConfig(data="d", model_dir="m", model="convnet_bn", global_batch_size=48,
                         bn_virtual_batch_size=8)
    plan_lib.check_replicas(config, 3)  # 16 a replica: two ghost batches of 8
    assert plan_lib.Plan.of(config, 3, 1).ghost_batch_size == 8
    plan_lib.check_replicas(config, 6)  # 8 a replica: the whole of it, as without the flag
    plan_lib.check_replicas(config, 12)
    assert plan_lib.Plan.of(config, 6, 1).ghost_batch_size == 0
    assert plan_lib.Plan.of(config, 12, 1).ghost_batch_size == 0
    with pytest.raises(TrainerError, match=re.escape(
            "--bn_virtual_batch_size=8 does not divide the per-replica batch of 12 "
            "(--global_batch_size=48 over 4 replicas)")):
        plan_lib.check_replicas(config, 4)


# Real processes: the TPU probe changes process-wide TF state, and these show
# what a user sees (no traceback, one error line, exit status 1).

@pytest.mark.parametrize("tpu,reason,preset", [
    pytest.param("local", "NotFoundError: TPUs not found", [], id="local"),
    pytest.param("local", "NotFoundError: TPUs not found", ["--preset=tpu"],
                 id="local-tpu-preset"),
    # A fresh name each run, under a fixed test id (test collection must agree
    # between pytest-xdist workers).
    pytest.param("no-such-tpu-" + uuid.uuid4().hex[:6], "", [], id="no-such-tpu")])
def test_bad_tpu_off_a_tpu(trainer_dataset, tmp_path, tpu, reason, preset):
    dataset = trainer_dataset(**DATASET)
    proc = run_cli(f"--data={dataset}", f"--model_dir={tmp_path}/m", "--strategy=tpu",
                   f"--tpu={tpu}", *preset)
    assert proc.returncode == 1
    assert "Traceback" not in proc.stderr
    (line,) = error_lines(proc.stderr)
    assert line == proc.stderr.strip().splitlines()[-1]
    assert line.startswith(f"error: --tpu={tpu}: no TPU found (")
    assert reason in line


def test_missing_shard_from_the_shell(tmp_path):
    """Also: without TF_CPP_MIN_LOG_LEVEL set, TF's C++ start-up lines stay hidden."""
    out = str(tmp_path / "data")
    trainer_data.write_dataset(out, num_train=16, num_test=4, test_shards=2)
    gone = f"{out}/{contract.shard_filename('test', 0, 2)}"
    os.remove(gone)
    env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
    proc = subprocess.run([sys.executable, "-m", "trainer", f"--data={out}",
                           f"--model_dir={tmp_path}/m"], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.splitlines() == [
        f"error: {gone}: listed in manifest.json but missing"], proc.stderr


@pytest.mark.parametrize("loop", ["keras", "custom"])
def test_profile_steps_write_a_tensorboard_profile(trainer_dataset, tmp_path, loop, capsys):
    dataset = trainer_dataset(**DATASET)
    model_dir = tmp_path / "m"
    assert cli.main([f"--data={dataset}", f"--model_dir={model_dir}", "--preset=smoke",
                     f"--loop={loop}", "--epochs=2", "--global_batch_size=16",
                     "--steps_per_execution=2",
                     "--verbose=0", "--profile_steps=3,6"]) == 0
    traces = sorted(model_dir.glob("logs/plugins/profile/*/*.xplane.pb"))
    assert len(traces) == 1 and traces[0].stat().st_size > 0, traces


@pytest.mark.parametrize("value,message", [
    ("5", "expected START,END (two integers), not '5'"),
    ("a,b", "expected START,END (two integers), not 'a,b'"),
])
def test_bad_profile_steps_flag(value, message, capsys):
    with pytest.raises(SystemExit):
        cli.parse_flags(["--data=d", "--model_dir=m", f"--profile_steps={value}"])
    assert message in capsys.readouterr().err
    with pytest.raises(TrainerError, match="1 <= START < END, not 6,3"):
        TrainConfig(data="d", model_dir="m", profile_steps=(6, 3))


def test_cpu_replicas_from_the_shell(trainer_dataset, tmp_path):
    """The quiet TensorFlow start-up must leave the CPU split to --cpu_replicas."""
    dataset = trainer_dataset(**DATASET)
    env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
    proc = subprocess.run([sys.executable, "-m", "trainer", f"--data={dataset}",
                           f"--model_dir={tmp_path}/m", "--preset=smoke",
                           "--cpu_replicas=2", "--epochs=1",
                           "--global_batch_size=16", "--verbose=0"], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "(keras loop, MirroredStrategy, 2 replica(s))" in proc.stdout
    lines = [LOG_LINE.match(line) for line in proc.stderr.splitlines()]
    assert all(m and m["level"] == "INFO" and m["logger"].startswith("trainer")
               for m in lines), proc.stderr
