"""The output folder: one writer at a time, a temp folder, and a crash-safe publish.

While the job runs, everything it writes is under ``OUTPUT/.incomplete-RUNID/``
and the run holds ``OUTPUT/.lock`` (`pipeline.publish.lock`). Readers look
only at top-level files named by the contract; a dataset counts as present
only when ``manifest.json`` exists and no publish journal does
(`pipeline.publish.journal`). Both `prepared_output` and `finalize` take the
run's `pipeline.options.Options`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
from typing import Callable, Iterator, Mapping, Optional, Sequence

import mnist_contract as contract

from mnist_common.stop import deferred
from pipeline import faults, stop, storage
from pipeline.errors import (PipelineError, PipelineInputError, StorageError,
                             failure_summary)
from pipeline.publish import journal, lock
from pipeline.publish.metadata import tfds_metadata_files

TEMP_PREFIX = journal.TEMP_PREFIX
SHARD_LIST = "shards.json"
NO_DATASET = "no dataset was there before"
INTACT = "the earlier dataset there is intact"
# What a signal during the publish leaves: it is completed first.
COMPLETED_FIRST = ("the publish had begun and was completed first: the output holds "
                   "the new dataset")


@dataclasses.dataclass(frozen=True)
class OutputLayout:
    output: str
    temp_dir: str
    lock: Optional[lock.OutputLock] = None
    # Splits of the earlier dataset that this run keeps (--splits named a subset).
    kept: Mapping[str, contract.SplitInfo] = dataclasses.field(default_factory=dict)
    earlier: str = NO_DATASET  # what a failure leaves of the earlier dataset
    # The run whose interrupted publish this run completed, when that is the
    # dataset this run's options describe: nothing is left to write.
    completed_run: str = ""

    @property
    def shard_list_path(self) -> str:
        return contract.join_path(self.temp_dir, SHARD_LIST)

    @property
    def run_id(self) -> str:
        return self.temp_dir.rstrip("/").rsplit("/", 1)[1][len(TEMP_PREFIX):]

    def release(self) -> None:
        if self.lock is not None:
            with deferred():
                self.lock.release()


@contextlib.contextmanager
def _storage_failures(error: Callable[[str], PipelineError],
                      also: tuple[type[BaseException], ...] = ()) -> Iterator[None]:
    """Inside the block, a storage failure becomes ``error(its one-line summary)``.

    Errors the job already reports (`PipelineError`) and errors that are not
    storage failures pass unchanged. ``also``: exception types that count as
    storage failures, summarized by their message.
    """
    try:
        yield
    except PipelineError:
        raise
    except Exception as e:
        summary = failure_summary(e) or (str(e) if isinstance(e, also) else None)
        if summary is None:
            raise
        raise error(summary) from e


@contextlib.contextmanager
def prepared_output(options, run_id: str) -> Iterator[OutputLayout]:
    """Holds ``options.output``'s lock for the block, the output ready for this run.

    Before the block: completes an interrupted publish, then refuses an
    existing dataset unless ``options.overwrite``, and a subset of splits
    that would drop others unless they were written with the same options
    (`_kept_splits`); temp folders of runs that hold no lock are removed,
    with a warning. The completed publish may already be the dataset the
    options describe: the layout's ``completed_run`` says so, and no temp
    folder is made. The lock is released when the block ends, however it
    ends (or at once, if preparing fails).
    """
    layout = _prepare(options, run_id)
    try:
        yield layout
    finally:
        layout.release()


def _prepare(options, run_id: str) -> OutputLayout:
    """Locks the output and prepares it (`prepared_output`); on any failure,
    a signal included, the lock is released again."""
    held = None
    try:
        with deferred():  # a lock file cut half-written would hold off later runs
            held = _lock(options.output, run_id)
        return _prepare_locked(options, run_id, held)
    except BaseException:
        if held is not None:
            held.release()
        raise


def _lock(output: str, run_id: str) -> lock.OutputLock:
    try:
        storage.make_dirs(output)
        return lock.acquire(output, run_id)
    except PipelineError:
        raise
    except Exception as e:  # unwritable, full or unreachable storage
        summary = failure_summary(e) or f"{type(e).__name__}: {e}"
        raise PipelineInputError(f"{output}: output is not writable ({summary}); "
                                 "nothing there was changed") from None


def _roll_forward(output: str, overwrite: bool) -> Optional[journal.Plan]:
    """Completes an interrupted publish (`journal.roll_forward`); returns its plan."""
    try:
        with _storage_failures(lambda summary: StorageError(
                f"{output}: storage failed while completing an interrupted publish "
                f"({summary}); rerun the job once storage works")):
            return journal.roll_forward(output)
    except journal.PublishError as e:
        if not overwrite:
            raise PipelineInputError(f"{e}; pass --overwrite to replace what is there") \
                from None
        logging.warning("%s; --overwrite: replacing what is there", e)
        storage.delete([journal.journal_path(output)])
        return None


def _prepare_locked(options, run_id: str, held: lock.OutputLock) -> OutputLayout:
    output, overwrite = options.output, options.overwrite
    faults.point("locked")
    completed = _roll_forward(output, overwrite)
    if completed and completed.options == dataset_options(options):
        return OutputLayout(output, contract.join_path(output, TEMP_PREFIX + run_id),
                            lock=held, earlier=INTACT, completed_run=completed.run_id)
    with _storage_failures(lambda summary: PipelineInputError(
            f"{output}: output is not readable ({summary})")):
        names = set(storage.list_top(output))
    existing = sorted(n for n in names if journal.is_dataset_file(n))
    if completed and not overwrite:
        raise PipelineInputError(
            f"{output}: completed the interrupted publish of run {completed.run_id}, so it "
            "now holds that dataset; pass --overwrite to replace it")
    if existing and not overwrite:
        raise PipelineInputError(
            f"{output}: already holds a dataset ({existing[0]}, ...); "
            "pass --overwrite to replace it")
    kept = _kept_splits(options, names) if existing else {}
    _remove_abandoned_temp_folders(output, names)
    layout = OutputLayout(output, contract.join_path(output, TEMP_PREFIX + run_id),
                          lock=held, kept=kept, earlier=INTACT if existing else NO_DATASET)
    _probe_writable(layout)
    return layout


def _remove_abandoned_temp_folders(output: str, names: set[str]) -> None:
    """Temp folders of earlier runs: this run holds the lock, so no live run owns them.

    A journal naming one would have been rolled forward (or has failed this
    run) before this is called.
    """
    for folder in sorted(n for n in names if n.startswith(TEMP_PREFIX)):
        path = contract.join_path(output, folder)
        logging.warning("Removing %s, left by an earlier run that did not finish", path)
        try:
            storage.delete_tree(path)
        except Exception as e:
            logging.warning("Could not remove %s (%s, %s); remove it by hand", path,
                            storage.tree_size(path), failure_summary(e) or e)


def _probe_writable(layout: OutputLayout) -> None:
    """Writes and removes a file in the run's temp folder, so a read-only output fails now."""
    def unwritable(summary: str) -> PipelineInputError:
        remove_temp(layout)
        return PipelineInputError(f"{layout.output}: output is not writable ({summary}); "
                                  f"{layout.earlier}")

    probe = contract.join_path(layout.temp_dir, ".probe")
    with _storage_failures(unwritable):
        storage.make_dirs(layout.temp_dir)
        storage.write_bytes(probe, b"")
        storage.delete([probe])


def _manifest_options(options) -> dict[str, str]:
    """The run's values of the manifest fields that make two runs one dataset."""
    return {"image_format": options.image_format, "compression": options.compression,
            "shuffle_salt": options.shuffle_salt,
            "source": options.data_source.description}


def dataset_options(options) -> dict:
    """The run's options that decide the bytes it publishes, as JSON values.

    Two runs with equal values write the same files. The runner, the shuffle
    mode and --allow_extreme_sharding do not change the output; the shard
    target is compared in bytes, however it was given.
    """
    return {**_manifest_options(options), "splits": sorted(options.splits),
            "target_shard_bytes": options.target_bytes, "min_shards": options.min_shards}


def _kept_splits(options, names: set[str]) -> dict[str, contract.SplitInfo]:
    """Splits of the existing dataset that --splits leaves out, if they can be kept.

    They are kept when they were written with the same options (so the
    merged dataset is one dataset); otherwise the run is refused, since
    publishing would delete them.
    """
    output, splits = options.output, options.splits
    everything = ",".join(contract.SPLITS)
    path = contract.join_path(output, contract.MANIFEST_FILE)
    if set(splits) == set(contract.SPLITS):
        return {}
    try:
        old = contract.Manifest.from_json(storage.read_bytes(path), path)
    except (contract.ContractError, OSError) as e:
        raise PipelineInputError(
            f"{output}: --splits={','.join(splits)} would replace only part of a dataset "
            f"whose manifest cannot be read ({str(e)[:200]}); pass --splits={everything} "
            "to replace all of it") from None
    others = sorted(set(old.splits) - set(splits))
    if not others:
        return {}
    ours = _manifest_options(options)
    diffs = [f"{key} {getattr(old, key)!r} vs {value!r}"
             for key, value in ours.items() if getattr(old, key) != value]
    missing = [s.file for name in others for s in old.splits[name].shards
               if s.file not in names]
    if diffs or missing:
        why = (f"written with other options ({'; '.join(diffs)})" if diffs
               else f"missing {missing[0]}")
        raise PipelineInputError(
            f"{output}: --splits={','.join(splits)} would drop split(s) "
            f"{','.join(others)} of the existing dataset, {why}; pass "
            f"--splits={everything} to replace all of it, or the same options to keep them")
    logging.info("Keeping split(s) %s of the existing dataset (same options)",
                 ",".join(others))
    return {name: old.splits[name] for name in others}


def remove_temp(layout: OutputLayout) -> None:
    """Removes the run's temp folder, or warns naming what is left and its size."""
    try:
        with deferred():
            storage.delete_tree(layout.temp_dir)
    except Exception as e:
        logging.warning("Could not remove %s (%s): %s; the next run removes it",
                        layout.temp_dir, storage.tree_size(layout.temp_dir),
                        failure_summary(e) or e)


def _read_shard_list(layout: OutputLayout) -> list[dict]:
    return json.loads(storage.read_bytes(layout.shard_list_path))


def build_manifest(shard_infos: list[dict], options,
                   kept: Optional[Mapping[str, contract.SplitInfo]] = None
                   ) -> contract.Manifest:
    """The manifest of the written shards (plus ``kept`` splits), validated."""
    per_split: dict[str, list[dict]] = {}
    for info in shard_infos:
        per_split.setdefault(info["split"], []).append(info)
    splits = dict(kept or {})
    for split, infos in per_split.items():
        infos.sort(key=lambda i: i["file"])
        splits[split] = contract.SplitInfo(split, tuple(
            contract.ShardInfo(i["file"], i["num_examples"], i["num_bytes"],
                               i["sha256"]) for i in infos))
    manifest = contract.Manifest(dataset=contract.DATASET_NAME, splits=splits,
                                 **_manifest_options(options))
    # Round-trips through the validating parser: a gap in shard numbering fails here.
    return contract.Manifest.from_json(manifest.to_json(), "new manifest")


def finalize(layout: OutputLayout, options) -> contract.Manifest:
    """Checks the temp shards, stages the metadata, then publishes (`journal`).

    A storage failure ends in a `StorageError` that says what state the
    output is in: earlier dataset intact, or an interrupted publish that the
    next run completes. A signal during the publish stops the job once the
    publish is complete (`mnist_common.stop.Stopped` with ``COMPLETED_FIRST``,
    `pipeline.stop.last_step`).
    """
    journal_written = False
    with _storage_failures(lambda summary: StorageError(
            f"{layout.output}: storage failed while publishing ({summary}); "
            f"{_state_after(layout, journal_written)}"), also=(journal.PublishError,)):
        manifest = build_manifest(_read_shard_list(layout), options, layout.kept)
        moved = [s for name, split in manifest.splits.items() if name not in layout.kept
                 for s in split.shards]
        _check_temp_sizes(layout, moved)
        metadata = _stage_metadata(layout, manifest, options)
        if layout.lock is not None:
            layout.lock.check_held()
        plan = journal.make_plan(
            layout.output, layout.temp_dir, layout.run_id, moved,
            [s.file for split in layout.kept.values() for s in split.shards],
            [n for n in contract.TFDS_METADATA_FILES if n in metadata],
            metadata[contract.MANIFEST_FILE], dataset_options(options))
        journal_written = True  # from here on, the journal may exist
        # Once begun, the publish (seconds) is completed before a signal is acted on.
        with stop.last_step(COMPLETED_FIRST):
            journal.publish(layout.output, plan)
    for split, info in sorted(manifest.splits.items()):
        logging.debug("%s: %d examples in %d shard(s) of %s bytes -> %s", split,
                      info.num_examples, len(info.shards),
                      "/".join(str(s.num_bytes) for s in info.shards[:4]) +
                      ("/..." if len(info.shards) > 4 else ""), layout.output)
    return manifest


def _check_temp_sizes(layout: OutputLayout, shards: Sequence[contract.ShardInfo]) -> None:
    for shard in shards:
        size = storage.size_of(contract.join_path(layout.temp_dir, shard.file))
        if size != shard.num_bytes:
            raise RuntimeError(f"{shard.file}: temp file has {size} bytes, "
                               f"expected {shard.num_bytes}")


def _stage_metadata(layout: OutputLayout, manifest: contract.Manifest,
                    options) -> dict[str, bytes]:
    """Writes the manifest (and, uncompressed, TFDS's files) into the temp folder."""
    metadata = {contract.MANIFEST_FILE: manifest.to_json().encode()}
    if options.compression == "none":
        metadata.update(tfds_metadata_files(manifest, options.output,
                                            options.data_source.description))
    else:
        logging.info("Compressed output: no TFDS metadata (TFDS reads only "
                     "uncompressed TFRecords); manifest.json describes the files.")
    for name, data in metadata.items():
        storage.write_bytes(contract.join_path(layout.temp_dir, name), data)
    return metadata


def state_before_writing(output: str) -> str:
    """After a signal before the run's temp folder exists: what the output holds
    (an interrupted publish this run was completing, or what was there)."""
    path = journal.journal_path(output)
    try:
        pending = storage.exists(path)
    except Exception:  # storage failing: say what is known
        pending = False
    if pending:
        return (f"{path} is still there: an interrupted publish; rerun the job "
                "to complete it")
    return "nothing was written"


def interrupted_state(layout: OutputLayout) -> str:
    """After an interrupt at any point of the run: what the output holds
    (the temp folder is removed unless a journal needs it)."""
    return _state_after(layout, journal_written=True)


def _state_after(layout: OutputLayout, journal_written: bool) -> str:
    """The truth about the output after publishing failed, for the error line."""
    path = journal.journal_path(layout.output)
    if journal_written:
        try:
            present = storage.exists(path)
        except Exception:
            return (f"storage is unreachable, so its state is unknown: if {path} "
                    "exists, the publish was interrupted; rerun the job to complete it")
        if present:
            return (f"interrupted publish of run {layout.run_id}: the output holds no "
                    f"complete dataset until a rerun of the job completes it from "
                    f"{layout.temp_dir}")
    remove_temp(layout)
    return layout.earlier
