#!/usr/bin/env python3
"""``python scripts/launch_dataflow.py``: the Dataflow launcher, `launch.dataflow`."""
import sys

from launch.dataflow import main

sys.exit(main())
