"""``python -m launch dataflow|tpu ARGS`` (installed: ``mnist-launch``): both
launchers under one command. ``mnist-launch dataflow`` is
``mnist-launch-dataflow`` (`launch.dataflow`), ``mnist-launch tpu`` is
``mnist-launch-tpu`` (`launch.tpu.cli`)."""

from __future__ import annotations

import os
import sys
from typing import Optional, Sequence

from mnist_common import console

LAUNCHERS = {"dataflow": "the conversion job on Dataflow",
             "tpu": "the trainer on a Cloud TPU VM, spot runs included"}


def _usage(prog: str) -> str:
    lines = [f"usage: {prog} {{{','.join(LAUNCHERS)}}} [ARGS]", "",
             "Runs a launcher; `" + prog + " NAME --help` lists its arguments.", ""]
    return "\n".join(lines + [f"  {name:9} {what}" for name, what in LAUNCHERS.items()])


def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    base = os.path.basename(sys.argv[0])
    prog = "python -m launch" if base in ("__main__.py", "-m") else base
    if not argv or argv[0] in ("-h", "--help"):
        print(_usage(prog), file=sys.stdout if argv else sys.stderr)
        return console.OK if argv else console.BAD_INPUT
    name, rest = argv[0], argv[1:]
    if name not in LAUNCHERS:
        print(f"error: {prog}: no launcher {name!r} (one of: {', '.join(LAUNCHERS)})",
              file=sys.stderr)
        return console.BAD_INPUT
    sys.argv[0] = f"{prog} {name}"  # argparse's usage line names the command typed
    if name == "dataflow":
        from launch.dataflow import main as launcher
    else:
        from launch.tpu.cli import main as launcher
    return launcher(rest)


if __name__ == "__main__":
    sys.exit(main())
