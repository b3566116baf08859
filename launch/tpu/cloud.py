"""The gcloud calls of the TPU VM launcher, for every step and for ``run``.

`Cloud` runs the commands `launch.tpu.commands.phases` planned (the ones
``--dry_run`` prints), each call saying what it saw: a VM state, a trainer
state, an exit status and the output. None decides what to do about it:
the steps below stop at the first failure, ``run`` asks
`launch.tpu.spot.decide.decide`. A step shows each command and its output as
it runs (`Cloud.shown`); ``run`` captures them and shows them only when
they matter.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, Mapping, Sequence

from launch import errors as le
from launch import processes as lp
from launch import wheel as lw
from launch import staging
from launch.tpu.spot import decide as sd
from launch.tpu import commands as tc
from launch.tpu.config import TpuConfig
from launch.tpu import states as ts
from launch.tpu.topology import slice_hosts
from mnist_common import console
from mnist_contract import MANIFEST_FILE, ContractError, Manifest, join_path

Result = tuple[int, str, str]  # exit status, stdout, stderr
Runner = Callable[[lp.Command], Result]
Plan = Mapping[str, Sequence[lp.Command]]  # a step's name -> its commands
# gcloud's words for a create that failed for want of capacity, and for one
# that will fail the same way however often it is retried.
STOCKOUT_MARKERS = ("no more capacity", "resource_exhausted", "stockout")
PERMANENT_MARKERS = ("invalid_argument", "permission_denied", "unauthenticated",
                     "quota", "invalid value")
POLL_FAILURES = 5    # failed status checks in a row before ``wait`` gives up
# What a plan may use that older gcloud releases lack (they answer
# "unrecognized arguments" or "Invalid choice"): the argument, the flag that
# asks for it, and the first Google Cloud SDK release with it, GA.
GCLOUD_RELEASES = (("queued-resources", "--queued", 467), ("--spot", "--spot", 464))


def run_captured(cmd: lp.Command) -> Result:
    """Runs ``cmd`` with its output captured (shown only when it fails)."""
    try:
        proc = subprocess.run(list(cmd), capture_output=True, text=True,
                              errors="replace", check=False, cwd=lw.REPO_ROOT)
    except FileNotFoundError:
        return 127, "", f"{cmd[0]}: command not found"
    return proc.returncode, proc.stdout, proc.stderr


def run_shown(cmd: lp.Command) -> Result:
    """Shows ``cmd`` and runs it with its output shown (`lp.run_command`)."""
    return lp.run_command(cmd, cwd=lw.REPO_ROOT), "", ""


def ask_shown(cmd: lp.Command) -> Result:
    """Shows ``cmd`` and runs it for its stdout (`lp.run_command_output`)."""
    return (*lp.run_command_output(cmd), "")


def last_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1].strip() if lines else "no output"


def gcloud_needed(commands: Sequence[lp.Command]) -> tuple[str, int] | None:
    """The flag of ``commands`` that needs the newest gcloud, and that
    release (None: any gcloud runs them)."""
    used = [(release, flag) for arg, flag, release in GCLOUD_RELEASES
            if any(arg in cmd for cmd in commands)]
    if not used:
        return None
    release, flag = max(used)
    return flag, release


def check_gcloud(cfg: TpuConfig, commands: Sequence[lp.Command],
                 ask: Runner = run_captured) -> None:
    """`le.RunFailure` when the gcloud here is older than ``commands``
    need (`gcloud_needed`), asked once before anything is created, so an
    old SDK does not fail deep in a run; a version that cannot be read is
    a warning."""
    needed = gcloud_needed(commands)
    if needed is None:
        return
    flag, release = needed
    wanted = f"{flag} needs Google Cloud SDK {release}.0.0 or newer"
    rc, out, err = ask([cfg.gcloud, "version", "--format=json"])
    if rc != 0:
        raise le.RunFailure(f"`{cfg.gcloud} version` exited {rc} "
                            f"({last_line(err + out)}); {wanted}")
    try:
        version = json.loads(out)["Google Cloud SDK"]
        major = int(version.split(".")[0])
    except (ValueError, KeyError, TypeError, AttributeError):
        print(f"warning: no version read from `{cfg.gcloud} version --format=json`; "
              f"{wanted}", file=sys.stderr)
        return
    if major < release:
        raise le.RunFailure(f"gcloud {version} is too old: {wanted} "
                            "(`gcloud components update`)")


def create_failure(text: str) -> str:
    """``stockout``, ``permanent`` or ``transient``: what a failed create's
    error says about trying again."""
    lowered = text.lower()
    if "quota" not in lowered and any(m in lowered for m in STOCKOUT_MARKERS):
        return "stockout"
    if any(m in lowered for m in PERMANENT_MARKERS):
        return "permanent"
    return "transient"


class NotThisRun(le.LaunchError):
    """A VM or queued resource of the launch's name that this launch did
    not create: it carries no mark (`tc.MARK_KEY`), or another run's."""
    code = console.BAD_INPUT


def _dig(value, *keys):
    """``value[k1][k2]...`` through dicts and lists, None where absent."""
    for key in keys:
        if isinstance(value, dict) or (isinstance(value, list) and type(key) is int
                                        and -len(value) <= key < len(value)):
            value = value[key] if isinstance(value, list) else value.get(key)
        else:
            return None
    return value


def parse_described(out: str, queued: bool) -> tuple[str, object]:
    """The state and the mark (`tc.MARK_KEY`'s label value, None if
    unlabelled) in a describe's JSON; state "" when it is unreadable."""
    try:
        found = json.loads(out)
    except ValueError:
        return "", None
    state = _dig(found, "state", "state") if queued else _dig(found, "state")
    labels = (_dig(found, "tpu", "nodeSpec", 0, "node", "labels") if queued
              else _dig(found, "labels"))
    return (state if isinstance(state, str) else ""), _dig(labels, tc.MARK_KEY)


class Cloud:
    """The gcloud calls of a launch, from its planned commands; each says
    what it saw, none decides.

    ``run`` runs a command whose output is only shown, ``ask`` one whose
    stdout is read; ``shows_output``: both show it as it comes. A call
    that reaches or changes the VM (ssh, scp, delete) runs only while
    ``checked``: the last describe found the VM (or queued resource)
    carrying this launch's mark, ``cfg.run_id`` (`_change`); one that
    found another's raised `NotThisRun`.
    """

    def __init__(self, cfg: TpuConfig, pyproject: Mapping, planned: Plan,
                 run: Runner = run_captured, ask: Runner | None = None,
                 shows_output: bool = False):
        self.cfg, self.pyproject, self.planned = cfg, pyproject, planned
        self.run, self.ask = run, ask or run
        self.shows_output = shows_output
        self.checked = False

    @classmethod
    def shown(cls, cfg: TpuConfig, pyproject: Mapping, planned: Plan) -> "Cloud":
        """A cloud whose commands and output are shown as they run (the steps)."""
        return cls(cfg, pyproject, planned, run_shown, ask_shown, shows_output=True)

    def vm_state(self) -> str:
        """The VM's state (`spot_decide`'s states: GONE, UNKNOWN, READY,
        ...); `NotThisRun` when the VM or its queued resource carries
        another mark than this launch's. Sets ``checked``."""
        self.checked = False
        if not self.cfg.queued:
            [describe] = self.planned["describe"]
            state = self._described(describe, "VM", queued=False)
        else:
            queued_describe, describe = self.planned["describe"]
            queued = self._described(queued_describe, "queued resource", queued=True)
            node = (self._described(describe, "VM", queued=False)
                    if queued == sd.QUEUED_ACTIVE else "")
            state = sd.queued_vm_state(queued, node)
        self.checked = state not in (sd.GONE, sd.UNKNOWN)
        return state

    def _described(self, cmd: lp.Command, what: str, queued: bool) -> str:
        rc, out, err = self.ask(cmd)
        if rc != 0:
            return sd.GONE if "NOT_FOUND" in err else sd.UNKNOWN
        state, mark = parse_described(out, queued)
        if not state:
            return sd.UNKNOWN
        if mark != self.cfg.run_id:
            seen = "no such label" if mark is None else f"{json.dumps(mark)}"
            raise NotThisRun(
                f"{self.cfg.name} in {self.cfg.zone}: a {what} this launch did not "
                f"create (label {tc.MARK_KEY}: {seen}, not {self.cfg.run_id}); left "
                "as it is: pass another --name, or the --run_id it was made with")
        return state

    def _change(self, cmd: lp.Command, read: bool = False) -> Result:
        """Runs ``cmd``, which reaches or changes the VM, only while
        ``checked`` (``read``: for its stdout); else runs nothing and fails
        saying why."""
        if self.checked:
            return self.ask(cmd) if read else self.run(cmd)
        why = (f"error: {self.cfg.name}: not run ({cmd[4]}): no describe since the "
               f"last create or delete found this launch's mark on it")
        if self.shows_output:
            print(why, file=sys.stderr)
        return console.FAILURE, "", why

    def check(self) -> int:
        """A step's check before it reaches the VM: 0 once the VM was seen
        with this launch's mark; `NotThisRun` for another's."""
        state = self.vm_state()
        if self.checked:
            return console.OK
        return le.fail(f"{self.cfg.name} in {self.cfg.zone}: no VM to reach "
                       f"(describe: {state}); nothing was run on it", console.FAILURE)

    def status(self) -> Result:
        """The status script's answer from every host (`ts.parse_status`)."""
        [cmd] = self.planned.get("wait") or self.planned["status"]
        return self._change(cmd, read=True)

    def trainer(self) -> tuple[sd.Trainer, list[ts.Progress]]:
        """The trainer's state over ssh, and each host's progress."""
        rc, out, _ = self.status()
        states = ts.parse_status(out)
        if rc != 0 or not states:
            return sd.Trainer(sd.UNREACHABLE), []
        state, code = ts.summarize_status(states)
        return sd.Trainer(state, code if state == "exited" else None), ts.parse_progress(out)

    def create(self) -> Result:
        [cmd] = self.planned["create"]
        self.checked = False  # a VM made now is reached once described
        return self.run(cmd)

    def build_wheel(self) -> None:
        """The project wheel, built here (once for every VM of a run);
        `le.RunFailure` when it does not build."""
        builds = self.planned["setup"][:len(tc.build_commands(self.cfg))]
        staging.make_wheel(self.cfg.wheel_source, self.cfg.dist_dir, self.pyproject,
                           builds, self._build)

    def _build(self, cmd: lp.Command) -> int:
        rc, _, err = self.run(cmd)
        if rc != 0 and not self.shows_output:
            print(err[-2000:], file=sys.stderr)
        return rc

    def install(self) -> Result:
        """Copies the wheel to every host and installs it; the first failure."""
        return self._in_turn(self.planned["setup"][len(tc.build_commands(self.cfg)):])

    def _in_turn(self, commands: Sequence[lp.Command]) -> Result:
        """Runs ``commands`` until one fails; the last result."""
        result = 0, "", ""
        for cmd in commands:
            result = self._change(cmd)
            if result[0] != 0:
                return result
        return result

    def manifest(self) -> Result:
        return self.ask(self.planned["train"][0])

    def start_trainer(self, dead_hosts: Sequence[str] = ()) -> Result:
        """Starts the trainer detached; ``dead_hosts``: see `tc.train_script`."""
        start = self.planned["train"][1]
        if dead_hosts:
            _, start = tc.train_commands(self.cfg, dead_hosts)
        return self._change(start)

    def logs(self) -> Result:
        return self._in_turn(self.planned["logs"])

    def delete(self) -> Result:
        [cmd] = self.planned["delete"]
        result = self._change(cmd)
        self.checked = False
        return result

    def fetch_log(self, dest: Path) -> Result:
        dest.parent.mkdir(parents=True, exist_ok=True)
        return self._change(tc.fetch_log_command(self.cfg, dest))


# ------------------------------------------------------------------ steps

def train_shards_warning(cfg: TpuConfig, rc: int, manifest_text: str) -> str | None:
    """Why the slice's hosts may read the train split badly, or None.

    With fewer train files than hosts the trainer cannot give each host its
    own files: every host reads the whole split and keeps every n-th record.
    A manifest that cannot be read here is a warning too, not a failure:
    the trainer reads it on the TPU itself and names any problem there.
    """
    hosts = slice_hosts(cfg.accelerator_type)
    where = join_path(cfg.data, MANIFEST_FILE)
    if rc != 0:
        return (f"{where}: not read (gcloud storage cat exited {rc}); the train "
                f"files were not compared with the {hosts} host(s) of "
                f"{cfg.accelerator_type}")
    try:
        files = len(Manifest.from_json(manifest_text, origin=where)
                    .split("train").shards)
    except ContractError as exc:
        problem = str(exc).removeprefix(f"{where}: ")
        return (f"{where}: {problem}; the train files were not compared with "
                "the slice's hosts")
    if files >= hosts:
        return None
    return (f"{where}: the train split has {files} file(s) but {cfg.accelerator_type} "
            f"has {hosts} hosts, so every host reads all of it and keeps one record "
            f"in {hosts}; rerun the pipeline with --min_shards={hosts} "
            "(or a multiple of it)")


def compare_manifest(cloud: Cloud) -> None:
    """Reads the dataset's manifest and warns when the slice has more hosts
    than the train split has files (`train_shards_warning`)."""
    rc, out, _ = cloud.manifest()
    warning = train_shards_warning(cloud.cfg, rc, out)
    if warning:
        print(f"warning: {warning}", file=sys.stderr)


def wait_for_trainer(cloud: Cloud, sleep: Callable[[float], None] = time.sleep,
                     clock: Callable[[], float] = time.monotonic) -> int:
    """Asks for the trainer's state until it exits; its exit status.

    A failed check (the VM unreachable for a moment) is retried; after
    ``POLL_FAILURES`` in a row the wait gives up with 255. After
    ``cfg.wait_timeout`` seconds of a running trainer it gives up with 124.
    Giving up never stops the trainer.
    """
    cfg, start, failures = cloud.cfg, clock(), 0
    while True:
        rc, output, _ = cloud.status()
        states = ts.parse_status(output)
        if rc != 0 or not states:
            failures += 1
            if failures >= POLL_FAILURES:
                return le.fail(f"{cfg.name}: {failures} status checks in a "
                               f"row failed (last exit {rc}); training may "
                               "still be running", console.LOST)
        else:
            failures = 0
            ended = _trainer_ended(cfg, *ts.summarize_status(states))
            if ended is not None:
                return ended
        if clock() - start >= cfg.wait_timeout:
            return le.fail(f"{cfg.name}: training still running after "
                           f"{cfg.wait_timeout:g} s (--wait_timeout); it "
                           "goes on, see the status and logs steps",
                           console.TIMED_OUT)
        sleep(cfg.poll_seconds)


def _trainer_ended(cfg: TpuConfig, state: str, code: int) -> int | None:
    """The wait's exit status once the trainer is no longer running, else None."""
    if state == "exited":
        print(f"training on {cfg.name} finished with exit status "
              f"{code}{ts.exit_note(code)}", file=sys.stderr)
        return code
    if state == "stopped":
        return le.fail(f"{cfg.name}: the trainer stopped without an "
                       "exit status (killed, or the host restarted);"
                       " see the logs step", console.FAILURE)
    if state == "not started":
        return le.fail(f"{cfg.name}: no trainer was started there "
                       f"({tc.REMOTE_DIR}/train.pid is missing)", console.FAILURE)
    return None


def show_status(cloud: Cloud) -> int:
    """``status``: one line per host; 0 while training runs or after it
    succeeded, else the trainer's status."""
    rc, output, _ = cloud.status()
    sys.stdout.write(output)
    if rc != 0:
        return rc
    code = ts.summarize_status(ts.parse_status(output))[1]
    if ts.exit_note(code):
        print(f"{cloud.cfg.name}: exit status {code}{ts.exit_note(code)}", file=sys.stderr)
    return code


def create(cloud: Cloud) -> int:
    """``create``: the VM, labelled with the launch's run id, which the
    steps that reach it later are given (``--run_id``)."""
    rc = cloud.create()[0]
    if rc == 0:
        print(f"{cloud.cfg.name}: made with the label {tc.MARK_KEY}={cloud.cfg.run_id}; "
              f"pass --run_id={cloud.cfg.run_id} to the steps that reach it",
              file=sys.stderr)
    return rc


def setup(cloud: Cloud) -> int:
    cloud.build_wheel()
    return cloud.install()[0]


def train(cloud: Cloud) -> int:
    compare_manifest(cloud)
    return cloud.start_trainer()[0]


STEP_ACTIONS: dict[str, Callable[[Cloud], int]] = {
    "describe": lambda cloud: cloud.check(),
    "create": create,
    "setup": setup,
    "train": train,
    "wait": wait_for_trainer,
    "status": show_status,
    "logs": lambda cloud: cloud.logs()[0],
    "delete": lambda cloud: cloud.delete()[0],
}


def run_step(name: str, cloud: Cloud) -> int:
    """One step (`STEP_ACTIONS`); its exit status."""
    return STEP_ACTIONS[name](cloud)
