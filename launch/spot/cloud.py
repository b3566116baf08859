"""The gcloud calls of ``launch_tpu_vm.py run`` (launch/spot/runner.py).

Each call says what it saw (a VM state, a trainer state, an exit status and
the output, captured and shown only when it matters); none decides what
to do about it, which is `spot_decide.decide`'s part.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Callable, Mapping, Sequence

from launch import common as lc
from launch.spot import decide as sd
from launch.tpu import commands as tc

Result = tuple[int, str, str]  # exit status, stdout, stderr
Runner = Callable[[lc.Command], Result]
# gcloud's words for a create that failed for want of capacity, and for one
# that will fail the same way however often it is retried.
STOCKOUT_MARKERS = ("no more capacity", "resource_exhausted", "stockout")
PERMANENT_MARKERS = ("invalid_argument", "permission_denied", "unauthenticated",
                     "quota", "invalid value")


def run_captured(cmd: lc.Command) -> Result:
    """Runs ``cmd`` with its output captured (shown only when it fails)."""
    try:
        proc = subprocess.run(list(cmd), capture_output=True, text=True,
                              errors="replace", check=False, cwd=lc.REPO_ROOT)
    except FileNotFoundError:
        return 127, "", f"{cmd[0]}: command not found"
    return proc.returncode, proc.stdout, proc.stderr


def last_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1].strip() if lines else "no output"


def create_failure(text: str) -> str:
    """``stockout``, ``permanent`` or ``transient``: what a failed create's
    error says about trying again."""
    lowered = text.lower()
    if "quota" not in lowered and any(m in lowered for m in STOCKOUT_MARKERS):
        return "stockout"
    if any(m in lowered for m in PERMANENT_MARKERS):
        return "permanent"
    return "transient"


class Cloud:
    """The gcloud calls of a run; each says what it saw, none decides."""

    def __init__(self, cfg: tc.TpuConfig, pyproject: Mapping, run: Runner = run_captured):
        self.cfg, self.pyproject, self.run = cfg, pyproject, run

    def vm_state(self) -> str:
        """The VM's state (`spot_decide`'s states: GONE, UNKNOWN, READY, ...)."""
        if not self.cfg.queued:
            return self._described(tc.describe_command(self.cfg))
        queued = self._described(tc.queued_describe_command(self.cfg))
        node = (self._described(tc.describe_command(self.cfg))
                if queued == sd.QUEUED_ACTIVE else "")
        return sd.queued_vm_state(queued, node)

    def _described(self, cmd: lc.Command) -> str:
        rc, out, err = self.run(cmd)
        if rc == 0 and out.split():
            return out.split()[0]
        return sd.GONE if rc != 0 and "NOT_FOUND" in err else sd.UNKNOWN

    def trainer(self) -> tuple[sd.Trainer, list[tc.Progress]]:
        """The trainer's state over ssh, and each host's progress."""
        [cmd] = tc.status_commands(self.cfg)
        rc, out, _ = self.run(cmd)
        states = tc.parse_status(out)
        if rc != 0 or not states:
            return sd.Trainer(sd.UNREACHABLE), []
        state, code = tc.summarize_status(states)
        return sd.Trainer(state, code if state == "exited" else None), tc.parse_progress(out)

    def create(self) -> Result:
        builder = tc.queued_create_commands if self.cfg.queued else tc.create_commands
        [cmd] = builder(self.cfg)
        return self.run(cmd)

    def build_wheel(self) -> None:
        """The project wheel, built here once for every VM of the run."""
        build, _, _ = tc.setup_commands(self.cfg, self.pyproject)
        wheel = lc.prepare_wheel_build(self.cfg.dist_dir, self.pyproject)
        rc, _, err = self.run(build)
        if rc != 0:
            print(err[-2000:], file=sys.stderr)
        lc.check_wheel_build(rc, wheel)

    def install(self) -> Result:
        """Copies the wheel to every host and installs it; the first failure."""
        _, *commands = tc.setup_commands(self.cfg, self.pyproject)
        for cmd in commands:
            result = self.run(cmd)
            if result[0] != 0:
                return result
        return 0, "", ""

    def manifest(self) -> Result:
        return self.run(tc.manifest_command(self.cfg))

    def start_trainer(self, dead_hosts: Sequence[str]) -> Result:
        _, start = tc.train_commands(self.cfg, dead_hosts)
        return self.run(start)

    def delete(self) -> Result:
        [cmd] = tc.delete_commands(self.cfg)
        return self.run(cmd)

    def fetch_log(self, dest: Path) -> Result:
        dest.parent.mkdir(parents=True, exist_ok=True)
        return self.run(tc.fetch_log_command(self.cfg, dest))
