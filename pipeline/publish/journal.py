"""Publishing a finished run so that a crash at any step can be rolled forward.

Moving shards under their final names cannot be atomic: on ``gs://`` each
rename is a copy plus a delete, seconds per 100 MB shard. So before the first
change a *journal* (`mnist_contract.PUBLISH_JOURNAL_FILE`) is written at the
top of the output: the run id, its temp folder, every shard to move with its
size, the TFDS files to move, the new manifest's sha256, every old file to
delete, and the run's options that define the dataset (so a rerun can tell
whether the publish it completes is the dataset it was asked for). While it
exists readers refuse the folder with one line ("interrupted publish of run
R; rerun the job"). Then, in this order:

1. the old metadata is removed (TFDS files first, then ``manifest.json``), so
   neither TFDS nor an older reader can pair it with new shards;
2. each shard is moved from the temp folder to its final name;
3. old files the new dataset does not have are deleted;
4. the new TFDS files are moved, then ``manifest.json`` (its sha256 checked);
5. the journal is deleted, then the temp folder.

The journal names only plain children of the output that the job makes (its
``.incomplete-RUNID`` folder, shard and TFDS file names), and a temp folder
or a file in it that is a symbolic link is refused before anything changes.

Every step is idempotent given the journal: a file still in the temp folder
has not been moved (or was copied but not yet deleted on GCS) and is moved
again; one that is gone from it must be at its final name with the journal's
size. So the next run replays the same `apply` to complete an interrupted
publish, and the temp folder a journal names is never cleaned up before that.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import re
from typing import Any, Iterable, Mapping, Optional

import mnist_contract as contract

from pipeline import faults, storage
from pipeline.errors import failure_summary

JOURNAL_VERSION = 1
METADATA = contract.TFDS_METADATA_FILES + (contract.MANIFEST_FILE,)
TEMP_PREFIX = ".incomplete-"  # a run's temp folder: TEMP_PREFIX + its run id
_RUN_ID = re.compile(r"[A-Za-z0-9_-]+")


class PublishError(Exception):
    """The journal's publish cannot be completed (a file it needs is gone)."""


@dataclasses.dataclass(frozen=True)
class Plan:
    run_id: str
    temp_name: str  # the run's temp folder, relative to the output
    shards: tuple[tuple[str, int], ...]  # (file, bytes) moved from the temp folder
    metadata: tuple[str, ...]  # TFDS files moved after the shards
    manifest_sha256: str
    deletes: tuple[str, ...]  # old files the new dataset does not have
    # `pipeline.publish.output.dataset_options` of the run; empty if unknown.
    options: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    def to_json(self) -> bytes:
        return json.dumps({"version": JOURNAL_VERSION, **dataclasses.asdict(self)},
                          indent=1).encode()

    @classmethod
    def from_json(cls, data: bytes, origin: str) -> "Plan":
        try:
            raw = json.loads(data.decode())
            if raw.pop("version") != JOURNAL_VERSION:
                raise ValueError("unknown version")
            plan = cls(run_id=str(raw["run_id"]), temp_name=str(raw["temp_name"]),
                       shards=tuple((str(f), int(n)) for f, n in raw["shards"]),
                       metadata=tuple(str(n) for n in raw["metadata"]),
                       manifest_sha256=str(raw["manifest_sha256"]),
                       deletes=tuple(str(n) for n in raw["deletes"]),
                       options=dict(raw.get("options", {})))
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            raise PublishError(f"{origin}: unreadable publish journal ({e})") from None
        foreign = plan.foreign_name()
        if foreign:
            raise PublishError(f"{origin}: publish journal names {foreign!r}, not a file "
                               "or folder this job makes in the output")
        return plan

    def foreign_name(self) -> str:
        """The first name that is not a plain child of the output that the job
        makes (its temp folder, a shard, a metadata file), else ""."""
        if not (self.temp_name == TEMP_PREFIX + self.run_id and _RUN_ID.fullmatch(self.run_id)):
            return self.temp_name
        shards = [f for f, _ in self.shards]
        return next((n for n in shards if n in METADATA or not is_dataset_file(n)), "") or \
            next((n for n in self.metadata if n not in contract.TFDS_METADATA_FILES), "") or \
            next((n for n in self.deletes if not is_dataset_file(n)), "")


def is_dataset_file(name: str) -> bool:
    if name in METADATA:
        return True
    try:
        contract.parse_shard_filename(name)
    except contract.ContractError:
        return False
    return True


def make_plan(output: str, temp_dir: str, run_id: str, moved: Iterable[contract.ShardInfo],
              keep: Iterable[str], metadata: Iterable[str], manifest_bytes: bytes,
              options: Optional[Mapping[str, Any]] = None) -> Plan:
    """The plan for publishing ``moved`` shards (plus ``keep``, already in place);
    ``options``: what defines the dataset (`Plan.options`)."""
    moved = list(moved)
    metadata = tuple(n for n in metadata if n != contract.MANIFEST_FILE)
    new = {s.file for s in moved} | set(keep) | set(metadata) | {contract.MANIFEST_FILE}
    old = {n for n in storage.top_level(output) if is_dataset_file(n)}
    return Plan(run_id=run_id, temp_name=temp_dir.rstrip("/").rsplit("/", 1)[1],
                shards=tuple((s.file, s.num_bytes) for s in moved), metadata=metadata,
                manifest_sha256=hashlib.sha256(manifest_bytes).hexdigest(),
                deletes=tuple(sorted(old - new)), options=dict(options or {}))


def journal_path(output: str) -> str:
    return contract.join_path(output, contract.PUBLISH_JOURNAL_FILE)


def publish(output: str, plan: Plan) -> None:
    """Writes the journal (atomically: into the temp folder, then renamed), then applies it."""
    temp = contract.join_path(output, plan.temp_name)
    staged = contract.join_path(temp, contract.PUBLISH_JOURNAL_FILE)
    storage.write_bytes(staged, plan.to_json())
    faults.point("journal-staged")
    storage.rename([staged], [journal_path(output)])
    faults.point("journal-written")
    apply(output, plan)


def read_journal(output: str) -> Optional[Plan]:
    path = journal_path(output)
    if not storage.exists(path):
        return None
    try:
        data = storage.read_bytes(path)
    except storage.NotAFile as e:  # a FIFO would block the read forever
        raise PublishError(f"{path}: {e.strerror}") from None
    return Plan.from_json(data, path)


def roll_forward(output: str) -> Optional[Plan]:
    """Completes an interrupted publish, if any; returns its plan."""
    plan = read_journal(output)
    if plan is None:
        return None
    logging.warning("%s: completing the interrupted publish of run %s from %s",
                    output, plan.run_id, contract.join_path(output, plan.temp_name))
    apply(output, plan)
    return plan


def _move(output: str, temp: str, name: str, present: set[str], staged: set[str],
          check=None) -> None:
    source, final = contract.join_path(temp, name), contract.join_path(output, name)
    if name in staged:
        if check:
            check(source)
        storage.rename([source], [final])
        faults.point(f"moved:{name}")
    elif name not in present:
        raise PublishError(f"{source}: missing, and {final} is not there either: the "
                           "interrupted publish cannot be completed")


def _refuse_links(temp: str, staged: set[str]) -> None:
    """Raises `PublishError`, before anything changes, if the temp folder or a
    file in it is a symbolic link: the job moves only what it wrote."""
    if storage.is_link(temp):
        raise PublishError(f"{temp}: a symbolic link, not the folder this job made; "
                           "nothing is moved out of it")
    for name in sorted(staged):
        if storage.is_link(contract.join_path(temp, name)):
            raise PublishError(f"{contract.join_path(temp, name)}: a symbolic link, not a "
                               "file this job wrote; not moved into the output")


def apply(output: str, plan: Plan) -> None:
    """Runs (or re-runs) every step of ``plan``; see the module docstring."""
    temp = contract.join_path(output, plan.temp_name)
    present, staged = storage.top_level(output), storage.top_level(temp)
    _refuse_links(temp, staged)
    for name in METADATA:
        if name in present and (name in staged or name in plan.deletes):
            storage.delete([contract.join_path(output, name)])
            faults.point(f"hidden:{name}")
    present = storage.top_level(output)

    def size_is(expected):
        def check(path):
            size = storage.size_of(path)
            if size != expected:
                raise PublishError(f"{path}: {size} bytes, the journal says {expected}")
        return check

    for name, num_bytes in plan.shards:
        _move(output, temp, name, present, staged, size_is(num_bytes))
    obsolete = [contract.join_path(output, n) for n in plan.deletes
                if n in present and n not in METADATA]
    storage.delete(obsolete)
    faults.point("deleted-old")
    for name in plan.metadata:
        _move(output, temp, name, present, staged)

    def manifest_matches(path):
        if hashlib.sha256(storage.read_bytes(path)).hexdigest() != plan.manifest_sha256:
            raise PublishError(f"{path}: does not match the journal's sha256")
    _move(output, temp, contract.MANIFEST_FILE, present, staged, manifest_matches)
    storage.delete([journal_path(output)])
    faults.point("journal-deleted")
    try:
        faults.point("removing-temp")
        storage.delete_tree(temp)
    except Exception as e:  # published; a leftover temp folder is removed by the next run
        logging.warning("Published, but could not remove %s (%s); the next run removes it",
                        temp, failure_summary(e) or _first_line(e))


def _first_line(error: BaseException) -> str:
    """``Type: first line of the message``: a warning stays one line."""
    text = str(error).strip()
    return f"{type(error).__name__}: {text.splitlines()[0]}" if text else type(error).__name__
