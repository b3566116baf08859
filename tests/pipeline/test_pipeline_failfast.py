"""Failures that used to take minutes, or said nothing, end at once with one line.

Nothing here leaves the machine: Google's metadata server and every HTTP(S)
proxy are pointed at closed or silent ports on 127.0.0.1.
"""

import gzip
import http.server
import logging
import os
import socket
import subprocess
import sys
import threading

import numpy as np
import pytest

from pipeline import credentials, progress
from pipeline.source import download, idx
from pipeline.__main__ import main
from tests.helpers import REPO, run_job

FIX = ("run `gcloud auth application-default login`, or set "
       "GOOGLE_APPLICATION_CREDENTIALS to a service account key file")


def offline_env(tmp_path, **extra):
    """No credentials, no emulator, metadata server and proxies on closed loopback ports."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("STORAGE_EMULATOR_HOST", "GOOGLE_APPLICATION_CREDENTIALS",
                        "CLOUDSDK_CONFIG", "NO_PROXY", "no_proxy", "TF_CPP_MIN_LOG_LEVEL")}
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    env.update(HOME=str(home), NO_GCE_CHECK="true", GCE_METADATA_HOST="127.0.0.1:9",
               GCE_METADATA_IP="127.0.0.1:9", HTTPS_PROXY="http://127.0.0.1:9",
               HTTP_PROXY="http://127.0.0.1:9", https_proxy="http://127.0.0.1:9",
               http_proxy="http://127.0.0.1:9", PYTHONPATH=str(REPO))
    env.update(extra)
    return env


def run(args, env, module="pipeline"):
    return subprocess.run([sys.executable, "-m", module, *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("args, what", [
    (["--output=gs://bkt/mnist"], "gs://bkt/mnist"),
    (["--output={tmp}/out", "--source=gs://bkt/idx"], "gs://bkt/idx"),
    (["--output={tmp}/out", "--temp_location=gs://bkt/tmp"], "gs://bkt/tmp"),
    (["--output=gs://bkt/mnist", "--runner=DataflowRunner", "--project=p",
      "--temp_location=gs://bkt/tmp"], "gs://bkt/mnist"),
    (["--output={tmp}/out", "--runner", "DataflowRunner"], "--runner=DataflowRunner"),
])
def test_google_storage_without_credentials_is_one_line_naming_the_fix(tmp_path, args,
                                                                       what):
    result = run([a.format(tmp=tmp_path) for a in args], offline_env(tmp_path))
    assert result.returncode == 1  # the environment fails the run: not a bad flag
    assert result.stderr.splitlines() == [
        f"error: {what}: no Google credentials (none found); {FIX}"], result.stderr
    assert not (tmp_path / "out").exists()


def test_verify_on_google_storage_without_credentials(tmp_path):
    result = run(["gs://bkt/mnist"], offline_env(tmp_path), module="pipeline.verify")
    assert result.returncode == 1
    assert result.stderr.splitlines() == [
        f"error: gs://bkt/mnist: no Google credentials (none found); {FIX}"]


def test_credential_lookup_is_bounded_when_the_metadata_server_is_silent(tmp_path):
    """On a VM whose metadata server hangs, the check gives up after its wait."""
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        host = f"127.0.0.1:{silent.getsockname()[1]}"
        env = offline_env(tmp_path, GCE_METADATA_HOST=host, GCE_METADATA_IP=host)
        env.pop("NO_GCE_CHECK")
        probe = ("from pipeline import credentials\n"
                 "credentials.check('gs://bkt/x', wait_s=1)\n")
        result = subprocess.run([sys.executable, "-c", probe], cwd=REPO, env=env,
                                capture_output=True, text=True, timeout=120)
    assert result.returncode == 1
    assert ("MissingCredentials: gs://bkt/x: no Google credentials (none found "
            "within 1 s)") in result.stderr


def test_only_google_paths_and_dataflow_need_credentials(monkeypatch):
    monkeypatch.delenv("STORAGE_EMULATOR_HOST", raising=False)
    assert credentials.needs_google(["out", "mnist", None], "DirectRunner") is None
    assert credentials.needs_google(["out", "gs://b/x"], None) == "gs://b/x"
    assert credentials.needs_google(["out"], "DataflowRunner") == "--runner=DataflowRunner"
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", "http://127.0.0.1:1")
    assert credentials.needs_google(["gs://b/x"], "DirectRunner") is None


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_download_failure_suggests_the_offline_sample(tmp_path, capsys):
    url = f"http://127.0.0.1:{closed_port()}/mnist/"
    assert main([f"--source={url}", f"--output={tmp_path}/out",
                 f"--download_cache_dir={tmp_path}/cache"]) == 2
    lines = [l for l in capsys.readouterr().err.splitlines() if l.startswith("error:")]
    assert len(lines) == 1
    assert lines[0].startswith(f"error: {url}train-images-idx3-ubyte.gz: download failed")
    assert lines[0].endswith("offline, --source=sample converts the 5,000 real digits "
                             "shipped with the pipeline")


def test_download_shows_progress(tmp_path, monkeypatch, caplog):
    served = tmp_path / "served"
    served.mkdir()
    # A labels file as the download check wants it (whole gzip, IDX header),
    # random so that it stays ~3 MB compressed.
    body = gzip.compress(idx.encode_idx(np.frombuffer(os.urandom(3_000_000), np.uint8)))
    (served / "big.gz").write_bytes(body)

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, directory=str(served), **kwargs)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Quiet)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    monkeypatch.setattr(download, "PROGRESS_INTERVAL_S", 0)
    monkeypatch.setattr(download, "CHUNK_BYTES", 1_000_000)
    caplog.set_level(logging.INFO)
    try:
        data = download.fetch(f"http://127.0.0.1:{server.server_port}/big.gz",
                              str(tmp_path / "cache"))
    finally:
        server.shutdown()
    assert data == body
    lines = [r.getMessage() for r in caplog.records]
    assert any(l.startswith("Downloading big.gz: ") and " of 3.0 MB (" in l and
               l.endswith(" MB/s") and "(100%)" not in l for l in lines), lines
    assert any(l.startswith("Downloading big.gz: 3.0 of 3.0 MB (100%)") for l in lines)
    assert any(l.startswith("Downloaded big.gz: 3.0 MB in ") for l in lines)


def test_tfds_offline_is_one_line(tmp_path):
    result = run(["--source=tfds", f"--tfds_data_dir={tmp_path}/tfds",
                  f"--output={tmp_path}/out"], offline_env(tmp_path))
    assert result.returncode == 2
    errors = [l for l in result.stderr.splitlines() if l.startswith("error:")]
    assert errors == [
        f"error: --source=tfds: 'mnist' is not prepared in {tmp_path}/tfds/mnist/3.0.1 "
        "and TFDS's download host is unreachable ([Errno 111] Connection refused); "
        "offline, use --source=sample"], result.stderr
    assert "Variant folder" not in result.stderr
    assert not (tmp_path / "out").exists()


def test_progress_summary_from_the_temp_folder():
    snap = progress.summarize({
        "spill/train-000000": 876_000, "spill/train-000001": 438_000,
        "mnist-train.tfrecord-00000-of-00002": 856_000,
        "mnist-train.tfrecord-00001-of-00002": 100_000,
        "shards.json": 10})
    assert snap == progress.Snapshot(1_314_000, 2, 956_000)
    line = progress.describe(progress.Snapshot(), snap, 2.0, 856)
    assert line == ("Progress: ~1,500 records encoded, 2 shard files written so far "
                    "(1.0 MB), 1.1 MB/s")
    assert progress.describe(snap, snap, 3.0, 856).endswith(", 0.0 MB/s")


def test_a_run_logs_progress_while_it_works(tmp_path, monkeypatch, caplog):

    monkeypatch.setattr(progress, "INTERVAL_S", 0.2)
    caplog.set_level(logging.INFO)
    run_job(["--source=synthetic:30000", "--splits=train", f"--output={tmp_path}/out",
             "--runner=DirectRunner"])
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("Progress:")]
    assert len(lines) >= 2, lines
    assert any("records encoded" in l for l in lines)
    assert all(l.endswith(" MB/s") for l in lines)
