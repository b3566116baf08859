"""Trains on the pipeline's TFRecords under any tf.distribute strategy (TPU included).

What it does, its flags and what it guarantees: docs/trainer.md; its modules:
docs/trainer.md, "Code layout".

This file makes tf-keras (Keras 2) the Keras of the whole package
(`mnist_common.console.use_tf_keras`; why not Keras 3: docs/trainer.md,
"Design"). The setting must come before the first ``import tensorflow`` in
the process. Each program makes it where it starts, and this file makes it
too: Python runs it before any ``trainer.x`` module, so every module of the
package that imports TensorFlow gets tf-keras, whoever imports it.
"""

from mnist_common import console

console.use_tf_keras()
