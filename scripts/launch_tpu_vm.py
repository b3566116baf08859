#!/usr/bin/env python3
"""``python scripts/launch_tpu_vm.py``: the TPU VM launcher, `launch.tpu.cli`."""
import sys

from launch.tpu.cli import main

sys.exit(main())
