"""The notebook's install cell (notebooks/use_tpus.ipynb, ``install = True``)
keeps an editable install of the checkout it sits in editable: a plain
``pip install`` would replace a checkout's .venv project with a copy.

The cell runs here with ``subprocess.run`` recording the pip commands
instead of running them, and with the installed project's metadata (its
``direct_url.json``) one this test writes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import REPO

NOTEBOOK = REPO / "notebooks" / "use_tpus.ipynb"


def install_cell() -> str:
    cells = json.loads(NOTEBOOK.read_text())["cells"]
    [cell] = [c for c in cells if c["cell_type"] == "code" and "def pip_install" in
              "".join(c["source"])]
    return "".join(cell["source"])


def fake_distribution(folder: Path, name: str, version: str, direct_url: dict | None):
    info = folder / f"{name.replace('-', '_')}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    if direct_url is not None:
        (info / "direct_url.json").write_text(json.dumps(direct_url))


def run_install_cell(monkeypatch, tmp_path, direct_url, tpu):
    """The pip commands the cell runs, ``install = True``, in the checkout."""
    site = tmp_path / "site"
    fake_distribution(site, "mnist-tpu", "0.1.0", direct_url)
    fake_distribution(site, "tensorflow-tpu", "2.20.0", None)
    monkeypatch.syspath_prepend(str(site))
    calls = []
    monkeypatch.setattr(subprocess, "run", lambda cmd, **kw: calls.append(list(cmd)))
    monkeypatch.delenv("TPU_NAME", raising=False)
    monkeypatch.chdir(REPO / "notebooks")
    exec(install_cell(), {"install": True, "repository": "", "tpu": tpu})
    pips = [c[3:] for c in calls if c[:3] == [sys.executable, "-m", "pip"]]
    assert len(pips) == len(calls)  # nothing else ran
    return pips


@pytest.mark.parametrize("tpu", [None, "local"])
@pytest.mark.parametrize("direct_url, editable", [
    ({"url": REPO.as_uri(), "dir_info": {"editable": True}}, True),
    ({"url": REPO.as_uri(), "dir_info": {}}, False),
    ({"url": (REPO.parent / "other").as_uri(), "dir_info": {"editable": True}}, False),
    (None, False)])
def test_the_install_cell_keeps_an_editable_install_of_its_checkout(
        monkeypatch, tmp_path, direct_url, editable, tpu):
    pips = run_install_cell(monkeypatch, tmp_path, direct_url, tpu)
    extras = "tpu" if tpu else "pipeline,trainer"
    project = [c for c in pips if c[-1] == f"{REPO}[{extras}]"]
    assert project == [["install", "-q", *(["-e"] if editable else []), f"{REPO}[{extras}]"]]
