"""Trains on the pipeline's TFRecords under any tf.distribute strategy (TPU included).

The flow, one folder or module per step:

    __main__, config         the command line, parsed once into `config.TrainConfig`
    train                    `train_and_evaluate`: data → model → loop → export → commit
    data/                    the manifest, the splits' files and their checks, tf.data
    model/                   models, optimizer and schedule, augmentation, export
    loop/                    the controller (outer loop), the Keras and custom inner
                             loops, the evaluator, TensorBoard summaries
    run/                     every check before anything is written (`preflight`),
                             then the model_dir's safety: layout and commit, lock,
                             dataset pin, checkpoint repair, resume checks, preemption
    predict                  ``python -m trainer.predict``: the export on PNGs or a split

Beside them: `strategy` (TPU, Mirrored, MultiWorker, default), `cluster`
(a ``TF_CONFIG`` cluster's start with a deadline), `errors`
(`TrainerError`: one line, no traceback), `check_flags` (the trainer's
flags checked without TensorFlow, for ``scripts/check_trainer_flags.py``),
`_compat` (every private TensorFlow internal the trainer relies on) and
`malloc` (glibc's thresholds, which TensorFlow fixes, set back).

Keras flavour: this package uses tf-keras (Keras 2), imported explicitly as
``import tf_keras as keras``, and sets ``TF_USE_LEGACY_KERAS=1`` before
TensorFlow is imported so that ``tf.keras`` resolves to the same library.
Why not Keras 3: Keras 3.15 fails under ``MirroredStrategy`` with two or more
replicas once ``steps_per_execution > 1`` (keras-team/keras#19246), and on CPU
gave no speed-up from ``steps_per_execution`` at all; tf-keras 2.21 runs that
combination and gets the expected gain from folding many steps into one
``tf.function`` call. Multi-step execution is what keeps a TPU fed, so the
Keras flavour is chosen for it.

The environment variable must be set before the first ``import tensorflow``
in the process (`mnist_common.console.use_tf_keras`). Each program calls it
where it starts (``python -m trainer``, ``python -m trainer.predict``, the
benchmarks, the notebook, the tests' conftest.py), and this file calls it
too: Python runs it before any ``trainer.x`` module, so every module of the
package that imports TensorFlow gets tf-keras, whoever imports it.

Importing the package never imports Apache Beam, nor the `pipeline` package:
what it shares with the conversion job is in the two neutral packages,
`mnist_contract` (the data contract) and `mnist_common` (the storage lock,
the console: start-up, log format and exit statuses, one-line usage errors).
"""

from mnist_common import console

console.use_tf_keras()
