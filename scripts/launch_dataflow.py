#!/usr/bin/env python3
"""``python scripts/launch_dataflow.py``: the Dataflow launcher, `launch.dataflow`."""
import sys
from pathlib import Path

# This checkout's packages, not a copy installed in the interpreter's environment.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from launch.dataflow import main  # noqa: E402

sys.exit(main())
