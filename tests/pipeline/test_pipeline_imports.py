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


def run_python_output(code: str) -> tuple[str, str]:
    """(stdout stripped, stderr) of ``code`` run in a fresh interpreter, which must succeed."""
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=REPO,
                          env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"},
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout.strip(), proc.stderr


def run_python(code: str) -> str:
    return run_python_output(code)[0]


def test_the_command_imports_beam_without_its_optional_modules_which_still_import_later():
    code = """
        import importlib.util, sys
        from pipeline import _compat
        _compat.import_beam()
        print(sorted(m for m in ("apache_beam",) + _compat._OPTIONAL_FOR_BEAM
                     if m in sys.modules))
        for name in _compat._OPTIONAL_FOR_BEAM:
            if importlib.util.find_spec(name):  # installed: importable as ever
                assert importlib.import_module(name).__name__ == name
    """
    stdout, stderr = run_python_output(code)
    assert stdout == "['apache_beam']"
    assert stderr == ""  # no word from Beam about the modules it did not find


def test_the_job_runs_with_beam_imported_that_way(tmp_path):
    """The whole command, in one process: Beam imported by `_compat.import_beam`."""
    out = tmp_path / "out"
    assert run_python(f"""
        import sys
        from pipeline.__main__ import main
        status = main(["--source=synthetic:300", "--output={out}", "--runner=DirectRunner"])
        print(status, "pandas" in sys.modules, "pymongo" in sys.modules)
    """).splitlines()[-1] == "0 False False"
    assert (out / "manifest.json").is_file()


def test_an_earlier_import_of_beam_is_left_as_it_is():
    assert run_python("""
        import sys
        import apache_beam
        from pipeline import _compat
        had_pandas = "pandas" in sys.modules
        _compat.import_beam()
        print(had_pandas == ("pandas" in sys.modules))
    """) == "True"
