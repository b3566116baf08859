"""The job's options (`pipeline.options`): one definition of the flags, parsed once
into one `Options`, values no run could use refused with one line."""

import pickle

import apache_beam as beam
import pytest
from apache_beam.options.pipeline_options import DirectOptions, GoogleCloudOptions

from pipeline import credentials, job, options
from pipeline.__main__ import main
from pipeline.errors import PipelineInputError
from pipeline.options import ConvertOptions, shuffle_mode, unknown_flags
from pipeline.shard import sharding
from tests.helpers import run_job


def job_args(*argv):
    args, rest = options.parse_job_flags(["--output=out", *argv])
    assert rest == []
    return args


def run_options(*argv):
    return options.parse(["--output=out", *argv])


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
    with pytest.raises(options.FlagError, match=None) as caught:
        options.check_values(job_args(flag))
    assert problem in str(caught.value)
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize("argv, hint", [
    (["--outptu=/tmp/x"], "; did you mean --output, not --outptu?"),
    (["--output_dir", "/tmp/x", "--runner=DirectRunner"],
     "; did you mean --output, not --output_dir?"),
    (["--runner=DirectRunner"], ""),
    (["--temp_location=/tmp/t"], ""),
])
def test_a_missing_output_names_the_flag_it_was_probably_meant_as(argv, hint):
    with pytest.raises(options.FlagError) as caught:
        options.parse(["--source=synthetic:10", *argv])
    assert str(caught.value) == "--output is required (a folder or gs://bucket/prefix)" + hint


def test_parse_errors_are_one_line_flag_errors():
    with pytest.raises(options.FlagError, match="--min_shards: invalid int value: 'x'"):
        options.parse_job_flags(["--min_shards=x"])
    with pytest.raises(options.FlagError, match="invalid choice: 'bmp'"):
        options.parse_job_flags(["--image_format=bmp"])
    # No abbreviations: --target_shard is not silently --target_shard_mb.
    assert options.parse_job_flags(["--target_shard=5"])[1] == ["--target_shard=5"]


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
    args = run_options(*argv)
    with pytest.raises(PipelineInputError) as caught:
        sharding.check_sharding(args, {s: SAMPLE[s] for s in args.splits})
    assert problem in str(caught.value)


def test_many_shards_refused_unless_allowed():
    args = run_options("--target_shard_mb=2")
    big = {"train": 30_000_000}  # 25.7 GB -> 12,840 shards of 2 MB
    with pytest.raises(PipelineInputError, match=r"train: 12,840 shards \(over 10,000\)"):
        sharding.check_sharding(args, big)
    sharding.check_sharding(run_options("--target_shard_mb=2", "--allow_extreme_sharding"), big)
    sharding.check_sharding(run_options("--target_shard_mb=0.001", "--allow_extreme_sharding"),
                          SAMPLE)


def test_ordinary_sharding_passes():
    """Accepted, with the shard counts the size estimate gives (856 bytes a raw record)."""
    # The 1,000-digit test split: 1 shard under 1 MB, which is not "tiny sharding".
    assert sharding.check_sharding(run_options(), SAMPLE) == {"train": 1, "test": 1}
    assert sharding.check_sharding(run_options(), {"train": 60_000, "test": 10_000}) == {
        "train": 1, "test": 1}
    assert sharding.check_sharding(run_options("--min_shards=8"),
                                   {"train": 60_000, "test": 10_000}) == {"train": 8, "test": 8}
    assert sharding.check_sharding(run_options("--target_shard_mb=1"),
                                   {"train": 60_000}) == {"train": 52}  # 51.36 MB
    assert sharding.check_sharding(run_options("--image_format=png", "--target_shard_mb=1"),
                                   {"train": 60_000}) == {"train": 21}  # 20.76 MB


def test_one_definition_for_argparse_and_beam():
    parser = options.build_parser()
    ours = {a.dest: a.default for a in parser._actions if a.dest != "help"}
    beam = ConvertOptions([]).get_all_options(current_only=True)
    assert beam == ours
    conv = ConvertOptions(["--target_shard_mb=2.5", "--min_shards=3"])
    assert conv.target_shard_mb == 2.5 and conv.min_shards == 3
    parsed = run_options("--target_shard_mb=2.5", "--min_shards=3")
    assert parsed.target_bytes == 2_500_000 and parsed.min_shards == 3
    # Defined on first use, yet found by name, as pickling (Dataflow) needs.
    assert pickle.loads(pickle.dumps(ConvertOptions)) is ConvertOptions


def test_beam_flags_pass_and_unknown_flags_are_found():
    beam_flags = ["--direct_num_workers=2", "--direct_running_mode=multi_threading",
                  "--temp_location=/tmp/x", "--runner", "DirectRunner",
                  "--experiments=a", "--experiments=b", "--project=p", "--region=r"]
    assert unknown_flags(beam_flags, "DirectRunner") == []
    assert unknown_flags(["--target_shard_mbb=5", "--bogus_flag=1", *beam_flags],
                         "DirectRunner") == ["--target_shard_mbb=5", "--bogus_flag=1"]
    assert unknown_flags(["--max_num_workers=3", "--machine_type=n2"],
                         "DataflowRunner") == []


def test_beam_flags_reach_beam(tmp_path, idx_dir, monkeypatch):
    """The pipeline the job runs carries the Beam flags of the command line."""
    ran = []

    class RecordingPipeline(beam.Pipeline):
        def run(self, *args, **kwargs):
            ran.append(self.options)
            return super().run(*args, **kwargs)

    monkeypatch.setattr(job.beam, "Pipeline", RecordingPipeline)
    manifest = run_job([f"--source={idx_dir}", f"--output={tmp_path}/out",
                        "--direct_num_workers=2", "--direct_running_mode=multi_threading",
                        f"--temp_location={tmp_path}/beam-temp"])
    assert manifest.split("train").num_examples == 360
    [beam_options] = ran
    direct = beam_options.view_as(DirectOptions)
    assert (direct.direct_num_workers, direct.direct_running_mode) == (2, "multi_threading")
    assert beam_options.view_as(GoogleCloudOptions).temp_location == f"{tmp_path}/beam-temp"


@pytest.mark.parametrize("runner, mode", [(None, "files"), ("DirectRunner", "files"),
                                          ("DataflowRunner", "beam"),
                                          ("DaskRunner", "beam")])
def test_auto_shuffle_is_files_only_for_local_runners(runner, mode):
    assert shuffle_mode("auto", runner) == mode


@pytest.mark.parametrize("chosen", ["beam", "files"])
def test_explicit_shuffle_wins(chosen):
    assert shuffle_mode(chosen, "DirectRunner") == chosen
    assert shuffle_mode(chosen, "DataflowRunner") == chosen


def test_a_run_parses_its_command_line_once_and_checks_credentials_once(tmp_path, idx_dir,
                                                                        monkeypatch):
    calls = {"parse": 0, "job flags": 0, "beam options": 0, "credentials": 0}

    def counted(name, real):
        def call(*args, **kwargs):
            calls[name] += 1
            return real(*args, **kwargs)
        return call

    monkeypatch.setattr(options, "parse", counted("parse", options.parse))
    monkeypatch.setattr(options, "parse_job_flags",
                        counted("job flags", options.parse_job_flags))
    monkeypatch.setattr(options, "_beam_options", counted("beam options", options._beam_options))
    monkeypatch.setattr(credentials, "require", counted("credentials", credentials.require))
    assert main([f"--source={idx_dir}", f"--output={tmp_path}/out", "--min_shards=2",
                 "--allow_extreme_sharding", "--runner=DirectRunner"]) == 0
    assert calls == {"parse": 1, "job flags": 1, "beam options": 1, "credentials": 1}


def test_options_are_frozen_and_resolve_the_runner():
    parsed = options.parse(["--output=out", "--splits=test", "--target_shard_bytes=5000"])
    assert parsed.splits == ("test",) and parsed.target_bytes == 5000
    assert parsed.runner == "DirectRunner" and parsed.shuffle_mode == "files"
    assert parsed.data_source.description.startswith("MNIST IDX files at https://")
    with pytest.raises(AttributeError):
        parsed.output = "elsewhere"


@pytest.mark.parametrize("source, meant", [
    ("sampel", "sample"), ("MNIST", "mnist"), ("tdfs", "tfds"),
    ("synthetc:10", "synthetic:10")])
def test_a_misspelled_source_names_the_source_meant(source, meant, capsys):
    """Not a path, close to a named source: one line with the name, before Beam, exit 2."""
    assert main([f"--output={source}-out", f"--source={source}"]) == 2
    assert capsys.readouterr().err == (f"error: --source={source}: no such source or "
                                       f"folder; did you mean --source={meant}?\n")


def test_a_folder_named_like_a_source_is_a_folder(tmp_path, monkeypatch):
    """An existing path is the folder of IDX files it names, however spelt."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "sampel").mkdir()
    options.check_source("sampel")
    with pytest.raises(options.FlagError):
        options.check_source("sampl")
