"""``python -m trainer.predict --model_dir=DIR (IMAGE ... [--raw] | --data=DIR --split=test)``,
installed also ``mnist-predict``.

Runs the trainer's export (``MODEL_DIR/export``, see `trainer.model.export`)
through its ``serving_default`` signature, the way a server would
(`trainer.serving`): raw uint8 pixels in, ``probabilities`` and ``class`` out.

* Image files, PNG or JPEG, of one digit each, of any size and drawn either
  way round: each is made MNIST's form (`trainer.digit_image`: grayscale,
  white digit on black, fitted in 20x20 and centred by mass in 28x28), with
  a line on stderr saying what was done (``note: FILE: 480x640 JPEG:
  grayscale, inverted ...``); a 28x28 grayscale picture on a dark
  background is MNIST's form already and is taken as it is. ``--raw`` takes
  MNIST's exact pixels only: 28x28 grayscale PNGs of at most 8 bits per
  pixel (colour, alpha and 16-bit PNGs are refused, naming their mode). The
  size is read from the file's header before decoding. One line per file:
  ``FILE class=7 probability=0.9991``.
* ``--data=DIR --split=test [--limit=N]``: the conversion job's output,
  read by the trainer's own input code (`trainer.data.input_pipeline`: manifest, file
  checks, decoding) and ``tf.data``, so a ``gs://`` prefix works too. One
  line per example in the order of the split's files (the job shuffles the
  examples, so the indexes come in no order): ``index=589 label=5 class=5
  probability=0.9991``, then ``accuracy=0.9870 (987/1000) on split test``.

As the trainer's, the command prints only its own lines: TensorFlow's C++
start-up lines are dropped (`mnist_common.console`). Every path goes through
``tf.io.gfile``; local paths are checked first, before TensorFlow is
imported (`trainer.path_checks`), so a mistyped one answers at once. A
problem (no export, an image file that cannot be read or holds no digit, a
FIFO given as an image, no manifest, an unknown split) ends with one line
``error: FILE: problem`` and the exit status of the table in docs/README.md,
"Exit status" (`TrainerError.exit_status`); lines already printed stay; a
Python without TensorFlow gets one line naming it, exit 1. Ctrl-C, SIGTERM
and SIGHUP end it with one line ``error: predict: stopped by SIGTERM``
and 128+N (`mnist_common.console.exit_on_signals`).
"""

from __future__ import annotations

import argparse
import sys
from typing import Optional, Sequence

from mnist_common import console
from mnist_common.flags import OneLineParser, number
from trainer import path_checks
from trainer.errors import TrainerError


def build_parser() -> OneLineParser:
    """The command's flags; a number out of range is a usage error (exit 2)."""
    p = OneLineParser(
        prog="python -m trainer.predict", allow_abbrev=False,
        description="Predict digits with a trained model's export: image files, or a "
                    "split of the conversion job's output (then also the accuracy).")
    p.add_argument("--model_dir", required=True, help="the trainer's --model_dir")
    p.add_argument("images", nargs="*",
                   help="PNG or JPEG files of one digit each (local or gs://), of any size, "
                        "drawn either way round: each is made MNIST's form (grayscale, "
                        "white digit on black, fitted in 20x20 and centred by mass in "
                        "28x28) and a line on stderr says how; a 28x28 grayscale picture "
                        "on a dark background is taken as it is")
    p.add_argument("--raw", action="store_true",
                   help="take the files as MNIST's exact pixels: 28x28 grayscale PNGs "
                        "(at most 8 bits), white on black, refusing anything else")
    p.add_argument("--data", help="the conversion job's output directory")
    p.add_argument("--split", default="test", help="with --data (default: test)")
    p.add_argument("--limit", type=number(int, min=1, max=2**31 - 1), default=None,
                   help="with --data: only the first N examples")
    p.number_style = "{flag} must be {requirement}, not {value}"
    return p


def parse_args(argv: Optional[Sequence[str]]) -> argparse.Namespace:
    p = build_parser()
    args = p.parse_args(argv)
    if bool(args.images) == bool(args.data):
        p.error("give image files or --data, not both / neither")
    if args.raw and args.data:
        p.error("--raw is for image files, not --data")
    return args


def check_paths(args: argparse.Namespace) -> None:
    """The local paths, before TensorFlow loads (`trainer.path_checks`)."""
    path_checks.check_model_dir(args.model_dir)
    if args.data:
        path_checks.check_data(args.data)
    for path in args.images:
        path_checks.check_image(path)


def _start() -> None:
    """The command's start: flags and local paths checked, then TensorFlow
    imported quietly; a problem ends the process with its one line."""
    try:
        check_paths(parse_args(None))
    except TrainerError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(e.exit_status)
    console.use_tf_keras()
    try:
        console.import_tensorflow_quietly()
    except ModuleNotFoundError as e:
        print(console.missing_package(e, "trainer"), file=sys.stderr)
        sys.exit(console.FAILURE)


# The stop signals' block `command` enters and never leaves: the process ends
# inside it, and this global keeps the generator, whose collection would leave it.
_STOP_ON_SIGNALS = None


def command() -> int:
    """``mnist-predict`` and ``python -m trainer.predict``: `main`, with
    Ctrl-C, SIGTERM and SIGHUP ending the command with one line and 128+N
    from here to its exit, TensorFlow's import of several seconds included,
    and the flags and local paths checked before that import (`_start`).
    `main` alone is the run, in-process."""
    global _STOP_ON_SIGNALS  # pylint: disable=global-statement
    _STOP_ON_SIGNALS = console.exit_on_signals("predict")
    _STOP_ON_SIGNALS.__enter__()  # pylint: disable=unnecessary-dunder-call
    _start()
    return main()


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    try:
        check_paths(args)
        from trainer import serving  # TensorFlow: after the checks above
        signature = serving.load_signature(args.model_dir)
        if args.images:
            serving.predict_images(signature, args.images, args.raw)
            return console.OK
        correct, total = serving.evaluate_split(signature, args.data, args.split, args.limit)
    except TrainerError as e:
        sys.stdout.flush()
        print(f"error: {e}", file=sys.stderr)
        return e.exit_status
    print(f"accuracy={correct / total:.4f} ({correct}/{total}) on split {args.split}")
    return console.OK


if __name__ == "__main__":
    sys.exit(command())
