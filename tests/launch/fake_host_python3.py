"""``python3`` on a fake TPU VM (`tests.launch.fake_cloud`).

The installs are answered from the environment prepared once, the test
interpreter's (``FAKE_HOST_PYTHON``): ``pip install --user`` of a
requirement is not downloaded, but the project wheel that ``scp`` copied is
installed for real into the VM's home, the probe of TensorFlow's version
is answered from that environment's metadata, and every other command
(the install check's full import among them) runs on the
test interpreter with that install first on the path (the trainer the VM
runs is the wheel's, not the checkout's). There is no TPU: a trainer asked
for ``--strategy=tpu --tpu=...`` runs with ``--strategy=default``.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def pip_install(args: list[str], site: Path, python: str) -> int:
    wheels = [a for a in args if a.endswith(".whl")]
    for requirement in args:
        if not requirement.startswith("-") and requirement not in wheels:
            print(f"Requirement answered from the prepared environment: {requirement}")
    if not wheels:
        return 0
    return subprocess.run([python, "-m", "pip", "install", "--quiet", "--no-deps",
                           "--no-index", "--upgrade", "--target", str(site), *wheels],
                          check=False).returncode


# The install script's probe of the installed TensorFlow's version (to pin
# tf-keras), answered from the prepared environment's metadata.
VERSION_PROBE = ["-c", "import tensorflow as tf; print(tf.__version__)"]


def on_cpu(args: list[str]) -> list[str]:
    if args[:2] != ["-m", "trainer"]:
        return args
    kept = [a for a in args if not a.startswith("--tpu=")]
    return ["--strategy=default" if a == "--strategy=tpu" else a for a in kept]


def main(argv: list[str]) -> int:
    python = os.environ["FAKE_HOST_PYTHON"]
    site = Path(os.environ["HOME"]) / ".local" / "fake-site"
    with open(Path(os.environ["HOME"]) / "host.log", "a") as log:  # what the VM ran
        log.write(" ".join(argv) + "\n")
    if argv[:4] == ["-m", "pip", "install", "--user"]:
        return pip_install(argv[4:], site, python)
    if argv == VERSION_PROBE:
        from importlib.metadata import version
        print(version("tensorflow"))
        return 0
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(HERE / "fake_host_site"),
                                                       str(site)]))
    os.execve(python, [python, *on_cpu(argv)], env)
    return 127


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
