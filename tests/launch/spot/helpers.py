"""What the spot-run tests share: a fake cloud on PATH, a small dataset in the
local GCS server's bucket, ``python -m launch.tpu run`` started as a user starts
it, and `Chaos`, which preempts the run's VMs on a schedule.

Everything is real but the cloud: the launcher's own commands set up each
fake VM and start ``python -m trainer`` there (`tests.launch.fake_cloud`),
and the trainer writes its checkpoints to a gs:// model_dir through
TensorFlow's own client (`tests.gcs_tls`).
"""

from __future__ import annotations

import json
import os
import random
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.parse
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from tests.helpers import EMULATOR_BUCKET, REPO
from tests.launch.fake_cloud import FakeCloud
from tests.launch.helpers import program, write_fake_gcloud
from tests.gcs_tls import CLIENT_GONE, read_log, traceback_end

NAME = "spot-tpu"
# The smoke preset's small model on 360 digits: 22 steps an epoch, a
# checkpoint every 6 steps; with --seed a resume is bit-identical.
TRAINER_ARGS = ["--preset=smoke", "--loop=custom", "--seed=7", "--epochs=3",
                "--global_batch_size=16", "--steps_per_execution=2", "--log_every=2",
                "--checkpoint_every=6", "--verbose=0"]
TOTAL_STEPS = 66
# One launcher run's hang bound, not a speed bar: the longest, the chaos run,
# took under 2 min with the machine's load at 2-4.5.
RUN_SECONDS = 1200


def write_dataset_to_bucket(server, prefix: str, tmp: Path) -> str:
    """360 train and 90 test digits (synthetic, learnable) under
    gs://EMULATOR_BUCKET/prefix; the gs:// path."""
    from tests.trainer_data import write_dataset
    write_dataset(str(tmp), num_train=360, num_test=90, train_shards=2, test_shards=1)
    bucket = server.emulator.client().bucket(EMULATOR_BUCKET)
    for path in tmp.iterdir():
        bucket.blob(f"{prefix}/{path.name}").upload_from_filename(str(path), timeout=30)
    return f"gs://{EMULATOR_BUCKET}/{prefix}"


@dataclass
class World:
    """One test's cloud, environment and paths."""
    tmp: Path
    server: object  # tests.gcs_tls.GcsTlsServer
    data: str
    cloud: FakeCloud = field(init=False)
    env: dict = field(init=False)

    def __post_init__(self):
        self.cloud = FakeCloud(self.tmp / "cloud")
        bin_dir = self.tmp / "bin"
        bin_dir.mkdir()
        write_fake_gcloud(bin_dir)
        self.env = {**self.server.env(), "FAKE_CLOUD": str(self.cloud.root),
                    "FAKE_HOST_PYTHON": sys.executable,
                    "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
        self.env.pop("PYTHONPATH", None)
        self.run_id = uuid.uuid4().hex[:8]
        self.log_start = len(read_log(self.server.log_path))
        self.refused_start = len(self.server.proxy.refused)

    def server_faults(self) -> list[str]:
        """The server's handler exceptions since this world began, but for
        a client gone mid-request (a VM's processes killed), and the hosts
        the proxy refused."""
        lines, faults = read_log(self.server.log_path, settle=10)[self.log_start:], []
        for i, line in enumerate(lines):
            if line.startswith("Traceback"):
                end = traceback_end(lines, i)
                if end is None:
                    faults.append(f"a traceback left unfinished: {lines[-1]}")
                elif not lines[end].startswith(CLIENT_GONE):
                    faults.append(lines[end])
        return faults + self.server.proxy.refused[self.refused_start:]

    def model_dir(self, label: str) -> str:
        return f"gs://{EMULATOR_BUCKET}/spot-{self.run_id}/{label}"

    def argv(self, label: str, *extra: str, events: str = "events.jsonl") -> list[str]:
        return ["run", "--spot", f"--name={NAME}", "--zone=us-central2-b",
                "--accelerator_type=v4-8", f"--data={self.data}",
                f"--model_dir={self.model_dir(label)}", "--poll_seconds=0.3",
                "--retry_seconds=60", f"--events={self.tmp / events}",
                f"--logs_dir={self.tmp / 'logs'}", "--no_build_isolation",
                f"--dist_dir={self.tmp / 'dist'}", *extra, *TRAINER_ARGS]

    def start(self, argv: list[str]) -> subprocess.Popen:
        """The launcher in a session of its own (Ctrl-C goes to its group)."""
        return subprocess.Popen(program("launch.tpu", *argv),
                                cwd=REPO, env=self.env, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, start_new_session=True)

    def launch(self, argv: list[str]) -> subprocess.CompletedProcess:
        proc = self.start(argv)
        try:
            out, err = proc.communicate(timeout=RUN_SECONDS)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, err = proc.communicate()
            raise AssertionError(f"no exit after {RUN_SECONDS} s\n{out}\n{err[-4000:]}") from None
        return subprocess.CompletedProcess(argv, proc.returncode, out, err)

    def events(self, name: str = "events.jsonl") -> list[dict]:
        path = self.tmp / name
        return [json.loads(line) for line in path.read_text().splitlines()]

    def vm_home(self) -> Path | None:
        vm_id = self.cloud.vm_id(NAME)
        return None if vm_id is None else self.cloud.vm_dir(NAME) / "home"

    def step(self) -> int:
        """The last step the current VM's trainer printed (-1: none yet)."""
        home = self.vm_home()
        log = home / "mnist-tpu" / "train.log" if home else None
        try:
            text = log.read_text(errors="replace") if log else ""
        except OSError:
            return -1
        steps = re.findall(r"step (\d+)/\d+", text)
        return int(steps[-1]) if steps else -1

    def cleanup(self) -> None:
        """Deletes what a failed test left in the fake cloud."""
        for name in self.cloud.vms():
            with self.cloud.locked():
                self.cloud.remove_vm(name)


def checkpoint_upload_seen(server, since: int) -> bool:
    """TensorFlow uploaded part of a checkpoint being saved (``ckpt-N_temp``)
    through the proxy after exchange number ``since``."""
    return any("_temp" in url and "ckpt-" in url
               for url in (urllib.parse.unquote(e.url)
                           for e in server.proxy.exchanges[since:]))


class Chaos(threading.Thread):
    """Preempts the run's VMs one after another, each when its trigger fires.

    A trigger: ``("setup", grace)``: while the VM installs; ``("step", n,
    grace)``: once its trainer printed step n or later; ``("checkpoint",
    n, grace)``: at the first checkpoint upload after step n. Each
    preemption waits for a VM other than the last one preempted.
    """

    def __init__(self, world: World, schedule: list[tuple], timeout: float = RUN_SECONDS):
        super().__init__(daemon=True)
        self.world, self.schedule, self.timeout = world, schedule, timeout
        self.done: list[tuple[str, tuple]] = []  # (vm id, trigger)
        self.error: str = ""

    def run(self) -> None:
        try:
            self._preempt_on_schedule()
        except Exception as e:  # noqa: BLE001 - reported by the test, not lost in a thread
            self.error = f"{type(e).__name__}: {e}"

    def _preempt_on_schedule(self) -> None:
        deadline = time.monotonic() + self.timeout
        for trigger in self.schedule:
            while not self._fired(trigger):
                if time.monotonic() > deadline:
                    self.error = f"trigger {trigger} never fired"
                    return
                time.sleep(0.02)
            self.done.append((self.world.cloud.preempt(NAME, trigger[-1]), trigger))

    def _fired(self, trigger: tuple) -> bool:
        cloud = self.world.cloud
        vm_id = cloud.vm_id(NAME)
        if vm_id is None or cloud.state(NAME) != "READY" or vm_id in {d[0] for d in self.done}:
            self._since = len(self.world.server.proxy.exchanges)
            return False
        kind = trigger[0]
        if kind == "setup":
            return self._host_log_has(vm_id, "-m pip install")
        if self.world.step() < trigger[1]:
            self._since = len(self.world.server.proxy.exchanges)
            return False
        return kind == "step" or checkpoint_upload_seen(self.world.server, self._since)

    def _host_log_has(self, vm_id: str, text: str) -> bool:
        home = self.world.vm_home()
        try:
            return bool(home and text in (home / "host.log").read_text())
        except FileNotFoundError:  # not written yet, or the VM just deleted
            return False


def random_schedule(seed: int) -> list[tuple]:
    """Three preemptions: during setup, at a random step, during a
    checkpoint save after a random step (killed at once, mid-save)."""
    rng = random.Random(seed)
    return [("setup", 1.0), ("step", rng.randint(4, 30), 5.0),
            ("checkpoint", rng.randint(8, 40), 0.0)]
