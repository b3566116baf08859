"""``python -m launch.tpu STEP ...``, installed also ``mnist-launch-tpu``: the TPU VM
launcher (`launch.tpu.cli`)."""

import sys

from launch.tpu.cli import main

sys.argv[0] = "python -m launch.tpu"  # argparse's usage line names the command typed
sys.exit(main())
