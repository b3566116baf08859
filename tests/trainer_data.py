"""Writes small contract-conformant datasets for the trainer tests, without Beam.

The images are learnable: each class has a fixed random 28x28 prototype and
an example is its class prototype plus noise, so a small CNN reaches high
accuracy within a few dozen steps, while an untrained one sits near 10%.
Files go through tf.io.gfile, so ``out_dir`` may be ``ram://...``. Also
reads back the ``metrics.json`` a run leaves in its model_dir.
"""

from __future__ import annotations

import hashlib
import json
from typing import Optional

import numpy as np
import tensorflow as tf

import mnist_contract as contract
from mnist_contract import examples


def make_arrays(num_examples: int, seed: int, noise: float = 0.35):
    """``(images uint8 [N,28,28,1], labels int64 [N])`` from class prototypes."""
    prototypes = np.random.default_rng(1234).random((contract.NUM_CLASSES,) + contract.IMAGE_SHAPE)
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, contract.NUM_CLASSES, num_examples)
    images = (prototypes[labels]
              + noise * rng.standard_normal((num_examples,) + contract.IMAGE_SHAPE))
    images = np.clip(images * 255.0, 0, 255).astype(np.uint8)
    return images, labels.astype(np.int64)


def serialize(image: np.ndarray, label: int, index: int, image_format: str) -> bytes:
    """One record, encoded by the contract's own encoder."""
    return examples.encode_example({contract.IMAGE_KEY: image, contract.LABEL_KEY: label,
                                    contract.INDEX_KEY: index}, image_format)


def write_dataset(out_dir: str, *, num_train: int = 256, num_test: int = 37,
                  train_shards: int = 4, test_shards: int = 2, image_format: str = "raw",
                  compression: str = "none", seed: int = 0,
                  write_manifest: bool = True,
                  arrays: Optional[dict] = None) -> contract.Manifest:
    """Writes both splits (examples dealt round-robin over shards) + manifest.json.

    ``arrays``: ``{split: (images uint8 [N,28,28(,1)], labels)}`` to write
    instead of the synthetic examples (e.g. real digits); sets the counts.
    """
    tf.io.gfile.makedirs(out_dir)
    options = tf.io.TFRecordOptions(compression_type="GZIP" if compression == "gzip" else "")
    splits = {}
    for split, n, num_shards, split_seed in (("train", num_train, train_shards, seed),
                                             ("test", num_test, test_shards, seed + 1)):
        if arrays is not None:
            images, labels = arrays[split]
            images, n = images.reshape((-1,) + contract.IMAGE_SHAPE), len(labels)
        else:
            images, labels = make_arrays(n, split_seed)
        shards = []
        for s in range(num_shards):
            name = contract.shard_filename(split, s, num_shards)
            path = contract.join_path(out_dir, name)
            rows = range(s, n, num_shards)
            with tf.io.TFRecordWriter(path, options) as w:
                for i in rows:
                    w.write(serialize(images[i], labels[i], i, image_format))
            with tf.io.gfile.GFile(path, "rb") as f:
                blob = f.read()
            shards.append(contract.ShardInfo(file=name, num_examples=len(rows),
                                             num_bytes=len(blob),
                                             sha256=hashlib.sha256(blob).hexdigest()))
        splits[split] = contract.SplitInfo(name=split, shards=tuple(shards))
    manifest = contract.Manifest(dataset=contract.DATASET_NAME, image_format=image_format,
                                 compression=compression, splits=splits,
                                 source=f"synthetic-test:{seed}")
    if write_manifest:
        with tf.io.gfile.GFile(contract.join_path(out_dir, contract.MANIFEST_FILE), "w") as f:
            f.write(manifest.to_json())
    return manifest


def corrupt(path: str, offset: Optional[int] = None) -> None:
    """Flips one byte inside a record's payload so its CRC check fails."""
    with tf.io.gfile.GFile(path, "rb") as f:
        blob = bytearray(f.read())
    pos = offset if offset is not None else len(blob) // 2
    blob[pos] ^= 0xFF
    with tf.io.gfile.GFile(path, "wb") as f:
        f.write(bytes(blob))


def eval_arrays(num_test: int = 37, seed: int = 0):
    """The test split `write_dataset` writes for ``seed`` (for exact checks of
    evaluation and prediction)."""
    return make_arrays(num_test, seed + 1)


def read_metrics(model_dir: str) -> dict:
    """The ``model_dir/metrics.json`` a finished run wrote (see trainer/run/outputs.py)."""
    with tf.io.gfile.GFile(contract.join_path(model_dir, "metrics.json"), "r") as f:
        return json.loads(f.read())


def replace_record(out_dir: str, split: str, shard: int, of: int, position: int,
                   serialized: bytes) -> str:
    """Puts ``serialized`` in place of the record at ``position`` of one shard
    and rewrites manifest.json with the shard's new size and sha256, so the
    manifest agrees with the damage; returns the shard's path."""
    path = contract.join_path(out_dir, contract.shard_filename(split, shard, of))
    records = [r.numpy() for r in tf.data.TFRecordDataset(path)]
    records[position] = serialized
    with tf.io.TFRecordWriter(path) as w:
        for record in records:
            w.write(record)
    with tf.io.gfile.GFile(path, "rb") as f:
        blob = f.read()
    manifest_path = contract.join_path(out_dir, contract.MANIFEST_FILE)
    with tf.io.gfile.GFile(manifest_path, "r") as f:
        raw = json.loads(f.read())
    listed = raw["splits"][split]
    for entry in listed["shards"]:
        if entry["file"] == contract.shard_filename(split, shard, of):
            entry.update(num_bytes=len(blob), sha256=hashlib.sha256(blob).hexdigest())
    listed["num_bytes"] = sum(entry["num_bytes"] for entry in listed["shards"])
    with tf.io.gfile.GFile(manifest_path, "w") as f:
        f.write(json.dumps(raw, indent=2))
    return path


def example_bytes(image: bytes, label: int, index: int = 0) -> bytes:
    """A serialized Example with the contract's keys holding any raw image bytes
    and any label (what a broken writer could produce)."""
    return tf.train.Example(features=tf.train.Features(feature={
        contract.IMAGE_KEY: tf.train.Feature(bytes_list=tf.train.BytesList(value=[image])),
        contract.LABEL_KEY: tf.train.Feature(int64_list=tf.train.Int64List(value=[label])),
        contract.INDEX_KEY: tf.train.Feature(int64_list=tf.train.Int64List(value=[index])),
    })).SerializeToString()
