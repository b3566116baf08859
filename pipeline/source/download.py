"""Fetching the MNIST IDX files over HTTP(S), with a verified local cache.

Nothing enters the cache unchecked: a file of the canonical mirror must have
its published sha256; any other URL's file must be whole gzip data holding
an IDX array of the kind its name says (`pipeline.source.idx`), and a body
shorter than the server's Content-Length is refused. A cache entry that
fails the same check when read (written by something else, or damaged) is
removed, with a warning naming it, and downloaded again. A download ends
with one line once it has run ``$MNIST_DOWNLOAD_DEADLINE_S`` seconds
(default 600) in all, however slowly bytes still arrive, and logs its
progress every couple of seconds meanwhile.
"""

from __future__ import annotations

import hashlib
import logging
import os
import tempfile
import time
import urllib.error
import urllib.request

from mnist_common import local_paths
from mnist_common.flags import SECONDS, EnvironmentValueError, environ_number
from pipeline.errors import PipelineInputError
from pipeline.shard.config import MB
from pipeline.source import idx

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
DEADLINE_ENV = "MNIST_DOWNLOAD_DEADLINE_S"
DEFAULT_DEADLINE_S = 600.0


def download_deadline() -> float:
    """Seconds one file's download may take in all (``$MNIST_DOWNLOAD_DEADLINE_S``)."""
    try:
        return environ_number(DEADLINE_ENV, SECONDS, DEFAULT_DEADLINE_S)
    except EnvironmentValueError as e:
        raise PipelineInputError(str(e)) from None


def _read_with_progress(response, name: str, url: str, deadline_s: float) -> bytes:
    """The whole body, logging bytes so far and MB/s every couple of seconds.

    ``read1`` returns what has arrived, so a server that trickles bytes is
    still measured against the deadline and still logged.
    """
    total = int(response.headers.get("Content-Length") or 0)
    chunks, done = [], 0
    start = last = time.monotonic()
    while True:
        chunk = response.read1(CHUNK_BYTES)
        if not chunk:
            break
        chunks.append(chunk)
        done += len(chunk)
        now = time.monotonic()
        if now - start > deadline_s:
            raise PipelineInputError(
                f"{url}: download still running after {deadline_s:g} s "
                f"({DEADLINE_ENV}; {done:,} bytes received); nothing was cached")
        if now - last >= PROGRESS_INTERVAL_S:
            last = now
            of_total = f" of {total / MB:.1f} MB ({100 * done / total:.0f}%)" if total else " MB"
            logging.info("Downloading %s: %.1f%s, %.1f MB/s", name, done / MB,
                         of_total, done / MB / max(now - start, 1e-9))
    if total and done != total:
        raise PipelineInputError(f"{url}: the server sent {done:,} of the {total:,} "
                                 "bytes it announced; nothing was cached")
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

    The cache entry appears only once checked (`check_download`) and fully
    written (write, then rename).
    """
    cache_dir = cache_dir or default_cache_dir()
    name = url.rstrip("/").rsplit("/", 1)[-1]
    url_hash = hashlib.sha256(url.encode()).hexdigest()[:16]
    cached = os.path.join(cache_dir, f"{url_hash}-{name}")
    data = _read_cached(cached, url, name)
    if data is not None:
        return data
    data = _download(url, name, timeout_s)
    try:
        check_download(data, url, name)
    except PipelineInputError as e:
        raise PipelineInputError(f"{e}; nothing was cached") from None
    os.makedirs(cache_dir, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=cache_dir, prefix=".partial-")
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    local_paths.move(tmp, cached, overwrite=True)
    return data


def _download(url: str, name: str, timeout_s: float) -> bytes:
    deadline_s = download_deadline()
    logging.info("Downloading %s", url)
    try:
        with urllib.request.urlopen(url, timeout=min(timeout_s, deadline_s)) as response:
            return _read_with_progress(response, name, url, deadline_s)
    except (urllib.error.URLError, OSError) as e:
        raise PipelineInputError(
            f"{url}: download failed ({e}); offline, --source=sample converts the "
            "5,000 real digits shipped with the pipeline") from None


def check_download(data: bytes, origin: str, name: str) -> None:
    """The canonical mirror's files by their published sha256; any other
    file as whole gzip data holding the IDX array its name promises."""
    expected = KNOWN_SHA256.get(name) if origin.startswith(DEFAULT_MIRROR) else None
    if expected:
        if hashlib.sha256(data).hexdigest() != expected:
            raise PipelineInputError(f"{origin}: sha256 mismatch (corrupt download)")
        return
    magic = idx.IMAGES_MAGIC if "images" in name else idx.LABELS_MAGIC
    idx.decode_idx(idx.gunzip(data, origin), magic, origin)


def _read_cached(cached: str, url: str, name: str) -> bytes | None:
    """The cache entry's bytes if it passes `check_download`; a damaged one is
    removed (a warning names it) so that it is downloaded again."""
    try:
        with open(cached, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        return None
    try:
        check_download(data, url, name)
        return data
    except PipelineInputError as e:
        logging.warning("Removing damaged cache entry %s of %s (%s); downloading again",
                        cached, url, str(e).removeprefix(f"{url}: "))
    try:
        local_paths.remove_file(cached)
    except OSError as e:
        raise PipelineInputError(f"{cached}: damaged cache entry of {url} that cannot "
                                 f"be removed ({e}); delete it") from None
    return None
