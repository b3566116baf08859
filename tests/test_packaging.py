"""Install roles: the trainer extra must not pull Beam, even transitively."""

import re
import tomllib
from importlib import metadata

from packaging.requirements import Requirement

from tests.helpers import REPO


def _extras():
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    return project["dependencies"], project["optional-dependencies"]


def _closure(requirements: list[str]) -> set[str]:
    """Names of everything these requirements install, read from installed metadata."""
    seen, todo = set(), [Requirement(r) for r in requirements]
    while todo:
        req = todo.pop()
        name = re.sub(r"[-_.]+", "-", req.name).lower()
        if name in seen or (req.marker and not req.marker.evaluate({"extra": ""})):
            continue
        seen.add(name)
        try:
            dist = metadata.distribution(req.name)
        except metadata.PackageNotFoundError:
            continue
        for text in dist.requires or []:
            sub = Requirement(text)
            wanted = not sub.marker or any(sub.marker.evaluate({"extra": e})
                                           for e in ("", *req.extras))
            if wanted:
                todo.append(sub)
    return seen


def test_trainer_extra_does_not_install_beam():
    base, extras = _extras()
    installed = _closure(base + extras["trainer"])
    assert {"tensorflow", "tf-keras", "tensorboard"} <= installed
    assert "apache-beam" not in installed


def test_pipeline_extra_does_install_beam():
    base, extras = _extras()
    assert "apache-beam" in _closure(base + extras["pipeline"])


def test_versions_are_pinned():
    _, extras = _extras()
    pins = {Requirement(r).name: str(Requirement(r).specifier)
            for role in ("pipeline", "trainer") for r in extras[role]}
    assert pins["tensorflow"] == "==2.21.0"
    assert pins["apache-beam"] == "==2.77.0"
    assert pins["tensorflow-datasets"] == "==4.9.10"
    assert pins["tf-keras"] == "==2.21.0"


def test_both_roles_pin_the_same_gcs_client():
    """The job's and the trainer's GCS lock is one backend (mnist_common.storage_lock)
    on one google-cloud-storage range."""
    _, extras = _extras()
    ranges = {role: [str(Requirement(r).specifier) for r in extras[role]
                     if Requirement(r).name == "google-cloud-storage"]
              for role in ("pipeline", "trainer")}
    assert ranges["pipeline"] == ranges["trainer"] == ["<4,>=3"]


def test_the_wheel_ships_every_source_package_and_no_benchmark_or_test():
    """The declared packages are the checkout's packages (folders with an
    __init__.py) except `benchmarks` and `tests`, which run from a checkout only."""
    declared = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    found = {init.parent.relative_to(REPO).as_posix().replace("/", ".")
             for init in REPO.glob("*/**/__init__.py")
             if not {".venv", "build", "__pycache__"} & set(init.relative_to(REPO).parts)}
    assert {"benchmarks", "tests"} <= {name.split(".")[0] for name in found}
    shipped = {name for name in found if name.split(".")[0] not in ("benchmarks", "tests")}
    assert sorted(declared["packages"]) == sorted(shipped)
