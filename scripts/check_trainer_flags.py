#!/usr/bin/env python3
"""``python scripts/check_trainer_flags.py``: the trainer's flag check, `launch.trainer_flags`."""
import sys

from launch.trainer_flags import main

sys.exit(main())
