"""The trainer benchmark's dataset: learnable synthetic digits as contract shards.

Each class has a fixed random 28x28 prototype and an example is its class
prototype plus noise, so the records carry digit-like, varied images
without a download. The files are what the conversion job writes: Examples
encoded by `mnist_contract.wire`, in TFRecord framing (`mnist_contract.framing`),
raw images, uncompressed, examples dealt round-robin over the shards, and a
manifest. The benchmark times the trainer reading these files against the
same train arrays held in memory, so `write_dataset` returns those arrays.
"""

from __future__ import annotations

import hashlib
import os

import numpy as np

import mnist_contract as contract
from mnist_contract import framing, wire

PROTOTYPE_SEED = 1234
IMAGE_FORMAT = "raw"


def prototype_digits(count: int, seed: int, noise: float = 0.35
                     ) -> tuple[np.ndarray, np.ndarray]:
    """``(images uint8 [N,28,28,1], labels int64 [N])``: each a class prototype plus noise."""
    shape = contract.IMAGE_SHAPE
    prototypes = np.random.default_rng(PROTOTYPE_SEED).random((contract.NUM_CLASSES,) + shape)
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, contract.NUM_CLASSES, count)
    images = prototypes[labels] + noise * rng.standard_normal((count,) + shape)
    return np.clip(images * 255.0, 0, 255).astype(np.uint8), labels.astype(np.int64)


def write_split(out_dir: str, split: str, images: np.ndarray, labels: np.ndarray,
                num_shards: int) -> contract.SplitInfo:
    """The split's shards in ``out_dir``; example i goes to shard i mod ``num_shards``."""
    records = wire.encode_examples({contract.IMAGE_KEY: images, contract.LABEL_KEY: labels,
                                    contract.INDEX_KEY: np.arange(len(labels))}, IMAGE_FORMAT)
    shards = []
    for index in range(num_shards):
        name = contract.shard_filename(split, index, num_shards)
        rows = records[index::num_shards]
        blob = b"".join(framing.frame_records(rows))
        with open(os.path.join(out_dir, name), "wb") as f:
            f.write(blob)
        shards.append(contract.ShardInfo(file=name, num_examples=len(rows),
                                         num_bytes=len(blob),
                                         sha256=hashlib.sha256(blob).hexdigest()))
    return contract.SplitInfo(name=split, shards=tuple(shards))


def write_dataset(out_dir: str, *, num_train: int, num_test: int, train_shards: int,
                  test_shards: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Both splits and manifest.json in ``out_dir`` (a local folder); returns the
    train split's ``(images, labels)``."""
    os.makedirs(out_dir, exist_ok=True)
    train = prototype_digits(num_train, seed)
    splits = {"train": write_split(out_dir, "train", *train, train_shards),
              "test": write_split(out_dir, "test", *prototype_digits(num_test, seed + 1),
                                  test_shards)}
    manifest = contract.Manifest(dataset=contract.DATASET_NAME, image_format=IMAGE_FORMAT,
                                 compression="none", splits=splits,
                                 source=f"synthetic-benchmark:{seed}")
    with open(os.path.join(out_dir, contract.MANIFEST_FILE), "w") as f:
        f.write(manifest.to_json())
    return train
