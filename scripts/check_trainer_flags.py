#!/usr/bin/env python3
"""``python scripts/check_trainer_flags.py``: the trainer's flag check, `trainer.check_flags`."""
import sys

from trainer.check_flags import main

sys.exit(main())
