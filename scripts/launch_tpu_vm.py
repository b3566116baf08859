#!/usr/bin/env python3
"""``python scripts/launch_tpu_vm.py``: the TPU VM launcher, `launch.tpu.cli`."""
import sys
from pathlib import Path

# This checkout's packages, not a copy installed in the interpreter's environment.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from launch.tpu.cli import main  # noqa: E402

sys.exit(main())
