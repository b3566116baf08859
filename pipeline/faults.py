"""Named points where tests inject a crash or a storage failure into the driver.

``PIPELINE_FAULT=ACTION@POINT`` (``POINT`` may hold shell wildcards) makes
`point` act when the driver reaches that point: ``kill`` sends the process
SIGKILL (a crash no ``finally`` survives), ``enospc`` and ``erofs`` raise the
OSError a full or read-only disk would, ``wait`` holds the run there until the
file named by ``PIPELINE_FAULT_GATE`` exists (it creates ``GATE.reached``
first), so a test can act while a run is at a known step. Points are few per run (the steps of
publishing and preparing the output), never per record, so reading one
environment variable there costs nothing.
"""

from __future__ import annotations

import errno
import fnmatch
import os
import signal
import time

ENV = "PIPELINE_FAULT"
_ERRORS = {"enospc": errno.ENOSPC, "erofs": errno.EROFS}


def point(name: str) -> None:
    spec = os.environ.get(ENV)
    if not spec:
        return
    action, _, where = spec.partition("@")
    if not fnmatch.fnmatchcase(name, where):
        return
    if action == "wait":  # hold here (holding the lock) until the test opens the gate
        gate = os.environ[ENV + "_GATE"]
        with open(gate + ".reached", "w"):
            pass
        deadline = time.monotonic() + 600
        while not os.path.exists(gate) and time.monotonic() < deadline:
            time.sleep(0.05)
    elif action == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    elif action in _ERRORS:
        code = _ERRORS[action]
        raise OSError(code, os.strerror(code), name)
    else:
        raise ValueError(f"{ENV}={spec}: unknown action {action!r}")
