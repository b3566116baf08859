"""``python -m trainer.predict --model_dir=DIR (IMAGE ... [--raw] | --data=DIR --split=test)``,
installed also ``mnist-predict``.

Runs the trainer's export (``MODEL_DIR/export``, see `trainer.model.export`)
through its ``serving_default`` signature, the way a server would
(`trainer.serving`): raw uint8 pixels in, ``probabilities`` and ``class``
out. What it takes and
prints, and how it fails: docs/trainer.md, "Predict".
"""

from __future__ import annotations

import argparse
import sys
from typing import Optional, Sequence

from mnist_common import console
from mnist_common.flags import OneLineParser, number
from mnist_common.stop import exit_on_signals
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


def _failed(error: TrainerError) -> int:
    """Prints ``error``'s one line after what was printed; its exit status."""
    sys.stdout.flush()
    print(f"error: {error}", file=sys.stderr)
    return error.exit_status


def _start() -> argparse.Namespace:
    """The command's start: flags and local paths checked, then TensorFlow
    imported quietly; the flags. A problem ends the process with its one line."""
    args = parse_args(None)
    try:
        check_paths(args)
    except TrainerError as e:
        sys.exit(_failed(e))
    console.use_tf_keras()
    try:
        console.import_tensorflow_quietly()
    except ModuleNotFoundError as e:
        print(console.missing_package(e, "trainer"), file=sys.stderr)
        sys.exit(console.FAILURE)
    return args


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
    _STOP_ON_SIGNALS = exit_on_signals("predict")
    _STOP_ON_SIGNALS.__enter__()  # pylint: disable=unnecessary-dunder-call
    return _predict(_start())


def main(argv: Optional[Sequence[str]] = None) -> int:
    """The command in this process: flags and local paths checked, then the
    predictions."""
    args = parse_args(argv)
    try:
        check_paths(args)
    except TrainerError as e:
        return _failed(e)
    return _predict(args)


def _predict(args: argparse.Namespace) -> int:
    """Runs the checked ``args``: each image's line, or the split's accuracy."""
    try:
        from trainer import serving  # TensorFlow: after the checks
        signature = serving.load_signature(args.model_dir)
        if args.images:
            serving.predict_images(signature, args.images, args.raw)
            return console.OK
        correct, total = serving.evaluate_split(signature, args.data, args.split, args.limit)
    except TrainerError as e:
        return _failed(e)
    print(f"accuracy={correct / total:.4f} ({correct}/{total}) on split {args.split}")
    return console.OK


if __name__ == "__main__":
    sys.exit(command())
