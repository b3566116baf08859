"""``scripts/run_local.sh --help`` explains the demo and touches nothing."""

import os
import shutil
import subprocess

from tests.helpers import REPO

SETTINGS = ("PYTHON", "DATA", "LOOP", "MODEL_DIR", "EPOCHS", "RESUME")


def test_help_prints_settings_and_runs_nothing(tmp_path):
    # A copy of the scripts: --help must not create .venv even with PYTHON unset.
    repo = tmp_path / "repo"
    (repo / "scripts").mkdir(parents=True)
    for name in ("run_local.sh", "bootstrap.sh"):
        shutil.copy(REPO / "scripts" / name, repo / "scripts" / name)
    shutil.copy(REPO / "pyproject.toml", repo / "pyproject.toml")
    data, model = tmp_path / "data", tmp_path / "model"
    for folder in (data, model):
        folder.mkdir()
        (folder / "keep").write_text("previous run")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHON", "EXTRAS")}
    env.update(DATA=str(data), MODEL_DIR=str(model), EPOCHS="3",
               BOOTSTRAP_PYTHON=str(tmp_path / "no-such-python"))
    for flag in ("--help", "-h"):
        result = subprocess.run(["bash", str(repo / "scripts" / "run_local.sh"), flag],
                                env=env, capture_output=True, text=True, timeout=60)
        assert result.returncode == 0, result.stderr
        lines = result.stdout.splitlines()
        for name in SETTINGS:
            assert any(line.split()[:1] == [name] and "default:" in line
                       for line in lines), name
        assert f"(now: {data})" in result.stdout and "(now: 3)" in result.stdout
        assert "default: out/mnist" in result.stdout and "default: 20" in result.stdout
        assert "python -m trainer --help" in result.stdout
        assert result.stderr == ""
    assert sorted(p.name for p in repo.iterdir()) == ["pyproject.toml", "scripts"]
    for folder in (data, model):
        assert [p.name for p in folder.iterdir()] == ["keep"]
