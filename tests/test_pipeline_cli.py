"""The job's command line: flags checked before anything runs, one line per refusal."""

import argparse
import os
import subprocess
import sys

import pytest

from pipeline import flags, job
from pipeline.__main__ import main
from pipeline.errors import PipelineInputError
from pipeline.options import ConvertOptions, unknown_flags
from tests.helpers import REPO


def job_args(*argv):
    args, rest = flags.parse(["--output=out", *argv])
    assert rest == []
    return args


def error_lines(capsys):
    err = capsys.readouterr().err
    return [line for line in err.splitlines() if line.startswith("error:")], err


@pytest.mark.parametrize("flag, problem", [
    ("--target_shard_mb=nan", "--target_shard_mb=nan: must be a finite number > 0"),
    ("--target_shard_mb=inf", "--target_shard_mb=inf: must be a finite number > 0"),
    ("--target_shard_mb=-inf", "--target_shard_mb=-inf: must be a finite number > 0"),
    ("--target_shard_mb=0", "--target_shard_mb=0.0: must be a finite number > 0"),
    ("--target_shard_mb=-3", "--target_shard_mb=-3.0: must be a finite number > 0"),
    ("--target_shard_mb=1e-9", "less than one byte per shard"),
    ("--target_shard_bytes=0", "--target_shard_bytes=0: must be > 0"),
    ("--min_shards=0", "--min_shards=0: must be >= 1"),
    ("--min_shards=-2", "--min_shards=-2: must be >= 1"),
    ("--splits=train,valid", "unknown split(s) ['valid']"),
])
def test_values_no_run_could_use_are_refused(flag, problem):
    with pytest.raises(flags.FlagError, match=None) as caught:
        flags.check_values(job_args(flag))
    assert problem in str(caught.value)
    assert "\n" not in str(caught.value)


def test_parse_errors_are_one_line_flag_errors():
    with pytest.raises(flags.FlagError, match="--min_shards: invalid int value: 'x'"):
        flags.parse(["--min_shards=x"])
    with pytest.raises(flags.FlagError, match="invalid choice: 'bmp'"):
        flags.parse(["--image_format=bmp"])
    # No abbreviations: --target_shard is not silently --target_shard_mb.
    assert flags.parse(["--target_shard=5"])[1] == ["--target_shard=5"]


SAMPLE = {"train": 4_000, "test": 1_000}


@pytest.mark.parametrize("argv, problem", [
    (["--target_shard_bytes=500"], "a shard would hold less than one record"),
    (["--image_format=png", "--target_shard_bytes=300"],
     "a shard would hold less than one record"),
    (["--min_shards=100000"], "--min_shards=100000: more shards than records "
                              "(train has 4,000)"),
    (["--min_shards=100000", "--allow_extreme_sharding"], "more shards than records"),
    (["--min_shards=1001", "--splits=test"], "more shards than records (test has 1,000)"),
    (["--target_shard_mb=0.001"], "train: 3,424 shards of ~1,000 bytes (under 1 MB)"),
    (["--min_shards=4"], "train: 4 shards of ~856,000 bytes (under 1 MB)"),
    (["--min_shards=2", "--splits=test"], "test: 2 shards of ~428,000 bytes"),
])
def test_sharding_that_cannot_be_met_or_is_extreme_is_refused(argv, problem):
    args = job_args(*argv)
    with pytest.raises(flags.FlagError) as caught:
        flags.check_sharding(args, {s: SAMPLE[s] for s in flags.split_names(args)})
    assert problem in str(caught.value)


def test_many_shards_refused_unless_allowed():
    args = job_args("--target_shard_mb=2")
    big = {"train": 30_000_000}  # 25.7 GB -> 12,840 shards of 2 MB
    with pytest.raises(flags.FlagError, match=r"train: 12,840 shards \(over 10,000\)"):
        flags.check_sharding(args, big)
    flags.check_sharding(job_args("--target_shard_mb=2", "--allow_extreme_sharding"), big)
    flags.check_sharding(job_args("--target_shard_mb=0.001", "--allow_extreme_sharding"),
                         SAMPLE)


def test_ordinary_sharding_passes():
    flags.check_sharding(job_args(), SAMPLE)  # the 1,000-digit test split: 1 shard < 1 MB
    flags.check_sharding(job_args(), {"train": 60_000, "test": 10_000})
    flags.check_sharding(job_args("--min_shards=8"), {"train": 60_000, "test": 10_000})
    flags.check_sharding(job_args("--target_shard_mb=1"), {"train": 60_000})


def test_one_definition_for_argparse_and_beam():
    parser = flags.build_parser()
    ours = {a.dest: a.default for a in parser._actions if a.dest != "help"}
    beam = ConvertOptions([]).get_all_options(current_only=True)
    assert beam == ours
    conv = ConvertOptions(["--target_shard_mb=2.5", "--min_shards=3"])
    assert conv.target_bytes() == 2_500_000 and conv.min_shards == 3


def test_beam_flags_pass_and_unknown_flags_are_found():
    beam_flags = ["--direct_num_workers=2", "--direct_running_mode=multi_threading",
                  "--temp_location=/tmp/x", "--runner", "DirectRunner",
                  "--experiments=a", "--experiments=b", "--project=p", "--region=r"]
    assert unknown_flags(beam_flags, "DirectRunner") == []
    assert unknown_flags(["--target_shard_mbb=5", "--bogus_flag=1", *beam_flags],
                         "DirectRunner") == ["--target_shard_mbb=5", "--bogus_flag=1"]
    assert unknown_flags(["--max_num_workers=3", "--machine_type=n2"],
                         "DataflowRunner") == []


def test_unknown_flag_is_one_line_exit_2_and_nothing_written(tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["--source=sample", f"--output={out}", "--target_shard_mbb=5",
                 "--bogus_flag=1"]) == 2
    lines, err = error_lines(capsys)
    assert lines == ["error: unknown flag(s) --target_shard_mbb=5 --bogus_flag=1: "
                     "neither a job option nor a Beam option (see python -m pipeline "
                     "--help)"], err
    assert not out.exists()
    with pytest.raises(PipelineInputError, match="unknown flag"):
        job.run(["--source=sample", f"--output={out}", "--runner=DataflowRunner",
                 "--bogus_flag"])


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


def test_beam_flags_reach_beam(tmp_path, idx_dir):
    manifest = job.run([f"--source={idx_dir}", f"--output={tmp_path}/out",
                        "--direct_num_workers=2", "--direct_running_mode=multi_threading",
                        f"--temp_location={tmp_path}/beam-temp"])
    assert manifest.split("train").num_examples == 360


def test_help_lists_every_option_with_default_and_imports_no_beam():
    result = subprocess.run([sys.executable, "-m", "pipeline", "--help"], cwd=REPO,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    text = " ".join(result.stdout.split())
    for action in flags.build_parser()._actions:
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
    assert result.stdout.startswith("usage: python -m pipeline.verify OUTPUT\n\n"
                                    "Re-reads a written dataset end to end.\n")
    assert "``" not in result.stdout and "`" not in result.stdout
    assert "index values must be exactly 0..N-1" in result.stdout
    assert "Exit status: 0 verified, 1 a problem" in result.stdout
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
    from pipeline import console
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
    assert scripts == {"mnist-pipeline": "pipeline.__main__:main",
                       "mnist-trainer": "trainer.__main__:main",
                       "mnist-verify": "pipeline.verify:main"}
    readme = (REPO / "README.md").read_text()
    for name, target in scripts.items():
        assert f"`{name}`" in readme
        if name != "mnist-trainer":  # the trainer's own tests cover it
            module, function = target.split(":")
            assert callable(getattr(importlib.import_module(module), function))
