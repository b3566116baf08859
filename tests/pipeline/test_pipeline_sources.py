"""The sources (`pipeline.source.sources`): synthetic, the offline sample, IDX over HTTP(S)."""

import http.server
import os
import subprocess
import sys
import threading

import numpy as np
import pytest

from pipeline.errors import PipelineInputError
from pipeline.source import sources
from pipeline.source.download import fetch
from tests.helpers import REPO


def test_synthetic_is_deterministic_and_task_partitioned():
    source = sources.parse_source("synthetic:25000")
    tasks = source.read_tasks("train")
    assert tasks == [(0, 10_000), (10_000, 20_000), (20_000, 25_000)]
    a = next(source.read("train", tasks[1]))
    b = next(source.read("train", tasks[1]))
    np.testing.assert_array_equal(a.images, b.images)
    np.testing.assert_array_equal(a.indices, np.arange(10_000, 20_000))
    assert source.estimated_examples("test") == 25000 // 6
    assert set(np.unique(a.labels)) == set(range(10))


def test_sample_source_splits_real_digits():
    source = sources.parse_source("sample")
    train = next(source.read("train", None))
    test = next(source.read("test", None))
    assert len(train.labels) == 4000 and len(test.labels) == 1000
    assert np.bincount(test.labels).tolist() == [100] * 10
    assert train.images.dtype == np.uint8 and train.images.max() > 200


@pytest.mark.parametrize("spec", ["synthetic:0", "synthetic:x", ""])
def test_parse_source_rejects(spec):
    with pytest.raises(PipelineInputError):
        sources.parse_source(spec)


def test_https_source_downloads_once_into_cache(tmp_path, idx_dir, digits):
    """The IDX source over HTTP(S), against a local server; then from cache."""
    handler = lambda *a, **kw: http.server.SimpleHTTPRequestHandler(  # noqa: E731
        *a, directory=str(idx_dir), **kw)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{server.server_address[1]}/"
    source = sources.parse_source(url, cache_dir=str(tmp_path / "cache"))
    try:
        source.check()
    finally:
        server.shutdown()
        server.server_close()
    batch = next(source.read("test", None))  # server is gone: the cache serves it
    np.testing.assert_array_equal(batch.images, digits["test"][0])
    with pytest.raises(PipelineInputError, match="download failed"):
        fetch(url + "missing.gz", str(tmp_path / "cache"), timeout_s=2)


@pytest.mark.parametrize("kind", ["FIFO", "directory"])
def test_an_idx_file_that_is_not_a_file_is_one_line(idx_dir, tmp_path, kind):
    """A FIFO is refused, not opened: opening it would wait for a writer forever."""
    path = idx_dir / "train-labels-idx1-ubyte.gz"
    path.unlink()
    os.mkfifo(path) if kind == "FIFO" else path.mkdir()
    result = subprocess.run(
        [sys.executable, "-m", "pipeline", f"--source={idx_dir}",
         f"--output={tmp_path}/out", "--runner=DirectRunner"],
        cwd=REPO, capture_output=True, text=True, timeout=120)
    assert result.returncode == 2, result.stderr[-2000:]
    assert result.stderr.strip().splitlines()[-1] == (
        f"error: {path}: cannot read source file ([Errno 22] is a {kind}, not a file: "
        f"'{path}')")
