"""The baseline for pipeline_benchmark.py: MNIST IDX -> TFRecords in one process.

Same decoding and Example encoding (`mnist_contract.wire`, a batch at a
time) as the Beam job, written with
``tf.io.TFRecordWriter`` into one file per split, in source order. No
shuffle, no sharding, no metadata: the least work that produces the records.
"""

import argparse
import os
import sys

import numpy as np
import tensorflow as tf

from mnist_contract import wire
from pipeline.source import idx

BATCH = 10_000


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--source", required=True)
    parser.add_argument("--output", required=True)
    args = parser.parse_args()
    os.makedirs(args.output, exist_ok=True)
    for split, (images_name, labels_name) in idx.MNIST_FILES.items():
        images_path = os.path.join(args.source, images_name)
        labels_path = os.path.join(args.source, labels_name)
        with open(images_path, "rb") as f_images, open(labels_path, "rb") as f_labels:
            images, labels = idx.decode_split(f_images.read(), f_labels.read(),
                                              images_path, labels_path)
        out = os.path.join(args.output, f"mnist-{split}.tfrecord")
        with tf.io.TFRecordWriter(out) as writer:
            for start in range(0, len(labels), BATCH):
                stop = min(start + BATCH, len(labels))
                for example in wire.encode_examples(
                        {"image": images[start:stop], "label": labels[start:stop],
                         "index": np.arange(start, stop)}, "raw"):
                    writer.write(example)


if __name__ == "__main__":
    main()
