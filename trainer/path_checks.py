"""Checks of local paths that answer before TensorFlow is imported.

Importing TensorFlow takes seconds; a mistyped ``--data``, ``--model_dir``
or image path should not wait for it. For a local path (no ``scheme://``)
these checks give the same one-line `TrainerInputError` that the readers
(`trainer.data.splits`, `trainer.predict`) give once TensorFlow is there;
other paths (``gs://``) pass, and the readers check them. Imports neither
TensorFlow nor numpy.
"""

from __future__ import annotations

import glob
import os
import stat

import mnist_contract as contract
from mnist_common.local_paths import is_local
from trainer.errors import TrainerInputError

# File kinds that are not regular files, by `stat` test: reading one may
# block for ever (a FIFO with no writer) or never end (a device).
_NOT_REGULAR = ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
                (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))


def not_converted(data_dir: str) -> str:
    """The line for a folder without ``manifest.json``, with the command that converts."""
    path = contract.join_path(data_dir, contract.MANIFEST_FILE)
    idx_files = is_local(data_dir) and glob.glob(os.path.join(glob.escape(data_dir),
                                                              "*-ubyte*"))
    source = f"--source={data_dir}" if idx_files else "[--source=sample|mnist|IDX_FOLDER]"
    return (f"{path}: no {contract.MANIFEST_FILE} (not a complete pipeline output; the "
            f"pipeline writes it last); convert the digits with `python -m pipeline "
            f"--output=DIR {source}`, then pass --data=DIR")


def check_data(data_dir: str) -> None:
    """A local ``--data``: a folder, not mid-publish, holding ``manifest.json``."""
    if not is_local(data_dir):
        return
    if not os.path.isdir(data_dir):
        if os.path.exists(data_dir):
            raise TrainerInputError(f"{data_dir}: --data is a file, not the pipeline's "
                                    "output folder")
        raise TrainerInputError(f"{data_dir}: data directory not found")
    journal = contract.join_path(data_dir, contract.PUBLISH_JOURNAL_FILE)
    if os.path.exists(journal):
        raise TrainerInputError(contract.interrupted_publish_message(journal, b""))
    if not os.path.exists(contract.join_path(data_dir, contract.MANIFEST_FILE)):
        raise TrainerInputError(not_converted(data_dir))


def check_run_paths(model_dir: str, data: str) -> None:
    """The trainer's local ``--model_dir`` and ``--data``, in the order the run
    checks them (`trainer.run.preflight.check_model_dir`, then the data), with
    the same lines."""
    if is_local(model_dir):
        _check_model_dir_layout(model_dir, data)
    check_data(data)


def _check_model_dir_layout(model_dir: str, data: str) -> None:
    """A local ``--model_dir``: apart from a local ``--data``, not a link to
    nothing, not a file, its checkpoints/ and logs/ not files."""
    if is_local(data):
        a, b = os.path.realpath(model_dir), os.path.realpath(data)
        overlap = ("is" if a == b else "is inside" if a.startswith(b + "/")
                   else "holds" if b.startswith(a + "/") else "")
        if overlap:
            raise TrainerInputError(f"{model_dir}: --model_dir {overlap} --data ({data}); "
                                    "the run's files would mix with the dataset's")
    if os.path.islink(model_dir) and not os.path.exists(model_dir):
        raise TrainerInputError(f"{model_dir}: --model_dir is a symbolic link to "
                                f"{os.readlink(model_dir)}, which does not exist")
    if os.path.exists(model_dir) and not os.path.isdir(model_dir):
        raise TrainerInputError(f"{model_dir}: --model_dir is a file, not a folder")
    for sub in ("checkpoints", "logs"):
        path = contract.join_path(model_dir, sub)
        if os.path.exists(path) and not os.path.isdir(path):
            raise TrainerInputError(f"{path}: a file where the run keeps its {sub} folder")


def check_model_dir(model_dir: str) -> None:
    """A local ``--model_dir`` for predict: it holds ``export/saved_model.pb``."""
    export = contract.join_path(model_dir, "export")
    if is_local(model_dir) and not os.path.exists(
            contract.join_path(export, "saved_model.pb")):
        raise TrainerInputError(f"{export}: no SavedModel (train with "
                                f"--model_dir={model_dir} first)")


def check_image(path: str) -> None:
    """A local image path: a regular file (a FIFO would block the read for ever)."""
    if not is_local(path):
        return
    try:
        mode = os.stat(path).st_mode
    except OSError as e:
        raise TrainerInputError(f"{path}: cannot read ({e.strerror.lower()})") from None
    if stat.S_ISDIR(mode):
        raise TrainerInputError(f"{path}: a directory, not a PNG file")
    for test, kind in _NOT_REGULAR:
        if test(mode):
            raise TrainerInputError(f"{path}: {kind}, not a regular file; give an image file")
