"""Where things are written in ``model_dir``, and who writes them.

Under multi-worker training every worker runs the same program and every
worker must take part in saving (saving runs collective ops), but only the
chief's files should land in ``model_dir``. As in the TF multi-worker guide,
the other workers write to a private temporary directory under
``model_dir`` and delete it afterwards.

What each file and folder holds: docs/trainer.md, "What lands in
``model_dir``".

The export and ``metrics.json`` are committed together (`commit_export`):
the new export is saved under ``.export.new-<run id>/`` with its id in
``trainer_export.json``; then ``metrics.json`` is deleted,
``export/`` is moved aside and the new one moved into place, and
``metrics.json``, which names the export's id, is written last: it is the
commit point. A reader that finds ``metrics.json`` naming the id in
``export/`` has the pair one run wrote; without it, an export was cut
short and the next run redoes it (leftover ``.export.new-*`` and
``.export.old-*`` folders are removed at start, `discard_stale_exports`).
"""

from __future__ import annotations

import dataclasses
import json
import logging

import tensorflow as tf

from mnist_common import local_paths
from mnist_contract import join_path
from trainer.errors import TrainerError, TrainerInputError, summarize_error
from trainer.strategy import Distribution

log = logging.getLogger(__name__)

CHECKPOINTS = "checkpoints"
LOGS = "logs"
EXPORT = "export"
METRICS = "metrics.json"
EXPORT_ID_FILE = "trainer_export.json"  # inside an export: its id (loaders ignore it)


@dataclasses.dataclass(frozen=True)
class Role:
    """This process's part in the run: the chief writes ``model_dir``, any other
    worker a scratch folder of its own (settled once, by `Role.of`)."""

    chief: bool = True
    scratch: str = ""  # a non-chief's folder under model_dir: workertemp_<type>_<id>

    @classmethod
    def of(cls, distribution: Distribution) -> "Role":
        if distribution.chief:
            return cls()
        resolver = distribution.strategy.cluster_resolver
        return cls(chief=False, scratch=f"workertemp_{resolver.task_type}_{resolver.task_id}")

    def write_dir(self, model_dir: str, sub: str) -> str:
        """``model_dir/sub`` on the chief, in the scratch folder elsewhere."""
        return join_path(model_dir, sub if self.chief else f"{self.scratch}/{sub}")

    def log_write_dirs(self, model_dir: str) -> None:
        """One INFO line saying where this worker's checkpoints and summaries go."""
        log.info("%s: checkpoints to %s, summaries to %s",
                 "chief" if self.chief else "non-chief worker",
                 self.write_dir(model_dir, CHECKPOINTS), self.write_dir(model_dir, LOGS))

    def discard_scratch(self, model_dir: str) -> None:
        """Deletes a non-chief worker's scratch folder (nothing on the chief)."""
        if self.chief:
            return
        path = join_path(model_dir, self.scratch)
        if local_paths.is_link(path) or tf.io.gfile.exists(path):
            local_paths.remove_tree(path)


def write_text(path: str, text: str) -> None:
    """Writes ``path`` through a temporary file renamed over it, so a reader sees
    the old text or the new, never a part (a rename is one object copy on gs://)."""
    temp = f"{path}.tmp"
    with tf.io.gfile.GFile(temp, "w") as f:
        f.write(text)
    local_paths.move(temp, path, overwrite=True)


def move_tree(source: str, target: str) -> None:
    """Moves a folder: one rename on a local disk (a symbolic link as
    ``source`` is refused); file by file elsewhere (gs:// and ram:// have no
    folder rename)."""
    if local_paths.is_local(source):
        local_paths.move(source, target, overwrite=False)
        return
    for folder, _, files in tf.io.gfile.walk(source):
        relative = folder[len(source):].lstrip("/")
        destination = join_path(target, relative) if relative else target
        tf.io.gfile.makedirs(destination)
        for name in files:
            local_paths.move(join_path(folder, name), join_path(destination, name),
                             overwrite=False)
    local_paths.remove_tree(source)


def staging_dir(model_dir: str, run_id: str) -> str:
    """Where a run saves its export before `commit_export` (hidden, and not
    named ``export...``: ram:// takes a path that prefixes another as existing)."""
    return join_path(model_dir, f".{EXPORT}.new-{run_id}")


def export_id(export_dir: str) -> str:
    """The id a committed export carries ("" for none)."""
    try:
        with tf.io.gfile.GFile(join_path(export_dir, EXPORT_ID_FILE), "r") as f:
            return str(json.loads(f.read()).get("export_id", ""))
    except (tf.errors.NotFoundError, ValueError, AttributeError):
        return ""


def uncommitted(model_dir: str) -> str:
    """"" when ``model_dir/export`` is the export ``metrics.json`` describes,
    else what is wrong (an export without `EXPORT_ID_FILE` was not committed
    by `commit_export`: nothing says which run's it is, or that it is whole)."""
    carried = export_id(join_path(model_dir, EXPORT))
    if not carried:
        return f"no readable {EXPORT_ID_FILE} in it: not an export the trainer committed"
    try:
        with tf.io.gfile.GFile(join_path(model_dir, METRICS), "r") as f:
            named = str(json.loads(f.read()).get("export_id", ""))
    except tf.errors.NotFoundError:
        return f"no {METRICS} beside it: its export did not finish"
    except (ValueError, AttributeError):
        return f"{METRICS} is unreadable"
    if named != carried:
        return f"{METRICS} describes export {named}, not this one ({carried})"
    return ""


def commit_export(model_dir: str, staged: str, metrics: dict) -> None:
    """Publishes ``staged`` as ``model_dir/export`` with ``metrics`` (which
    names the export's id), ``metrics.json`` written last (the commit point).
    A symbolic link at ``export`` or ``metrics.json`` is removed as a link
    (`mnist_common.local_paths`): what it points to is left as it is."""
    write_text(join_path(staged, EXPORT_ID_FILE),
               json.dumps({"export_id": metrics["export_id"]}) + "\n")
    metrics_path, final = join_path(model_dir, METRICS), join_path(model_dir, EXPORT)
    old = join_path(model_dir, f".{EXPORT}.old-{metrics['export_id']}")
    if local_paths.is_link(metrics_path) or tf.io.gfile.exists(metrics_path):
        local_paths.remove_file(metrics_path)  # until the last write: nothing committed
    if local_paths.is_link(final):
        local_paths.remove_tree(final)
    elif tf.io.gfile.exists(final):
        move_tree(final, old)
    move_tree(staged, final)
    write_text(metrics_path, json.dumps(metrics, indent=2, sort_keys=True) + "\n")
    if tf.io.gfile.exists(old):
        local_paths.remove_tree(old)


def discard_stale_exports(model_dir: str) -> None:
    """Removes the ``.export.new-*`` / ``.export.old-*`` folders of runs that
    stopped while exporting (the lock is held: no run is writing them); a
    symbolic link of that name is removed as a link, never followed."""
    for path in tf.io.gfile.glob(join_path(model_dir, f".{EXPORT}.*-*")):
        path = path.rstrip("/")
        log.warning("%s: removing the leftovers of an export that did not finish", path)
        local_paths.remove_tree(path)


def discard_partial(path: str) -> str:
    """Removes what a failed save left at ``path``; "" when gone, else the
    clause that names it (``; remove the partial PATH``) for the error line."""
    try:
        if local_paths.is_link(path) or tf.io.gfile.exists(path):
            local_paths.remove_tree(path)
        return ""
    except (tf.errors.OpError, OSError):
        return f"; remove the partial {path}"


def make_model_dir(model_dir: str) -> None:
    """Creates ``model_dir`` unless it exists (after
    `trainer.run.preflight.check_model_dir`)."""
    try:
        if not tf.io.gfile.exists(model_dir):
            _check_bucket(model_dir)
            tf.io.gfile.makedirs(model_dir)
    except tf.errors.OpError as e:
        raise TrainerError(f"{model_dir}: cannot create --model_dir "
                           f"({summarize_error(e)})") from None


def _check_bucket(model_dir: str) -> None:
    """A ``gs://`` folder's bucket exists: under a bucket that does not,
    TensorFlow's ``makedirs`` asks for the bucket again and again and never
    returns. Asking needs ``storage.buckets.get``, which object-only roles
    (``roles/storage.objectAdmin``) lack; a refusal says nothing of the
    bucket, so ``makedirs`` goes ahead as without the check."""
    if not model_dir.startswith("gs://"):
        return
    bucket = "gs://" + model_dir[len("gs://"):].split("/", 1)[0]
    try:
        found = tf.io.gfile.exists(bucket)
    except tf.errors.PermissionDeniedError:
        return
    if not found:
        raise TrainerInputError(f"{model_dir}: cannot create --model_dir (bucket {bucket} "
                           "does not exist)")
