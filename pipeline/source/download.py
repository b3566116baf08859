"""Fetching the canonical MNIST files over HTTPS, with a verified local cache."""

from __future__ import annotations

import hashlib
import logging
import os
import tempfile
import time
import urllib.error
import urllib.request

from pipeline.errors import PipelineInputError
from pipeline.shard.config import MB

# Where TFDS and most MNIST loaders fetch from.
DEFAULT_MIRROR = "https://storage.googleapis.com/cvdf-datasets/mnist/"

# sha256 of the published files (the same values TFDS checks).
KNOWN_SHA256 = {
    "train-images-idx3-ubyte.gz":
        "440fcabf73cc546fa21475e81ea370265605f56be210a4024d2ca8f203523609",
    "train-labels-idx1-ubyte.gz":
        "3552534a0a558bbed6aed32b30c495cca23d567ec52cac8be1a0730e8010255c",
    "t10k-images-idx3-ubyte.gz":
        "8d422c7b0a1c1c79245a5bcf07fe86e33eeafee792b84584aec276f5a2dbc4e6",
    "t10k-labels-idx1-ubyte.gz":
        "f7ae60f92e00ec6debd23a6088c31dbd2371eca3ffa0defaefb259924204aec6",
}


PROGRESS_INTERVAL_S = 2.0
CHUNK_BYTES = 1 << 20


def _read_with_progress(response, name: str) -> bytes:
    """The whole body, logging bytes so far and MB/s every couple of seconds."""
    total = int(response.headers.get("Content-Length") or 0)
    chunks, done = [], 0
    start = last = time.monotonic()
    while True:
        chunk = response.read(CHUNK_BYTES)
        if not chunk:
            break
        chunks.append(chunk)
        done += len(chunk)
        now = time.monotonic()
        if now - last >= PROGRESS_INTERVAL_S:
            last = now
            of_total = f" of {total / MB:.1f} MB ({100 * done / total:.0f}%)" if total else " MB"
            logging.info("Downloading %s: %.1f%s, %.1f MB/s", name, done / MB,
                         of_total, done / MB / max(now - start, 1e-9))
    logging.info("Downloaded %s: %.1f MB in %.1f s", name, done / MB,
                 time.monotonic() - start)
    return b"".join(chunks)


def unreachable(url: str, timeout_s: float = 10) -> str:
    """Why ``url``'s host cannot be reached (proxies honoured), or "" if it answers."""
    try:
        with urllib.request.urlopen(urllib.request.Request(url, method="HEAD"),
                                    timeout=timeout_s):
            return ""
    except urllib.error.HTTPError:
        return ""  # the server answered
    except (urllib.error.URLError, OSError) as e:
        return str(getattr(e, "reason", None) or e)


def default_cache_dir() -> str:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")
    return os.path.join(base, "mnist-tfrecords")


def fetch(url: str, cache_dir: str | None = None, timeout_s: float = 60) -> bytes:
    """The bytes at ``url``, downloaded once into ``cache_dir``.

    The cache entry appears only once fully written (write, then rename), and
    files of the canonical mirror are checked against their known sha256.
    """
    cache_dir = cache_dir or default_cache_dir()
    name = url.rstrip("/").rsplit("/", 1)[-1]
    url_hash = hashlib.sha256(url.encode()).hexdigest()[:16]
    cached = os.path.join(cache_dir, f"{url_hash}-{name}")
    if os.path.exists(cached):
        with open(cached, "rb") as f:
            return f.read()
    logging.info("Downloading %s", url)
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as response:
            data = _read_with_progress(response, name)
    except (urllib.error.URLError, OSError) as e:
        raise PipelineInputError(
            f"{url}: download failed ({e}); offline, --source=sample converts the "
            "5,000 real digits shipped with the pipeline") from None
    expected = KNOWN_SHA256.get(name) if url.startswith(DEFAULT_MIRROR) else None
    if expected and hashlib.sha256(data).hexdigest() != expected:
        raise PipelineInputError(f"{url}: sha256 mismatch (corrupt download)")
    os.makedirs(cache_dir, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=cache_dir, prefix=".partial-")
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.replace(tmp, cached)
    return data
