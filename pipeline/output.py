"""The output folder: one writer at a time, a temp folder, and a crash-safe publish.

While the job runs, everything it writes is under ``OUTPUT/.incomplete-RUNID/``
and the run holds ``OUTPUT/.lock`` (`pipeline.lock`). Readers look only at
top-level files named by the contract; a dataset counts as present only when
``manifest.json`` exists and no publish journal does (`pipeline.publish`).
"""

from __future__ import annotations

import dataclasses
import json
import logging
from typing import Callable, Mapping, Optional, Sequence

import mnist_contract as contract

from pipeline import lock, publish, storage
from pipeline.errors import PipelineError, PipelineInputError, StorageError

TEMP_PREFIX = ".incomplete-"
SHARD_LIST = "shards.json"
NO_DATASET = "no dataset was there before"
INTACT = "the earlier dataset there is intact"


@dataclasses.dataclass(frozen=True)
class OutputLayout:
    output: str
    temp_dir: str
    lock: Optional[lock.OutputLock] = None
    # Splits of the earlier dataset that this run keeps (--splits named a subset).
    kept: Mapping[str, contract.SplitInfo] = dataclasses.field(default_factory=dict)
    earlier: str = NO_DATASET  # what a failure leaves of the earlier dataset

    @property
    def shard_list_path(self) -> str:
        return contract.join_path(self.temp_dir, SHARD_LIST)

    @property
    def run_id(self) -> str:
        return self.temp_dir.rstrip("/").rsplit("/", 1)[1][len(TEMP_PREFIX):]

    def release(self) -> None:
        if self.lock is not None:
            self.lock.release()


def _is_dataset_file(name: str) -> bool:
    return publish.is_dataset_file(name)


def prepare_output(output: str, run_id: str, overwrite: bool,
                   splits: Sequence[str] = contract.SPLITS,
                   options: Optional[Mapping[str, str]] = None) -> OutputLayout:
    """Locks the output, completes an interrupted publish, checks what is there.

    Refuses an existing dataset unless overwriting, and a subset of splits that
    would drop others unless their options match (``options``: image_format,
    compression, shuffle_salt, source, compared with the manifest). Temp
    folders of runs that hold no lock are removed, with a warning. On any
    failure the lock is released again.
    """
    try:
        storage.make_dirs(output)
        held = lock.acquire(output, run_id)
    except PipelineError:
        raise
    except Exception as e:  # unwritable, full or unreachable storage
        summary = storage.failure_summary(e) or f"{type(e).__name__}: {e}"
        raise PipelineInputError(f"{output}: output is not writable ({summary}); "
                                 "nothing there was changed") from None
    try:
        return _prepare_locked(output, run_id, overwrite, splits, options or {}, held)
    except BaseException:
        held.release()
        raise


def _prepare_locked(output, run_id, overwrite, splits, options, held) -> OutputLayout:
    try:
        completed = publish.roll_forward(output)
    except publish.PublishError as e:
        if not overwrite:
            raise PipelineInputError(f"{e}; pass --overwrite to replace what is there") \
                from None
        logging.warning("%s; --overwrite: replacing what is there", e)
        storage.delete([publish.journal_path(output)])
        completed = None
    except Exception as e:
        summary = storage.failure_summary(e)
        if summary is None:
            raise
        raise StorageError(
            f"{output}: storage failed while completing an interrupted publish "
            f"({summary}); rerun the job once storage works") from None
    try:
        names = set(storage.list_top(output))
    except Exception as e:
        summary = storage.failure_summary(e)
        if summary is None:
            raise
        raise PipelineInputError(f"{output}: output is not readable ({summary})") from None
    existing = sorted(n for n in names if _is_dataset_file(n))
    if completed and not overwrite:
        raise PipelineInputError(
            f"{output}: completed the interrupted publish of run {completed}, so it "
            "now holds that dataset; pass --overwrite to replace it")
    if existing and not overwrite:
        raise PipelineInputError(
            f"{output}: already holds a dataset ({existing[0]}, ...); "
            "pass --overwrite to replace it")
    kept = _kept_splits(output, names, splits, options) if existing else {}
    for folder in sorted(n for n in names if n.startswith(TEMP_PREFIX)):
        path = contract.join_path(output, folder)
        # We hold the lock, so no live run owns these; a journal would have been
        # rolled forward (or has failed this run) above.
        logging.warning("Removing %s, left by an earlier run that did not finish", path)
        try:
            storage.delete_tree(path)
        except Exception as e:
            logging.warning("Could not remove %s (%s, %s); remove it by hand", path,
                            storage.tree_size(path), storage.failure_summary(e) or e)
    layout = OutputLayout(output, contract.join_path(output, TEMP_PREFIX + run_id),
                          lock=held, kept=kept, earlier=INTACT if existing else NO_DATASET)
    probe = contract.join_path(layout.temp_dir, ".probe")
    try:
        storage.make_dirs(layout.temp_dir)
        storage.write_bytes(probe, b"")
        storage.delete([probe])
    except Exception as e:
        summary = storage.failure_summary(e)
        if summary is None:
            raise
        remove_temp(layout)
        raise PipelineInputError(f"{output}: output is not writable ({summary}); "
                                 f"{layout.earlier}") from None
    return layout


_MATCHED_OPTIONS = ("image_format", "compression", "shuffle_salt", "source")


def _kept_splits(output: str, names: set[str], splits: Sequence[str],
                 options: Mapping[str, str]) -> dict[str, contract.SplitInfo]:
    """Splits of the existing dataset that --splits leaves out, if they can be kept.

    They are kept when they were written with the same options (so the
    merged dataset is one dataset); otherwise the run is refused, since
    publishing would delete them.
    """
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
    diffs = [f"{key} {getattr(old, key)!r} vs {options[key]!r}"
             for key in _MATCHED_OPTIONS if key in options and getattr(old, key) != options[key]]
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
        storage.delete_tree(layout.temp_dir)
    except Exception as e:
        logging.warning("Could not remove %s (%s): %s; the next run removes it",
                        layout.temp_dir, storage.tree_size(layout.temp_dir),
                        storage.failure_summary(e) or e)


def _read_shard_list(layout: OutputLayout) -> list[dict]:
    return json.loads(storage.read_bytes(layout.shard_list_path))


def build_manifest(shard_infos: list[dict], conv, source_description: str,
                   kept: Optional[Mapping[str, contract.SplitInfo]] = None
                   ) -> contract.Manifest:
    per_split: dict[str, list[dict]] = {}
    for info in shard_infos:
        per_split.setdefault(info["split"], []).append(info)
    splits = dict(kept or {})
    for split, infos in per_split.items():
        infos.sort(key=lambda i: i["file"])
        splits[split] = contract.SplitInfo(split, tuple(
            contract.ShardInfo(i["file"], i["num_examples"], i["num_bytes"],
                               i["sha256"]) for i in infos))
    manifest = contract.Manifest(
        dataset=contract.DATASET_NAME, image_format=conv.image_format,
        compression=conv.compression, splits=splits, source=source_description,
        shuffle_salt=conv.shuffle_salt)
    # Round-trips through the validating parser: a gap in shard numbering fails here.
    return contract.Manifest.from_json(manifest.to_json(), "new manifest")


def finalize(layout: OutputLayout, conv, source_description: str,
             tfds_files: Callable[[contract.Manifest], dict[str, bytes]]
             ) -> contract.Manifest:
    """Checks the temp shards, stages the metadata, then publishes (`pipeline.publish`).

    A storage failure ends in a `StorageError` that says what state the
    output is in: earlier dataset intact, or an interrupted publish that the
    next run completes.
    """
    journal_written = False
    try:
        manifest = build_manifest(_read_shard_list(layout), conv, source_description,
                                  layout.kept)
        moved = [s for name, split in manifest.splits.items() if name not in layout.kept
                 for s in split.shards]
        for shard in moved:
            size = storage.size_of(contract.join_path(layout.temp_dir, shard.file))
            if size != shard.num_bytes:
                raise RuntimeError(f"{shard.file}: temp file has {size} bytes, "
                                   f"expected {shard.num_bytes}")
        metadata = {contract.MANIFEST_FILE: manifest.to_json().encode()}
        if conv.compression == "none":
            metadata.update(tfds_files(manifest))
        else:
            logging.info("Compressed output: no TFDS metadata (TFDS reads only "
                         "uncompressed TFRecords); manifest.json describes the files.")
        for name, data in metadata.items():
            storage.write_bytes(contract.join_path(layout.temp_dir, name), data)
        if layout.lock is not None:
            layout.lock.check_held()
        plan = publish.make_plan(
            layout.output, layout.temp_dir, layout.run_id, moved,
            [s.file for split in layout.kept.values() for s in split.shards],
            [n for n in contract.TFDS_METADATA_FILES if n in metadata],
            metadata[contract.MANIFEST_FILE])
        journal_written = True  # from here on, the journal may exist
        publish.publish(layout.output, plan)
    except PipelineError:
        raise
    except Exception as e:
        summary = storage.failure_summary(e)
        if summary is None and not isinstance(e, publish.PublishError):
            raise
        raise StorageError(f"{layout.output}: storage failed while publishing "
                           f"({summary or e}); {_state_after(layout, journal_written)}"
                           ) from e
    for split, info in sorted(manifest.splits.items()):
        logging.debug("%s: %d examples in %d shard(s) of %s bytes -> %s", split,
                     info.num_examples, len(info.shards),
                     "/".join(str(s.num_bytes) for s in info.shards[:4]) +
                     ("/..." if len(info.shards) > 4 else ""), layout.output)
    return manifest


def _state_after(layout: OutputLayout, journal_written: bool) -> str:
    """The truth about the output after publishing failed, for the error line."""
    journal = publish.journal_path(layout.output)
    if journal_written:
        try:
            present = storage.exists(journal)
        except Exception:
            return (f"storage is unreachable, so its state is unknown: if {journal} "
                    "exists, the publish was interrupted; rerun the job to complete it")
        if present:
            return (f"interrupted publish of run {layout.run_id}: the output holds no "
                    f"complete dataset until a rerun of the job completes it from "
                    f"{layout.temp_dir}")
    remove_temp(layout)
    return layout.earlier
