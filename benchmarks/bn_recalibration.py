"""Batch-norm recalibration measured on trained runs' exports.

    python -m benchmarks.bn_recalibration DATA MODEL_DIR [MODEL_DIR ...]
        [--examples=6400,25600] [--batch=128]

DATA is a folder the pipeline wrote; each MODEL_DIR a finished trainer run
(its ``export``). For each export it prints the test split's accuracy as
exported, then after `trainer.loop.batch_norm.Recalibrator` recomputed the
export's batch-norm statistics over the first N train examples of DATA
(file order, unaugmented), for each N of ``--examples``: the pass the
trainer makes after its last step (``--bn_recalibration_examples``), applied
to runs trained without it. Training is unchanged by the pass (it only sets
the moving statistics that inference uses), so this measures its whole
effect on a run.
"""

from __future__ import annotations

import argparse
import os
import sys

from mnist_common import console

console.use_tf_keras()  # before TensorFlow loads
import tensorflow as tf  # noqa: E402
import tf_keras as keras  # noqa: E402

import mnist_contract as contract  # noqa: E402
from trainer.config import TrainConfig  # noqa: E402
from trainer.data import input_pipeline, splits  # noqa: E402
from trainer.loop import batch_norm  # noqa: E402
from trainer.loop.evaluator import Evaluator  # noqa: E402
from trainer.run import outputs  # noqa: E402


def _raw_pixels(batch):
    """The export takes raw pixels (it scales them itself); the stream gives [0, 1]."""
    return {**batch, contract.IMAGE_KEY: batch[contract.IMAGE_KEY] * 255.0}


def measure(data: str, model_dir: str, examples: list[int], batch: int) -> list[float]:
    """Test accuracy of the export as is, then recalibrated over each N examples."""
    strategy = tf.distribute.get_strategy()
    config = TrainConfig(data=data, model_dir=model_dir, global_batch_size=batch)
    manifest = splits.load_manifest(data)
    train, test = (splits.split_files(data, manifest, s) for s in ("train", "test"))
    accuracies = []
    for n in [0, *examples]:
        model = keras.models.load_model(os.path.join(model_dir, outputs.EXPORT),
                                        compile=False)
        if n:
            ds, per_pass = input_pipeline.eval_input(strategy, train, config,
                                                     postprocess=_raw_pixels)
            steps = batch_norm.recalibration_steps(n, batch, per_pass)
            batch_norm.Recalibrator(strategy, model, ds, steps)()
        test_ds, steps = input_pipeline.eval_input(strategy, test, config,
                                                   postprocess=_raw_pixels)
        evaluate = Evaluator(strategy, model, test_ds, steps,
                             expected_examples=test.num_examples, origin=data)
        accuracies.append(evaluate()["test_accuracy"])
    return accuracies


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("data")
    parser.add_argument("model_dirs", nargs="+")
    parser.add_argument("--examples", default="6400,25600")
    parser.add_argument("--batch", type=int, default=128)
    args = parser.parse_args(argv)
    examples = [int(x) for x in args.examples.split(",")]
    print("model_dir  as exported  " + "  ".join(f"recalibrated over {n}" for n in examples))
    for model_dir in args.model_dirs:
        accuracies = measure(args.data, model_dir, examples, args.batch)
        print(f"{model_dir}  " + "  ".join(f"{a:.4f}" for a in accuracies), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
