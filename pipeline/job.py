"""The conversion job: the Beam run of one `pipeline.options.Options`, then an all-or-nothing finalize.

The graph itself is in `pipeline.shard.transforms`. Only after the runner
reports success does `finalize` move the shards under their final names and
write the metadata, manifest last. A failed or killed run leaves an earlier
dataset at the output untouched.
"""

from __future__ import annotations

import logging
import uuid
from typing import Sequence

import apache_beam as beam
from apache_beam.metrics.metric import MetricsFilter

import mnist_contract as contract

from pipeline import _compat, progress, storage
from pipeline.errors import (Interrupted, PipelineInputError, StorageError,
                             as_pipeline_error, is_interrupt)
from pipeline.options import Options
from pipeline.publish.output import (OutputLayout, finalize, interrupted_state,
                                     prepare_output, remove_temp)
from pipeline.shard import sharding, transforms
from pipeline.shard.config import SHARDS
from pipeline.source.sources import announce


def _runner(name: str):
    """The runner object for ``--runner=name``, or None to let Beam make it.

    Beam's DirectRunner would try to download and run Prism first
    (`pipeline._compat.direct_runner_without_prism`); the job's local runs
    stay on the in-process runners its file shuffle is built for.
    """
    if name in ("DirectRunner", "SwitchingDirectRunner"):
        return _compat.direct_runner_without_prism()
    return None


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


def run(options: Options) -> contract.Manifest:
    """Runs the whole job and returns the manifest of what it wrote."""
    held: list[OutputLayout] = []
    try:
        return _run(options, held)
    except KeyboardInterrupt:
        state = interrupted_state(held[0]) if held else "nothing was written"
        raise Interrupted(f"{options.output}: interrupted (SIGINT); {state}") from None
    finally:
        for layout in held:  # the output's lock, whatever happened
            layout.release()


def _run(options: Options, held: list) -> contract.Manifest:
    storage.configure_gcs()
    announce(options.data_source)
    options.data_source.check()
    sharding.check_sharding(
        options, {split: options.data_source.estimated_examples(split)
                  for split in options.splits})
    layout = prepare_output(options, uuid.uuid4().hex[:12])
    held.append(layout)
    logging.info("Writing %s into temporary folder %s (shuffle: %s)",
                 ",".join(options.splits), layout.temp_dir, options.shuffle_mode)
    result = _run_beam(options, layout)
    counters = _report_counters(result, options.splits)
    manifest = finalize(layout, options)
    for split in options.splits:
        written = counters.get(f"{split}_examples_written")
        if written is not None and written != manifest.split(split).num_examples:
            raise RuntimeError(f"{split}: counters say {written} examples written "
                               f"but the manifest lists {manifest.split(split).num_examples}")
    return manifest


def _run_beam(options: Options, layout: OutputLayout):
    """Runs the graph into the layout's temp folder; on failure, one-line errors.

    The temp folder is removed after a failure, unless storage itself is
    failing (the next run removes it then).
    """
    try:
        settings = transforms.ConvertSettings.from_options(
            options, layout.temp_dir, layout.shard_list_path)
        p = beam.Pipeline(runner=_runner(options.runner), options=options.beam)
        _ = p | "Convert" >> transforms.convert(settings, options.shuffle_mode)
        with progress.ProgressLogger(layout.temp_dir,
                                     SHARDS.record_bytes(options.image_format)):
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
        if known is None and is_interrupt(e):
            raise KeyboardInterrupt from None  # `run` reports what the output holds
        if known is None:
            raise
        raise known from e
    return result
