"""The dataset a run trains on, pinned: recorded at start, checked until the export.

A dataset folder can be republished while a run reads it (the conversion
job's ``--overwrite``); TensorFlow would then read the new shards without a
word, or fail deep in a step. So at start the run records the manifest's
identity in ``MODEL_DIR/dataset.json`` (`PIN_FILE`): the data path, the
sha256 of ``manifest.json``'s bytes and each shard's size and sha256 as the
manifest lists them. Before every evaluation, every checkpoint and the export
it checks (`DatasetPin.check`) that the folder still holds that dataset: the
manifest's bytes hash the same (the manifest lists every shard's sha256, so
a republish changes it), no publish is in progress, and every shard has its
size. A change ends the run with one line; nothing is exported from mixed
data. A resumed run on another dataset, or on checkpoints that no readable
pin describes, is refused unless ``--allow_new_dataset`` says to continue
(`check_resume`); the pin is recorded (`record`) only once every check of
the run has passed, so a refused run leaves the old one in place.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
from typing import Optional

import tensorflow as tf

import mnist_contract as contract
from mnist_common import local_paths
from trainer.errors import TrainerError, TrainerInputError, os_reason, summarize_error
from trainer.run import outputs

log = logging.getLogger(__name__)

PIN_FILE = "dataset.json"


@dataclasses.dataclass(frozen=True)
class DatasetPin:
    data: str
    manifest_sha256: str
    shards: tuple[tuple[str, int, str], ...]  # (file, num_bytes, sha256) per shard

    @classmethod
    def of(cls, data: str, manifest: contract.Manifest, raw: bytes) -> "DatasetPin":
        shards = tuple((s.file, s.num_bytes, s.sha256) for name in sorted(manifest.splits)
                       for s in manifest.splits[name].shards)
        return cls(data, hashlib.sha256(raw).hexdigest(), shards)

    def summary(self) -> dict:
        """What ``metrics.json`` says of the dataset (``dataset``)."""
        return {"data": self.data, "manifest_sha256": self.manifest_sha256}

    def to_json(self) -> str:
        return json.dumps({**self.summary(), "shards": [
            {"file": f, "num_bytes": n, "sha256": h} for f, n, h in self.shards]},
            indent=2, sort_keys=True) + "\n"

    def changed(self) -> str:
        """"" while ``data`` holds the pinned dataset, else what differs."""
        manifest = contract.join_path(self.data, contract.MANIFEST_FILE)
        try:
            if tf.io.gfile.exists(contract.join_path(self.data,
                                                     contract.PUBLISH_JOURNAL_FILE)):
                return "a publish is in progress there"
            local_paths.check_is_file(manifest)  # a FIFO would block the read forever
            with tf.io.gfile.GFile(manifest, "rb") as f:
                sha = hashlib.sha256(f.read()).hexdigest()
            if sha != self.manifest_sha256:
                return (f"{contract.MANIFEST_FILE} has sha256 {sha[:12]}..., not the "
                        f"{self.manifest_sha256[:12]}... this run started with")
            for name, size, _ in self.shards:
                path = contract.join_path(self.data, name)
                actual = tf.io.gfile.stat(path).length
                if actual != size:
                    return f"{name} has {actual} bytes, not {size}"
        except tf.errors.NotFoundError as e:
            return f"{summarize_error(e)}"
        except OSError as e:  # not a regular file, or gone (`local_paths.check_is_file`)
            return f"{manifest}: {e.strerror}"
        except tf.errors.OpError as e:
            return f"cannot read it ({summarize_error(e)})"
        return ""

    def check(self) -> None:
        """Raises the run's one-line end if the dataset is no longer this one."""
        what = self.changed()
        if what:
            raise changed_error(self.data, what)


def changed_error(data: str, what: str) -> TrainerError:
    return TrainerError(
        f"{data} changed during training: {what}; stopped without exporting "
        "(checkpoints from before the change are kept; to continue on the new "
        "data pass --allow_new_dataset)")


def _read_pin(model_dir: str) -> tuple[Optional[dict], str]:
    """The recorded pin, or None and why there is none (missing, unreadable)."""
    path = contract.join_path(model_dir, PIN_FILE)
    try:
        local_paths.check_is_file(path)  # a FIFO would block the read forever
        with tf.io.gfile.GFile(path, "r") as f:
            pinned = json.loads(f.read())
    except (tf.errors.NotFoundError, FileNotFoundError):
        return None, "missing"
    except local_paths.NotAFile as e:
        return None, f"unreadable ({e.strerror})"
    except (ValueError, tf.errors.OpError) as e:
        return None, f"unreadable ({summarize_error(e)})"
    if not isinstance(pinned, dict) or not isinstance(pinned.get("manifest_sha256"), str):
        return None, "unreadable (no manifest_sha256)"
    return pinned, ""


def check_resume(model_dir: str, pin: DatasetPin, *, resuming: bool, allow_new: bool) -> None:
    """Refuses to resume ``model_dir``'s checkpoints on data other than its pin's,
    or when no readable pin says which data they were trained on, unless
    ``allow_new`` (``--allow_new_dataset``). Writes nothing (`record` does,
    once every check of the run has passed)."""
    if not resuming:
        return
    old, problem = _read_pin(model_dir)
    if old is None:
        path = contract.join_path(model_dir, PIN_FILE)
        if not allow_new:
            raise TrainerInputError(
                f"{path}: {problem}, and {model_dir} holds checkpoints: nothing says which "
                f"data they were trained on; pass --allow_new_dataset to continue on "
                f"--data={pin.data}, or use another --model_dir")
        log.warning("%s: %s; continuing on %s (--allow_new_dataset)", path, problem, pin.data)
        return
    if old["manifest_sha256"] == pin.manifest_sha256:
        return
    was = f"{old.get('data')} (manifest sha256 {old['manifest_sha256'][:12]}...)"
    if not allow_new:
        raise TrainerInputError(
            f"--data={pin.data}: {model_dir} was trained on {was}, and this is "
            f"another dataset (manifest sha256 {pin.manifest_sha256[:12]}...); "
            "resume with that data, pass --allow_new_dataset to continue on "
            "this one, or use another --model_dir")
    log.warning("%s: continuing on a new dataset (--allow_new_dataset); it was "
                "trained on %s", model_dir, was)


def record(model_dir: str, pin: DatasetPin) -> None:
    """Writes ``pin`` to ``model_dir/dataset.json`` (after `check_resume`)."""
    path = contract.join_path(model_dir, PIN_FILE)
    try:
        outputs.write_text(path, pin.to_json())
    except (tf.errors.OpError, OSError) as e:
        raise TrainerError(f"{path}: cannot record the dataset ({os_reason(e)})") from None
