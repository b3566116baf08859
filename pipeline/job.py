"""The conversion job: the Beam run of one `pipeline.options.Options`, then an
all-or-nothing finalize.

The graph itself is in `pipeline.shard.transforms`. Only after the runner
reports success does `finalize` move the shards under their final names and
write the metadata, manifest last. A failed or killed run leaves an earlier
dataset at the output untouched.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import logging
import os
import uuid
from typing import Optional, Sequence

import apache_beam as beam
from apache_beam.metrics.metric import MetricsFilter
from apache_beam.options.pipeline_options import DirectOptions

import mnist_contract as contract
from mnist_common.stop import Stopped

from pipeline import _compat, progress, stop, storage
from pipeline.errors import Interrupted, PipelineInputError, StorageError, as_pipeline_error
from pipeline.options import LOCAL_RUNNERS, Options
from pipeline.publish.output import (OutputLayout, finalize, interrupted_state,
                                     prepared_output, remove_temp, state_before_writing)
from pipeline.shard import sharding, transforms
from pipeline.shard.config import SHARDS
from pipeline.source.sources import BATCH, announce


def _runner(name: str):
    """The runner object for ``--runner=name``, or None to let Beam make it.

    Beam's DirectRunner would try to download and run Prism first
    (`pipeline._compat.direct_runner_without_prism`); the job's local runs
    stay on the in-process runners its file shuffle is built for. Their
    worker processes, if any, leave signals to the driver (`pipeline.stop`).
    """
    if name in ("DirectRunner", "SwitchingDirectRunner"):
        _compat.worker_processes_ignore_stop_signals()  # the driver stops them
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


@dataclasses.dataclass(frozen=True)
class JobResult:
    """What `run` did, for the command line to report (both exit 0).

    ``manifest`` lists the dataset the run wrote. Or the output already
    held the dataset the options describe once the run had completed the
    interrupted publish of run ``completed_run``: nothing was left to write
    and ``manifest`` is None.
    """

    output: str
    manifest: Optional[contract.Manifest] = None
    completed_run: str = ""

    @property
    def nothing_left(self) -> str:
        """The line saying the output already holds the dataset ("" if the run wrote it)."""
        if not self.completed_run:
            return ""
        return (f"{self.output}: completed the interrupted publish of run "
                f"{self.completed_run}, which is the dataset these options describe; "
                "nothing left to do")


def run(options: Options) -> JobResult:
    """Runs the whole job, holding the output's lock from before it touches the
    output until it ends, whatever happens.

    A signal (`pipeline.stop`) ends it with `Interrupted`, saying what the
    output holds: the temp folder is removed unless a publish journal needs it.
    Once the dataset is published the job is done, and a signal is ignored.
    """
    try:
        _check_input(options)
        with prepared_output(options, uuid.uuid4().hex[:12]) as layout:
            if layout.completed_run:
                stop.too_late()
                return JobResult(options.output, completed_run=layout.completed_run)
            try:
                return JobResult(options.output, manifest=_write(options, layout))
            except Stopped as e:
                raise Interrupted.by(e, options.output,
                                     e.detail or interrupted_state(layout)) from None
    except Stopped as e:
        raise Interrupted.by(e, options.output, state_before_writing(options.output)) \
            from None


def _check_input(options: Options) -> None:
    """Refuses, before the output is touched, a source or sharding that cannot work."""
    storage.configure_gcs()
    announce(options.data_source)
    options.data_source.check()
    sharding.check_sharding(
        options, {split: options.data_source.estimated_examples(split)
                  for split in options.splits})
    if options.shuffle_mode == "files":
        _check_open_files(options)


def _check_open_files(options: Options) -> None:
    """Raises the open-file limit as far as the file shuffle's merges need, or
    refuses the run if the hard limit is too low."""
    source = options.data_source
    files = {split: max(len(source.read_tasks(split)),
                        -(-source.estimated_examples(split) // BATCH))
             for split in options.splits}
    workers = options.beam.view_as(DirectOptions).direct_num_workers or os.cpu_count() or 1
    needed = sharding.open_files_needed(files, workers)
    limit = storage.raise_open_file_limit(needed)
    if limit < needed:
        split = max(files, key=files.get)
        raise PipelineInputError(
            f"{split}: a shard's merge holds its ~{files[split]:,} spill files open "
            f"({needed:,} open files in all with {workers} worker(s)), over the {limit:,} "
            "this process may open (ulimit -n, raised up to ulimit -Hn); raise the hard "
            "limit, or use a distributed runner (--shuffle=beam)")


def _write(options: Options, layout: OutputLayout) -> contract.Manifest:
    """Runs the graph into the layout's temp folder and publishes what it wrote."""
    logging.info("Writing %s into temporary folder %s (shuffle: %s)",
                 ",".join(options.splits), layout.temp_dir, options.shuffle_mode)
    with heap_frozen():
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
            result, state = stop.run_in_thread(lambda: _run_to_end(p),
                                               local=options.runner in LOCAL_RUNNERS)
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
    return result


@contextlib.contextmanager
def heap_frozen():
    """Keeps the cyclic garbage collector off the objects that exist before a run
    and its publish.

    A local run creates millions of short-lived tracked objects (the
    runner's elements, a view per record in the shard merge), so the
    collector runs often, and each full collection walks every object in
    the process: the ~150,000 of Beam's modules and the graph among them.
    `gc.freeze` moves those to a permanent generation the collector skips
    (docs/benchmarks.md measures what that saves). Objects made during the
    run are collected as usual; afterwards everything is collectable again.
    """
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


def _run_to_end(p: beam.Pipeline):
    """(result, final state) of running ``p``; the local runners return only when done."""
    result = p.run()
    return result, result.wait_until_finish()
