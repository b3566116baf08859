"""The Keras ``mnist_convnet`` example as its users write it, on a given split.

    python -m benchmarks.keras_mnist_convnet --npz=mnist.npz [--epochs=15] [--batch_size=128]

The model, preprocessing and fit are keras.io's "Simple MNIST convnet"
(https://keras.io/examples/vision/mnist_convnet/), Keras 3, in-memory
arrays. Two changes, both so that `time_to_accuracy.py` can compare it with
the trainer on the same digits: the arrays come from ``--npz`` (the layout
``keras.datasets.mnist.load_data`` reads: ``x_train``, ``y_train``,
``x_test``, ``y_test``) instead of the download, and the model validates
on ``x_test``/``y_test`` after each epoch (``validation_data``) instead of
on a ``validation_split`` carved from the training digits.

It prints one ``data ...`` line with the counts and digests of the arrays it
loaded (the benchmark checks them against what it wrote) and, after each
epoch's validation, ``epoch K/N val_accuracy A``, flushed, so the benchmark
can timestamp the moment each accuracy is known.
"""

from __future__ import annotations

import argparse
import hashlib
import sys

import numpy as np


def digest(images: np.ndarray, labels: np.ndarray) -> str:
    """sha256 over the labels (int64) then the images (uint8), in order: equal
    digests mean the same digits in the same order."""
    h = hashlib.sha256()
    h.update(np.ascontiguousarray(labels, dtype=np.int64).tobytes())
    h.update(np.ascontiguousarray(images, dtype=np.uint8).tobytes())
    return h.hexdigest()


def data_line(x_train, y_train, x_test, y_test) -> str:
    """What the benchmark compares against the arrays it wrote."""
    return (f"data train={len(y_train)} val={len(y_test)} "
            f"train_sha256={digest(x_train, y_train)} val_sha256={digest(x_test, y_test)}")


def epoch_line(epoch: int, epochs: int, val_accuracy: float) -> str:
    """One epoch's validation accuracy, with the trainer's 4 decimals."""
    return f"epoch {epoch}/{epochs} val_accuracy {val_accuracy:.4f}"


def run(npz: str, epochs: int, batch_size: int) -> None:
    """keras.io's example; Keras is imported here so that the benchmark can
    import `digest` and `epoch_line` without starting TensorFlow."""
    import keras
    from keras import layers

    class PrintValAccuracy(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            print(epoch_line(epoch + 1, epochs, float(logs["val_accuracy"])), flush=True)

    num_classes = 10
    input_shape = (28, 28, 1)
    with np.load(npz, allow_pickle=False) as f:
        x_train, y_train = f["x_train"], f["y_train"]
        x_test, y_test = f["x_test"], f["y_test"]
    print(data_line(x_train, y_train, x_test, y_test), flush=True)

    x_train = x_train.astype("float32") / 255
    x_test = x_test.astype("float32") / 255
    x_train = np.expand_dims(x_train, -1)
    x_test = np.expand_dims(x_test, -1)
    y_train = keras.utils.to_categorical(y_train, num_classes)
    y_test = keras.utils.to_categorical(y_test, num_classes)

    model = keras.Sequential(
        [
            keras.Input(shape=input_shape),
            layers.Conv2D(32, kernel_size=(3, 3), activation="relu"),
            layers.MaxPooling2D(pool_size=(2, 2)),
            layers.Conv2D(64, kernel_size=(3, 3), activation="relu"),
            layers.MaxPooling2D(pool_size=(2, 2)),
            layers.Flatten(),
            layers.Dropout(0.5),
            layers.Dense(num_classes, activation="softmax"),
        ]
    )
    model.compile(loss="categorical_crossentropy", optimizer="adam", metrics=["accuracy"])
    model.fit(x_train, y_train, batch_size=batch_size, epochs=epochs,
              validation_data=(x_test, y_test), callbacks=[PrintValAccuracy()])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--npz", required=True, help="x_train, y_train, x_test, y_test")
    parser.add_argument("--epochs", type=int, default=15)
    parser.add_argument("--batch_size", type=int, default=128)
    args = parser.parse_args(argv)
    run(args.npz, args.epochs, args.batch_size)
    return 0


if __name__ == "__main__":
    sys.exit(main())
