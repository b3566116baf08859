"""What importing the pipeline brings in, and what it must not."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

from tests.helpers import REPO


def test_the_pipeline_never_imports_the_trainer():
    code = textwrap.dedent("""
        import importlib, pkgutil, sys
        import pipeline
        for module in pkgutil.walk_packages(pipeline.__path__, "pipeline."):
            importlib.import_module(module.name)
        leaked = sorted(m for m in sys.modules if m.split(".")[0] == "trainer")
        assert not leaked, f"the pipeline imported {leaked}"
        print("ok")
    """)
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr[-3000:]
