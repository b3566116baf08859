"""Downloads from a server that misbehaves: nothing bad is cached, nothing hangs.

A local ``http.server`` on 127.0.0.1 serves the four IDX ``.gz`` files (a
small valid split), whole or broken: the body cut in half under the full
Content-Length, cut in half under a matching one (so only the gzip check
sees it), or trickled a byte at a time. ``MNIST_DOWNLOAD_DEADLINE_S`` keeps
the slow case short.
"""

from __future__ import annotations

import gzip
import http.server
import logging
import os
import threading
import time

import numpy as np
import pytest

from pipeline.__main__ import main
from pipeline.errors import PipelineInputError
from pipeline.source import download, idx


def _files() -> dict[str, bytes]:
    rng = np.random.default_rng(0)
    files = {}
    for split, (images, labels) in idx.MNIST_FILES.items():
        n = 20 if split == "train" else 10
        files[images] = gzip.compress(idx.encode_idx(rng.integers(0, 256, (n, 28, 28))))
        files[labels] = gzip.compress(idx.encode_idx(rng.integers(0, 10, n)))
    return files


FILES = _files()


class _Handler(http.server.BaseHTTPRequestHandler):
    mode = "whole"

    def do_GET(self):  # noqa: N802 (http.server's name)
        body = FILES.get(self.path.rsplit("/", 1)[-1])
        if body is None:
            self.send_error(404)
            return
        half = body[:len(body) // 2]
        self.send_response(200)
        self.send_header("Content-Length", str(len(half if self.mode == "half-consistent"
                                                   else body)))
        self.end_headers()
        if self.mode == "whole":
            self.wfile.write(body)
        elif self.mode.startswith("half"):
            self.wfile.write(half)
        else:  # trickle
            for i in range(len(body)):
                self.wfile.write(body[i:i + 1])
                self.wfile.flush()
                time.sleep(0.2)

    def log_message(self, *args):
        pass


@pytest.fixture
def server():
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    httpd.daemon_threads = True
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    _Handler.mode = "whole"
    yield f"http://127.0.0.1:{httpd.server_address[1]}/mnist/"
    httpd.shutdown()
    httpd.server_close()


NAME = "train-images-idx3-ubyte.gz"


@pytest.mark.parametrize("mode, message", [
    ("half-announced", "the server sent {half:,} of the {whole:,} bytes it announced; "
                       "nothing was cached"),
    ("half-consistent", "truncated or corrupt gzip data"),
])
def test_a_half_body_is_not_cached_and_a_fixed_server_then_works(server, tmp_path, mode,
                                                                 message):
    _Handler.mode = mode
    cache = tmp_path / "cache"
    whole = len(FILES[NAME])
    with pytest.raises(PipelineInputError) as error:
        download.fetch(server + NAME, str(cache))
    assert str(error.value).startswith(f"{server}{NAME}: " + message.format(
        half=whole // 2, whole=whole)), error.value
    assert str(error.value).endswith("nothing was cached")
    assert not cache.exists() or os.listdir(cache) == []
    _Handler.mode = "whole"  # the server is fixed: the rerun downloads again
    assert download.fetch(server + NAME, str(cache)) == FILES[NAME]
    assert len(os.listdir(cache)) == 1


def test_a_damaged_cache_entry_is_removed_and_downloaded_again(server, tmp_path, caplog):
    cache = tmp_path / "cache"
    download.fetch(server + NAME, str(cache))
    [entry] = cache.iterdir()
    entry.write_bytes(FILES[NAME][:100])  # as an unchecked download left it
    with caplog.at_level(logging.WARNING):
        assert download.fetch(server + NAME, str(cache)) == FILES[NAME]
    assert f"Removing damaged cache entry {entry} of {server}{NAME}" in caplog.text
    assert entry.read_bytes() == FILES[NAME]


def test_a_labels_file_under_an_images_name_is_refused(server, tmp_path):
    with pytest.raises(PipelineInputError, match="wrong IDX magic number"):
        download.check_download(FILES["train-labels-idx1-ubyte.gz"], "x", NAME)


def test_a_trickling_server_meets_the_deadline_with_progress_lines(
        server, tmp_path, monkeypatch, caplog):
    _Handler.mode = "trickle"
    monkeypatch.setenv(download.DEADLINE_ENV, "2")
    # Bytes come at most every 0.2 s: most of them log a line before the deadline.
    monkeypatch.setattr(download, "PROGRESS_INTERVAL_S", 0.2)
    start = time.monotonic()
    with caplog.at_level(logging.INFO), pytest.raises(PipelineInputError) as error:
        download.fetch(server + NAME, str(tmp_path / "cache"))
    # A hang bound, not a speed bar: 2 s on a quiet machine; the whole
    # trickle, with no deadline, would take about an hour.
    assert time.monotonic() - start < 30
    assert str(error.value).startswith(
        f"{server}{NAME}: download still running after 2 s (MNIST_DOWNLOAD_DEADLINE_S; ")
    assert caplog.text.count(f"Downloading {NAME}: ") >= 2
    assert not (tmp_path / "cache").exists()


def test_the_job_reports_a_broken_server_in_one_line(server, tmp_path, monkeypatch,
                                                     capsys):
    _Handler.mode = "half-consistent"
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    code = main([f"--source={server}", f"--output={tmp_path / 'out'}",
                 "--runner=DirectRunner"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2
    assert err[-1].startswith(f"error: {server}{NAME}: truncated or corrupt gzip data"), err
    assert not (tmp_path / "xdg" / "mnist-tfrecords").exists() or not any(
        (tmp_path / "xdg" / "mnist-tfrecords").iterdir())
