"""The conversion job: options, the Beam run, then an all-or-nothing finalize.

The graph itself is in `pipeline.transforms`. Only after the runner reports
success does `finalize` move the shards under their final names and write the
metadata, manifest last. A failed or killed run leaves an earlier dataset at
the output untouched.
"""

from __future__ import annotations

import logging
import uuid
from typing import Sequence

import apache_beam as beam
from apache_beam.metrics.metric import MetricsFilter
from apache_beam.options.pipeline_options import (GoogleCloudOptions,
                                                  PipelineOptions,
                                                  StandardOptions)

import mnist_contract as contract

from pipeline import credentials, flags, progress, storage, transforms
from pipeline.errors import PipelineInputError, StorageError, as_pipeline_error
from pipeline.metadata import tfds_metadata_files
from pipeline.options import ConvertOptions, unknown_flags
from pipeline.output import OutputLayout, finalize, prepare_output, remove_temp
from pipeline.sources import announce, parse_source

# Runners Beam ships but does not know by their short name.
RUNNER_ALIASES = {"DaskRunner": "apache_beam.runners.dask.dask_runner.DaskRunner"}


def _check_options(conv: ConvertOptions, options: PipelineOptions,
                   argv: Sequence[str]) -> list[str]:
    """The splits to convert, once every flag is known and every value usable."""
    try:
        splits = flags.check_values(conv)
        _, beam_args = flags.parse(argv)
    except flags.FlagError as e:
        raise PipelineInputError(str(e)) from None
    if len(set(splits)) != len(splits):
        raise PipelineInputError(f"--splits={conv.splits}: a split is named twice")
    runner = options.view_as(StandardOptions).runner or ""
    try:
        unknown = unknown_flags(beam_args, runner)
    except (ValueError, ImportError) as e:
        raise PipelineInputError(f"--runner={runner}: {e}") from None
    if unknown:
        raise PipelineInputError(
            f"unknown flag(s) {' '.join(unknown)}: neither a job option nor a "
            "Beam option (see python -m pipeline --help)")
    if "Dataflow" in runner:
        if not conv.output.startswith("gs://"):
            raise PipelineInputError(
                f"{conv.output}: Dataflow workers need a gs:// --output")
        if not options.view_as(GoogleCloudOptions).temp_location:
            raise PipelineInputError("Dataflow needs --temp_location=gs://...")
    return splits


def _check_credentials(conv: ConvertOptions, options: PipelineOptions) -> None:
    """gs:// or Dataflow without Google credentials: one line now, not minutes later."""
    gcp = options.view_as(GoogleCloudOptions)
    what = credentials.needs_google(
        (conv.output, conv.source, gcp.temp_location, gcp.staging_location),
        options.view_as(StandardOptions).runner)
    if what:
        credentials.check(what)


def _check_sharding(conv: ConvertOptions, source, splits: Sequence[str]) -> None:
    try:
        flags.check_sharding(conv, {s: source.estimated_examples(s) for s in splits})
    except flags.FlagError as e:
        raise PipelineInputError(str(e)) from None


def _report_counters(result, splits: Sequence[str]) -> dict[str, int]:
    """Logs the job's counters, if the runner collects metrics at all.

    Some runners (DaskRunner) have none; the shard list the job writes is
    the source of truth for what was written either way.
    """
    counters = {}
    try:
        query = result.metrics().query(
            MetricsFilter().with_namespace(transforms.COUNTER_NAMESPACE))
    except NotImplementedError:
        logging.info("This runner reports no metrics; counts come from the shard list")
        return counters
    for counter in query["counters"]:
        value = counter.committed if counter.committed is not None else counter.attempted
        counters[counter.key.metric.name] = counters.get(counter.key.metric.name, 0) + value
    for split in splits:
        logging.debug("%s: read %d examples, wrote %d examples in %d bytes", split,
                     counters.get(f"{split}_examples_read", 0),
                     counters.get(f"{split}_examples_written", 0),
                     counters.get(f"{split}_bytes_written", 0))
    return counters


def run(argv: Sequence[str]) -> contract.Manifest:
    """Runs the whole job and returns the manifest of what it wrote."""
    held: list[OutputLayout] = []
    try:
        return _run(argv, held)
    finally:
        for layout in held:  # the output's lock, whatever happened
            layout.release()


def _run(argv: Sequence[str], held: list) -> contract.Manifest:
    storage.configure_gcs()
    options = PipelineOptions(list(argv))
    conv = options.view_as(ConvertOptions)
    standard = options.view_as(StandardOptions)
    if not standard.runner:
        standard.runner = "DirectRunner"  # Beam's default (Prism) needs a download
    standard.runner = RUNNER_ALIASES.get(standard.runner, standard.runner)
    splits = _check_options(conv, options, argv)
    _check_credentials(conv, options)
    source = parse_source(conv.source, conv.download_cache_dir, conv.tfds_data_dir)
    announce(source)
    source.check()
    _check_sharding(conv, source, splits)

    run_id = uuid.uuid4().hex[:12]
    layout = prepare_output(conv.output, run_id, overwrite=conv.overwrite, splits=splits,
                            options={"image_format": conv.image_format,
                                     "compression": conv.compression,
                                     "shuffle_salt": conv.shuffle_salt,
                                     "source": source.description})
    held.append(layout)
    shuffle = conv.shuffle_mode(standard.runner)
    logging.info("Writing %s into temporary folder %s (shuffle: %s)", ",".join(splits),
                 layout.temp_dir, shuffle)
    try:
        settings = transforms.ConvertSettings.from_options(
            conv, source, splits, layout.temp_dir, layout.shard_list_path)
        p = beam.Pipeline(options=options)
        _ = p | "Convert" >> transforms.convert(settings, shuffle)
        with progress.ProgressLogger(layout.temp_dir,
                                     flags.RECORD_BYTES_ESTIMATE[conv.image_format]):
            result = p.run()  # the local runners return only when done
            state = result.wait_until_finish()
        if state != "DONE":
            raise RuntimeError(f"pipeline ended in state {state}")
    except Exception as e:  # the runner re-raises worker errors in many shapes
        known = as_pipeline_error(e, layout.output, layout.earlier)
        if isinstance(known, StorageError) and storage.is_remote(layout.temp_dir):
            logging.warning("Leaving %s: storage is failing; the next run removes it",
                            layout.temp_dir)
        else:
            remove_temp(layout)
        if known is None:
            raise
        raise known from e
    counters = _report_counters(result, splits)
    manifest = finalize(layout, conv, source.description,
                        lambda m: tfds_metadata_files(m, conv.output, source.description))
    for split in splits:
        written = counters.get(f"{split}_examples_written")
        if written is not None and written != manifest.split(split).num_examples:
            raise RuntimeError(f"{split}: counters say {written} examples written "
                               f"but the manifest lists {manifest.split(split).num_examples}")
    return manifest
