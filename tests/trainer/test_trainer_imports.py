"""What importing the trainer brings in, and what it must not."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

from tests.helpers import REPO


def test_importing_the_trainer_never_imports_beam_or_the_pipeline():
    code = textwrap.dedent("""
        import importlib, pkgutil, sys
        import trainer
        for module in pkgutil.walk_packages(trainer.__path__, "trainer."):
            importlib.import_module(module.name)
        import tensorflow as tf, tf_keras
        assert "apache_beam" not in sys.modules, "apache_beam imported"
        leaked = sorted(m for m in sys.modules if m.split(".")[0] == "pipeline")
        assert not leaked, f"the trainer imported {leaked}"
        assert "mnist_contract" in sys.modules
        assert tf.keras.Model is tf_keras.Model, "tf.keras is not tf-keras"
        print("ok")
    """)
    # Without TF_USE_LEGACY_KERAS: the trainer sets it itself. The rest of the
    # environment stays (a TPU VM's TensorFlow is in the user site, under HOME).
    env = {k: v for k, v in os.environ.items() if k != "TF_USE_LEGACY_KERAS"}
    env["TF_CPP_MIN_LOG_LEVEL"] = "2"
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr[-3000:]


def test_flags_and_help_never_import_tensorflow():
    """`trainer.config` answers ``--help`` and bad flags at once, without TensorFlow."""
    code = textwrap.dedent("""
        import contextlib, io, sys
        from trainer import config
        config.parse_flags(["--data=d", "--model_dir=m", "--preset=cpu", "--model=convnet",
                            "--lr_schedule=cosine", "--mixed_precision=bfloat16"])
        with contextlib.redirect_stdout(io.StringIO()) as out:
            try:
                config.parse_flags(["--help"])
            except SystemExit:
                pass
        assert "--lr_schedule" in out.getvalue()
        loaded = sorted(m for m in sys.modules
                        if m.split(".")[0] in ("tensorflow", "tf_keras", "keras"))
        assert not loaded, loaded
        print("ok")
    """)
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr[-3000:]
