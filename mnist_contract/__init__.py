"""The data contract between the conversion job (`pipeline`) and the trainer.

A neutral package: both sides import it, neither imports the other. This
module re-exports the standard-library-only parts (the feature spec, file
naming, the manifest); `mnist_contract.examples` (Example codec, needs
TensorFlow) and `mnist_contract.framing` (TFRecord framing, needs
google-crc32c) are imported by name where they are needed.

Layout of an output directory (local path or ``gs://bucket/prefix``)::

    mnist-train.tfrecord-00000-of-00002      TFRecord files, records in a
    mnist-train.tfrecord-00001-of-00002      deterministic shuffled order
    mnist-test.tfrecord-00000-of-00001
    manifest.json                            `Manifest` (written last)
    dataset_info.json, features.json         TFDS metadata (uncompressed output)

Each record is a serialized ``tf.train.Example`` with the features of
`mnist_contract.spec.FEATURES`:

    image  bytes   raw: 784 bytes, uint8, row-major 28x28 (shape 28x28x1)
                   png: a grayscale PNG of 28x28
    label  int64   the digit, 0..9
    index  int64   the example's position in its source split (stable key)
"""

from mnist_contract.manifest import Manifest, ShardInfo, SplitInfo  # noqa: F401
from mnist_contract.sizes import RECORD_SIZES, max_plausible_examples  # noqa: F401
from mnist_contract.spec import *  # noqa: F401,F403
from mnist_contract.spec import ContractError  # noqa: F401
