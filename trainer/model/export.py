"""The servable export: a SavedModel that takes raw uint8 pixels.

What ``export_model`` writes, and why:

* The saved Keras model is the *inference* model: ``uint8 [N,28,28,1]`` →
  ``/255`` → the trained layers → float32 logits. Normalizing inside means
  a caller passes pixels as they come (a model that expected [0, 1] would
  take raw 0-255 input without complaint and answer wrongly). Augmentation
  and dropout layers are left out (they do nothing at inference), so the
  export holds only Keras' built-in layers.
* It is compiled with Keras' standard loss and accuracy metric, never the
  trainer's own metrics (a custom metric class in the SavedModel makes
  ``tf_keras.models.load_model`` fail without ``custom_objects``), so it
  loads ready to ``evaluate`` or fine-tune.
* The ``serving_default`` signature takes ``images``: uint8 ``[N,28,28]``
  or ``[N,28,28,1]``, and returns ``probabilities`` (float32 ``[N,10]``) and
  ``class`` (int64 ``[N]``), the form TF Serving and ``saved_model_cli``
  expect.

The /255 is a Keras ``Normalization`` layer with mean 0 and variance 255²:
it divides by sqrt(255²) = 255 exactly, the same float32 division the input
pipeline applies (`trainer.data.input_pipeline`), so the export's predictions on raw
pixels are bit-identical to the trained model's on the pipeline's input
(a ``Rescaling(1/255)`` multiplies, which differs in the last bit for
about half of the 256 values).
"""

from __future__ import annotations

import tensorflow as tf
import tf_keras as keras

import mnist_contract as contract
from mnist_contract import join_path
from trainer import _compat
from trainer.errors import TrainerError, os_reason
from trainer.model.layers import RandomAffine, StepDropout
from trainer.run import outputs

SIGNATURE_INPUT = "images"


def _strategy_of(model: keras.Model) -> tf.distribute.Strategy:
    """The strategy the model's variables were created under (for compile)."""
    for variable in model.variables:
        strategy = _compat.variable_strategy(variable)
        if strategy is not None:
            return strategy
    return tf.distribute.get_strategy()


def inference_model(model: keras.Model) -> keras.Model:
    """uint8 images → logits, sharing ``model``'s layers (and so its weights;
    a ghost batch-norm layer's values are copied, `_at_inference`)."""
    images = keras.Input(shape=contract.IMAGE_SHAPE, dtype="uint8", name="image")
    x = keras.layers.Normalization(mean=0.0, variance=255.0 ** 2, dtype="float32",
                                   name="pixels_to_unit")(images)
    if isinstance(model, keras.Sequential):
        for layer in model.layers:  # those that act only in training are left out
            if not isinstance(layer, (RandomAffine, StepDropout)):
                x = _at_inference(layer)(x)
    else:  # a functional or subclassed model runs whole, in inference mode
        x = model(x, training=False)
    return keras.Model(images, x, name=f"{model.name}_serving")


def _at_inference(layer: keras.layers.Layer) -> keras.layers.Layer:
    """``layer``, or for a ghost batch-norm layer (``virtual_batch_size``) a
    plain one holding its current values, which computes the same at inference.

    tf-keras 2.20.1 and 2.21.0 save a built ghost layer's ``axis`` shifted by
    the reshape it does in training (4 for 4-D images), and loading that
    SavedModel fails ("Invalid value for `axis` argument").
    """
    if not (isinstance(layer, keras.layers.BatchNormalization) and layer.virtual_batch_size):
        return layer
    config = {**layer.get_config(), "axis": -1, "virtual_batch_size": None}
    plain = keras.layers.BatchNormalization.from_config(config)
    plain.build(layer.input_shape)
    plain.set_weights([w.reshape(-1) for w in layer.get_weights()])
    return plain


def serving_fn(model: keras.Model) -> tf.types.experimental.GenericFunction:
    """The ``serving_default`` function of an `inference_model`."""

    @tf.function(input_signature=[tf.TensorSpec(None, tf.uint8, name=SIGNATURE_INPUT)])
    def serve(images):
        rank = tf.rank(images)
        # Padded so that indexing a low-rank input fails the check, not the slice.
        shape = tf.concat([tf.shape(images), [1, 1, 1]], axis=0)
        height, width, _ = contract.IMAGE_SHAPE
        tf.debugging.Assert(
            ((rank == 3) | (rank == 4)) & (shape[1] == height) & (shape[2] == width)
            & ((rank == 3) | (tf.gather(shape, tf.maximum(rank - 1, 0)) == 1)),
            ["images must be uint8 [N,28,28] or [N,28,28,1]; got shape",
             tf.shape(images)])
        logits = model(tf.reshape(images, [-1, *contract.IMAGE_SHAPE]), training=False)
        return {"probabilities": tf.nn.softmax(logits),
                "class": tf.argmax(logits, axis=-1)}

    return serve


def export_model(model: keras.Model, export_dir: str) -> None:
    """Saves ``model`` (a trained `trainer.model.models.build_model` model) for serving.

    Every worker calls it (saving runs collectives under multi-worker
    training); non-chief workers pass their scratch directory.
    """
    with _strategy_of(model).scope():
        served = inference_model(model)
        served.compile(
            optimizer=keras.optimizers.Adam(),
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            metrics=[keras.metrics.SparseCategoricalAccuracy(name="accuracy")])
    try:
        served.save(export_dir, save_format="tf",
                    signatures={"serving_default": serving_fn(served)})
    except (tf.errors.OpError, OSError) as e:
        raise _export_error(export_dir, e) from None


def _export_error(export_dir: str, error: Exception) -> TrainerError:
    """Removes what the failed save wrote (the folder, or only the
    half-written variables beside an earlier complete export), or names it
    if that fails too; the checkpoints are complete, so a rerun exports again."""
    earlier = tf.io.gfile.exists(join_path(export_dir, "saved_model.pb"))
    left = outputs.discard_partial(
        join_path(export_dir, "variables/variables_temp") if earlier else export_dir)
    return TrainerError(f"{export_dir}: cannot write the export ({os_reason(error)}); "
                        f"training is complete and checkpointed, a rerun exports again{left}")
