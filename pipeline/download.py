"""Fetching the canonical MNIST files over HTTPS, with a verified local cache."""

from __future__ import annotations

import hashlib
import logging
import os
import tempfile
import urllib.error
import urllib.request

from pipeline.errors import PipelineInputError

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
            data = response.read()
    except (urllib.error.URLError, OSError) as e:
        raise PipelineInputError(f"{url}: download failed ({e})") from None
    expected = KNOWN_SHA256.get(name) if url.startswith(DEFAULT_MIRROR) else None
    if expected and hashlib.sha256(data).hexdigest() != expected:
        raise PipelineInputError(f"{url}: sha256 mismatch (corrupt download)")
    os.makedirs(cache_dir, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=cache_dir, prefix=".partial-")
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.replace(tmp, cached)
    return data
