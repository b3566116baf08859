"""The job's command line: flags checked before anything runs, one line per refusal."""

import argparse
import os
import subprocess
import sys

import pytest

from pipeline import credentials, options
from pipeline.__main__ import main
from pipeline.errors import PipelineInputError
from tests.helpers import LOG_LINE, REPO, run_job


def error_lines(capsys):
    err = capsys.readouterr().err
    return [line for line in err.splitlines() if line.startswith("error:")], err


def test_unknown_flag_is_one_line_exit_2_and_nothing_written(tmp_path, capsys,
                                                            monkeypatch):
    out = tmp_path / "out"
    assert main(["--source=sample", f"--output={out}", "--target_shard_mbb=5",
                 "--bogus_flag=1"]) == 2
    lines, err = error_lines(capsys)
    assert lines == ["error: unknown flag(s) --target_shard_mbb=5 --bogus_flag=1: "
                     "neither a job option nor a Beam option; did you mean "
                     "--target_shard_mb, not --target_shard_mbb? (see python -m pipeline "
                     "--help)"], err
    assert not out.exists()
    # Credentials are checked before Beam's flags; here Dataflow's are taken as present,
    # so the runner's own option classes are what the flag is checked against.
    monkeypatch.setattr(credentials, "require", lambda paths, runner: None)
    with pytest.raises(PipelineInputError, match="unknown flag"):
        run_job(["--source=sample", f"--output={out}", "--runner=DataflowRunner",
                 "--bogus_flag"])


@pytest.mark.parametrize("abbreviation, meant", [
    ("--over", "--overwrite"), ("--target_shard=5", "--target_shard_mb")])
def test_abbreviated_flag_is_refused(tmp_path, capsys, abbreviation, meant):
    """``--over`` is not ``--overwrite``: flags are spelled out."""
    out = tmp_path / "out"
    assert main(["--source=sample", f"--output={out}", abbreviation]) == 2
    lines, err = error_lines(capsys)
    name = abbreviation.split("=")[0]
    assert lines == [f"error: unknown flag(s) {abbreviation}: neither a job option nor "
                     f"a Beam option; did you mean {meant}, not {name}? "
                     "(see python -m pipeline --help)"], err
    assert not out.exists()


def test_a_job_flag_given_twice_is_refused(tmp_path, capsys):
    """``--output`` twice: refused, where the last one used to win silently."""
    first, second = tmp_path / "a", tmp_path / "b"
    assert main(["--source=sample", f"--output={first}", f"--output={second}"]) == 2
    lines, err = error_lines(capsys)
    assert lines == [f"error: --output given twice (--output={first}, then "
                     f"--output={second}); give each flag once (see --help)"], err
    assert not first.exists() and not second.exists()


def test_unknown_runner_is_one_line(tmp_path, capsys):
    assert main(["--source=sample", f"--output={tmp_path}/out", "--runner=NoSuchRunner"]) == 2
    lines, err = error_lines(capsys)
    assert len(lines) == 1 and lines[0].startswith("error: --runner=NoSuchRunner:"), err


@pytest.mark.parametrize("argv, problem", [
    (["--min_shards=100000"], "error: --min_shards=100000: more shards than records "
                              "(train has 4,000)"),
    (["--target_shard_mb=0.001"], "error: train: 3,424 shards of ~1,000 bytes"),
    (["--target_shard_mb=nan"], "error: --target_shard_mb=nan: must be a finite number"),
])
def test_refusals_from_the_command_line(tmp_path, capsys, argv, problem):
    out = tmp_path / "out"
    assert main(["--source=sample", f"--output={out}", *argv]) == 2
    lines, err = error_lines(capsys)
    assert len(lines) == 1 and lines[0].startswith(problem), err
    assert not out.exists() or not any(out.iterdir())


def test_exact_record_counts_of_an_idx_folder(idx_dir, tmp_path, capsys):
    """The check counts the IDX header's records (here 360 / 90), not MNIST's."""
    assert main([f"--source={idx_dir}", f"--output={tmp_path}/out",
                 "--min_shards=91", "--allow_extreme_sharding"]) == 2
    lines, _ = error_lines(capsys)
    assert lines == ["error: --min_shards=91: more shards than records (test has 90)"]


def test_help_lists_every_option_with_default_and_imports_no_beam():
    result = subprocess.run([sys.executable, "-m", "pipeline", "--help"], cwd=REPO,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    text = " ".join(result.stdout.split())
    for action in options.build_parser()._actions:
        for option in action.option_strings:
            assert option in text
        if action.dest == "help":
            continue
        if isinstance(action, argparse._StoreTrueAction):
            assert "(default: off)" in text
        elif action.default is not None:
            assert f"(default: {action.default})" in text, action.dest
    for beam_flag in ("--runner", "--project", "--region", "--temp_location",
                      "--direct_num_workers"):
        assert beam_flag in text
    assert "goes to Apache Beam" in text
    probe = ("import sys\nfrom pipeline.__main__ import main\n"
             "try:\n    main(['--help'])\nexcept SystemExit as e:\n    assert e.code == 0\n"
             "assert main(['--output=x', '--target_shard_mb=inf']) == 2\n"
             "print(sorted(m for m in ('tensorflow', 'apache_beam') if m in sys.modules))")
    result = subprocess.run([sys.executable, "-c", probe], cwd=REPO,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-1] == "[]"


def test_verify_help_is_plain_text_and_imports_no_tensorflow():
    result = subprocess.run([sys.executable, "-m", "pipeline.verify", "--help"], cwd=REPO,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("usage: python -m pipeline.verify OUTPUT "
                                    "[--preview=FILE.png [--preview_count=N]]\n\n"
                                    "Re-reads a written dataset end to end.\n")
    assert "``" not in result.stdout and "`" not in result.stdout
    assert "index values must be exactly 0..N-1" in result.stdout
    assert ("Exit status: 0 verified, 1 a failure at run time, 2 bad arguments or a "
            "problem in the dataset") in result.stdout
    probe = ("import sys\nfrom pipeline.verify import main\n"
             "try:\n    main(['--help'])\nexcept SystemExit as e:\n    assert e.code == 0\n"
             "print(sorted(m for m in ('tensorflow', 'apache_beam') if m in sys.modules))")
    result = subprocess.run([sys.executable, "-c", probe], cwd=REPO,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-1] == "[]"


NOISE_MARKERS = ("cuInit", "oneDNN", "cudart_stub", "absl::InitializeLog",
                 "cpu_feature_guard", "rebuild TensorFlow")


@pytest.mark.parametrize("line, noise", [
    (b"WARNING: All log messages before absl::InitializeLog() is called are written "
     b"to STDERR\n", True),
    (b"I0000 00:00:1795992386.381989   13101 port.cc:153] oneDNN custom operations "
     b"are on.\n", True),
    (b"I0000 00:00:1795992386.382327   13101 cudart_stub.cc:31] Could not find cuda "
     b"drivers on your machine, GPU will not be used.\n", True),
    (b"E0000 00:00:1795992393.367637   13101 cuda_platform.cc:52] failed call to "
     b"cuInit: INTERNAL: CUDA error: Failed call to cuInit: UNKNOWN ERROR (303)\n", True),
    (b"To enable the following instructions: AVX2 FMA, in other operations, rebuild "
     b"TensorFlow with the appropriate compiler flags.\n", True),
    (b"E0000 00:00:1795992393.367637   13101 some_op.cc:52] real failure\n", False),
    (b"Traceback (most recent call last):\n", False),
])
def test_startup_noise_is_recognised(line, noise):
    from mnist_common import console
    assert console.is_startup_noise(line) is noise


def test_a_run_prints_no_startup_noise_and_each_fact_once(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
    out = tmp_path / "out"
    result = subprocess.run([sys.executable, "-m", "pipeline", "--source=sample",
                             f"--output={out}"], cwd=REPO, env=env,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    for marker in NOISE_MARKERS:
        assert marker not in result.stderr, result.stderr
    assert result.stderr.count("Source:") == 1, result.stderr
    assert result.stderr.count("offline sample") == 1
    assert all(LOG_LINE.match(line) for line in result.stderr.splitlines()), result.stderr
    everything = result.stdout + result.stderr
    assert everything.count("4000 examples") == 1, everything
    assert everything.count("1000 examples") == 1, everything
    assert result.stdout.splitlines() == [
        f"test: 1000 examples in 1 shard(s) of ~854,872 bytes -> {out}",
        f"train: 4000 examples in 1 shard(s) of ~3,419,872 bytes -> {out}"]
    result = subprocess.run([sys.executable, "-m", "pipeline.verify", str(out)], cwd=REPO,
                            env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0 and result.stderr == "", result.stderr


def test_conversion_runs_without_importing_tensorflow(tmp_path):
    """Records are encoded by `mnist_contract.wire`: no TensorFlow start-up time or memory."""
    code = ("import sys; from pipeline.__main__ import main; "
            f"rc = main(['--source=sample', '--output={tmp_path / 'out'}', "
            "'--image_format=png']); "
            "print('tensorflow loaded:', 'tensorflow' in sys.modules); sys.exit(rc)")
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert "tensorflow loaded: False" in result.stdout, result.stdout


def test_console_scripts_are_declared_and_documented():
    import importlib
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    assert {name: scripts[name] for name in ("mnist-pipeline", "mnist-trainer", "mnist-verify")
            if name in scripts} == {"mnist-pipeline": "pipeline.__main__:main",
                                    "mnist-trainer": "trainer.__main__:main",
                                    "mnist-verify": "pipeline.verify:main"}
    readme = (REPO / "README.md").read_text()
    for name, target in scripts.items():
        assert f"`{name}`" in readme
        if name != "mnist-trainer":  # the trainer's own tests cover it
            module, function = target.split(":")
            assert callable(getattr(importlib.import_module(module), function))
