"""`python -m pipeline.verify` on local output loads neither TensorFlow nor Beam."""

import json
import os
import subprocess
import sys

import pytest

from tests.helpers import REPO, run_job

SCRIPT = """
import json, sys
from pipeline.verify import main
rc = main([sys.argv[1], "--preview=" + sys.argv[2]])
print("RESULTS " + json.dumps({"rc": rc, "loaded": sorted(
    m for m in ("tensorflow", "apache_beam") if m in sys.modules)}))
"""


@pytest.mark.parametrize("flags", [[], ["--image_format=png", "--compression=gzip"]])
def test_verify_imports_neither_tensorflow_nor_beam(tmp_path, idx_dir, flags):
    out = tmp_path / "out"
    run_job([f"--source={idx_dir}", f"--output={out}", "--runner=DirectRunner", *flags])
    env = {k: v for k, v in os.environ.items() if k != "STORAGE_EMULATOR_HOST"}
    proc = subprocess.run([sys.executable, "-c", SCRIPT, str(out), str(tmp_path / "p.png")],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    lines = [l for l in proc.stdout.splitlines() if l.startswith("RESULTS ")]
    assert proc.returncode == 0 and lines, proc.stderr[-3000:]
    assert json.loads(lines[0][len("RESULTS "):]) == {"rc": 0, "loaded": []}
