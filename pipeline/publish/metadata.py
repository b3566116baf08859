"""Metadata written beside the shards: the manifest and TFDS's JSON files.

TFDS's files (``dataset_info.json``, ``features.json``) make the output
readable with ``tfds.builder_from_directory(output)``. They are produced by
TFDS itself into a local scratch folder and then copied, so they always match
what the installed TFDS expects, wherever the output lives.
"""

from __future__ import annotations

import os
import tempfile

import numpy as np

import mnist_contract as contract


def tfds_features(image_format: str):
    """TFDS's FeaturesDict for `mnist_contract.spec.FEATURES`, feature by feature."""
    import tensorflow_datasets as tfds
    features = {}
    for f in contract.FEATURES:
        if f.image and image_format == "png":
            features[f.name] = tfds.features.Image(shape=f.shape, encoding_format="png")
        elif f.image:
            features[f.name] = tfds.features.Tensor(
                shape=f.shape, dtype=np.dtype(f.dtype), encoding=tfds.features.Encoding.BYTES)
        elif f.num_classes is not None:
            features[f.name] = tfds.features.ClassLabel(num_classes=f.num_classes)
        else:
            features[f.name] = tfds.features.Scalar(dtype=np.dtype(f.dtype))
    return tfds.features.FeaturesDict(features)


def tfds_metadata_files(manifest: contract.Manifest, output: str,
                        description: str) -> dict[str, bytes]:
    """File name -> contents of TFDS's metadata for this manifest."""
    import tensorflow_datasets as tfds
    from tensorflow_datasets.core import dataset_info, naming, splits
    from tensorflow_datasets.core import file_adapters

    identity = dataset_info.DatasetIdentity(
        name=manifest.dataset, version=tfds.core.Version(contract.TFDS_VERSION),
        data_dir=output, module_name="")
    info = dataset_info.DatasetInfo(
        builder=identity, features=tfds_features(manifest.image_format),
        description=description, supervised_keys=(contract.IMAGE_KEY,
                                                  contract.LABEL_KEY))
    info.set_file_format(file_adapters.FileFormat.TFRECORD)
    template = naming.ShardedFileTemplate(
        data_dir=output, dataset_name=manifest.dataset,
        filetype_suffix="tfrecord")
    info.set_splits(splits.SplitDict([
        splits.SplitInfo(name=name,
                         shard_lengths=[s.num_examples for s in split.shards],
                         num_bytes=split.num_bytes,
                         filename_template=template.replace(split=name))
        for name, split in sorted(manifest.splits.items())]))
    with tempfile.TemporaryDirectory() as scratch:
        info.write_to_directory(scratch)
        files = {}
        for name in contract.TFDS_METADATA_FILES:
            with open(os.path.join(scratch, name), "rb") as f:
                files[name] = f.read()
    return files
