"""Progress of a running job, logged by the driver every few seconds.

Beam's DirectRunner answers metric queries only once the run is over, so the
driver watches the run's temporary folder instead. There, each read task
leaves one spill file once its records are encoded (the ``files`` shuffle),
and each shard file grows as it is written. A thread lists the folder every
few seconds; the workers, in this process or others, do nothing extra.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from typing import Mapping

import mnist_contract as contract

from pipeline import storage
from pipeline.shard.config import MB, SHARDS, SPILL_DIR

INTERVAL_S = 3.0


@dataclasses.dataclass(frozen=True)
class Snapshot:
    spill_bytes: int = 0
    shard_files: int = 0
    shard_bytes: int = 0

    @property
    def total_bytes(self) -> int:
        return self.spill_bytes + self.shard_bytes


def summarize(sizes: Mapping[str, int]) -> Snapshot:
    """{path relative to the temp folder: bytes} -> what has been written so far."""
    spill = shard_files = shard_bytes = 0
    for path, size in sizes.items():
        if path.startswith(SPILL_DIR + "/"):
            spill += size
            continue
        try:
            contract.parse_shard_filename(path)
        except contract.ContractError:
            continue
        shard_files += 1
        shard_bytes += size
    return Snapshot(spill, shard_files, shard_bytes)


def describe(before: Snapshot, now: Snapshot, seconds: float, record_bytes: int) -> str:
    """One progress line; record counts are estimated from bytes."""
    parts = []
    if now.spill_bytes:
        encoded = now.spill_bytes // (record_bytes + SHARDS.spill_index_bytes)
        parts.append(f"~{encoded:,} records encoded")
    plural = "" if now.shard_files == 1 else "s"
    parts.append(f"{now.shard_files:,} shard file{plural} written so far "
                 f"({now.shard_bytes / MB:,.1f} MB)")
    rate = (now.total_bytes - before.total_bytes) / MB / max(seconds, 1e-9)
    parts.append(f"{rate:,.1f} MB/s")
    return "Progress: " + ", ".join(parts)


class ProgressLogger:
    """Logs a progress line every ``interval_s`` while the ``with`` block runs.

    ``record_bytes``: a typical framed record (`ShardConfig.record_bytes`).
    """

    def __init__(self, temp_dir: str, record_bytes: int, interval_s: float | None = None):
        self._temp_dir = temp_dir
        self._record_bytes = record_bytes
        self._interval_s = INTERVAL_S if interval_s is None else interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="progress", daemon=True)

    def _snapshot(self) -> Snapshot:
        try:
            return summarize(storage.sizes_under(self._temp_dir))
        except Exception:  # a listing that fails now is retried next time
            return Snapshot()

    def _run(self) -> None:
        before, then = Snapshot(), time.monotonic()
        while not self._stop.wait(self._interval_s):
            now, at = self._snapshot(), time.monotonic()
            logging.info("%s", describe(before, now, at - then, self._record_bytes))
            before, then = now, at

    def __enter__(self) -> "ProgressLogger":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
