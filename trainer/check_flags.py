"""``python -m trainer.check_flags TRAINER_FLAGS...`` (installed also
``mnist-check-trainer-flags``): exit 0 if the trainer would take these
flags, else one line ``error: trainer flags: ...`` and 2.

`scripts/run_local.sh` asks before it replaces anything, so a typo or a
value the trainer refuses (``--epochs=0``) costs nothing. The answer is the
trainer's own parser's (`trainer.config.flag_problem`: argparse, then every
check of `trainer.config.TrainConfig`), which loads no TensorFlow;
``--preset=auto`` is settled as a machine without a TPU, as the demo is.
`benchmarks.time_to_accuracy` asks it about its ``--trainer_flags``.
"""

from __future__ import annotations

import sys
from typing import Optional, Sequence

from trainer.config import flag_problem


def main(argv: Optional[Sequence[str]] = None) -> int:
    problem = flag_problem(sys.argv[1:] if argv is None else list(argv), on_tpu=False)
    if problem is None:
        return 0
    print(f"error: trainer flags: {problem}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
