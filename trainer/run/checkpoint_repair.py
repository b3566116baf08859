"""Finding the checkpoint to resume from, when some are damaged.

``tf.train.CheckpointManager`` trusts its ``checkpoint`` state file: garbage
or a missing file there makes it start from step 0 and save over the intact
checkpoints, and a damaged newest checkpoint fails the restore. So the
trainer lists the ``ckpt-<step>.index`` files itself (`list_checkpoints`),
restores the newest one that restores (`restore_newest`), skipping damaged
ones with a warning naming them, and rewrites the state file to list the
intact ones (`repair_state`) before the manager reads it. When checkpoints
exist but none restores, the run stops rather than start over at step 0
(``--restart`` asks for that). The temporary folders of a save that was cut
short (``ckpt-<step>_temp``) are removed with a warning (`clean_temp`).
"""

from __future__ import annotations

import logging
import re
import time
from typing import Callable

import tensorflow as tf

from mnist_common import local_paths
from mnist_contract import join_path
from trainer.errors import TrainerError, summarize_error
from trainer.run import outputs

log = logging.getLogger(__name__)

PREFIX = "ckpt"
STATE_FILE = "checkpoint"  # tf.train.CheckpointManager's state file
_INDEX = re.compile(rf"{PREFIX}-(\d+)\.index")


def list_checkpoints(directory: str) -> list[str]:
    """The checkpoint prefixes with an index file in ``directory``, newest first."""
    if not tf.io.gfile.isdir(directory):
        return []
    steps = [int(m.group(1)) for name in tf.io.gfile.listdir(directory)
             if (m := _INDEX.fullmatch(name.rstrip("/")))]
    return [join_path(directory, f"{PREFIX}-{step}") for step in sorted(steps, reverse=True)]


def clean_temp(directory: str) -> None:
    """Removes the temporary folders of saves that did not finish, naming them
    (a symbolic link of such a name is removed as a link, never followed)."""
    if not tf.io.gfile.isdir(directory):
        return
    for name in tf.io.gfile.listdir(directory):
        name = name.rstrip("/")
        if re.fullmatch(rf"{PREFIX}-\d+_temp", name):
            path = join_path(directory, name)
            log.warning("%s: removing the leftovers of a checkpoint save that did "
                        "not finish", path)
            local_paths.remove_tree(path)


def restore_newest(directory: str, restore: Callable[[str], None]) -> tuple[str, list[str]]:
    """Restores (``restore(prefix)``) the newest checkpoint that restores.

    Returns its prefix ("" when there is none) and the damaged ones skipped.
    A `TrainerError` from ``restore`` (a refusal, e.g. other settings) stops
    the search; any other failure marks the checkpoint damaged.
    """
    found = list_checkpoints(directory)
    damaged: list[str] = []
    first_error = ""
    for prefix in found:
        try:
            restore(prefix)
        except TrainerError:
            raise
        except Exception as e:  # noqa: BLE001  (a damaged file fails in many ways)
            first_error = first_error or summarize_error(e)
            log.warning("%s: damaged, skipped (%s); resuming from an earlier checkpoint "
                        "if one restores", prefix, summarize_error(e))
            damaged.append(prefix)
            continue
        return prefix, damaged
    if found:
        raise TrainerError(
            f"{found[0]}: cannot resume from this checkpoint ({first_error}); no "
            f"checkpoint in {directory} restores; pass --restart to train from step 0 "
            "(deleting them) or use another --model_dir")
    return "", damaged


def repair_state(directory: str, restored: str, damaged: list[str]) -> None:
    """Writes the ``checkpoint`` state file: ``restored`` latest, the intact
    older ones kept (so the manager keeps and deletes the right files).

    The file is read and written here as the text it is (`_state_text`):
    TensorFlow's reader logs a parse error for a garbage file, and its writer
    (``update_checkpoint_state``) is deprecated and says so on every call.
    """
    path = join_path(directory, STATE_FILE)
    try:
        with tf.io.gfile.GFile(path, "r") as f:
            current = f.read()
    except tf.errors.NotFoundError:
        current = ""
    named = re.search(r'^model_checkpoint_path: "([^"]*)"$', current, re.MULTILINE)
    if named and not damaged and named.group(1).rsplit("/", 1)[-1] == _name(restored):
        return
    if not named:
        log.warning("%s: %s; rewriting it to name %s", path,
                    "unreadable" if current else "missing", _name(restored))
    intact = [p for p in reversed(list_checkpoints(directory))
              if p not in damaged and _step(p) <= _step(restored)]
    outputs.write_text(path, _state_text(restored, intact, time.time() - 1.0))


def _state_text(restored: str, intact: list[str], now: float) -> str:
    """The state file as TensorFlow writes it (a text ``CheckpointState``, paths
    relative to its folder). Timestamps after the preserved one: the manager
    may delete those checkpoints in turn."""
    lines = [f'model_checkpoint_path: "{_name(restored)}"']
    lines += [f'all_model_checkpoint_paths: "{_name(p)}"' for p in intact]
    lines += [f"all_model_checkpoint_timestamps: {now!r}" for _ in intact]
    lines.append(f"last_preserved_timestamp: {now - 1.0!r}")
    return "\n".join(lines) + "\n"


def _name(prefix: str) -> str:
    return prefix.rsplit("/", 1)[-1]


def discard(directory: str) -> None:
    """``--restart``: deletes ``directory`` (the run's checkpoints), with a
    warning; a symbolic link there is removed as a link, never followed."""
    if local_paths.is_link(directory):
        local_paths.remove_tree(directory)  # warns: the link goes, its target stays
    elif tf.io.gfile.exists(directory):
        log.warning("%s: --restart: deleting %d checkpoint(s), training from step 0",
                    directory, len(list_checkpoints(directory)))
        local_paths.remove_tree(directory)


def _step(prefix: str) -> int:
    return int(prefix.rsplit("-", 1)[1])
