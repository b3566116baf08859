"""The input pipeline tests' pieces: a fresh ``ram://`` folder, an
``InputContext`` built by hand (one of several hosts), a written split, and
the batches and example indices a stream yields."""

from __future__ import annotations

import uuid

import tensorflow as tf

import mnist_contract as contract
from tests import trainer_data
from trainer.data import input_pipeline, splits


def ram_dir() -> str:
    return f"ram://trainer-input-{uuid.uuid4().hex}"


def context(pipelines: int, pipeline_id: int, replicas: int) -> tf.distribute.InputContext:
    return tf.distribute.InputContext(num_input_pipelines=pipelines,
                                      input_pipeline_id=pipeline_id,
                                      num_replicas_in_sync=replicas)


def batches(ds: tf.data.Dataset, n: int) -> list[dict]:
    return [{k: v.numpy() for k, v in b.items()} for b in ds.take(n)]


def indices(bs: list[dict], weighted: bool = False) -> list[int]:
    out = []
    for b in bs:
        keep = b[input_pipeline.WEIGHT_KEY] > 0 if weighted else slice(None)
        out.extend(b[contract.INDEX_KEY][keep].tolist())
    return out


def split(out_dir: str, name: str = "train", **kwargs) -> splits.SplitFiles:
    trainer_data.write_dataset(out_dir, **kwargs)
    return splits.split_files(out_dir, splits.load_manifest(out_dir), name)
