"""Overlapping a worker's I/O with its encoding.

A DoFn runs on one Python thread, but gzip decoding, file writes and
hashing release the GIL. These two helpers let them run beside the
per-record work, on one extra thread each, in order, with bounded memory
(a few items ahead); an error on the extra thread surfaces in the caller.
"""

from __future__ import annotations

import collections
import concurrent.futures
import queue
import threading
from typing import Callable, Iterable, Iterator, TypeVar

T = TypeVar("T")


def _put_until(ready: queue.Queue, entry, stop: threading.Event) -> bool:
    """Puts ``entry`` in ``ready`` once there is room; False if ``stop`` is set first."""
    while not stop.is_set():
        try:
            ready.put(entry, timeout=0.1)
            return True
        except queue.Full:
            continue
    return False


def prefetched(items: Iterable[T], depth: int = 2) -> Iterator[T]:
    """Yields ``items``, produced up to ``depth`` ahead on a background thread.

    An exception the producer raises is re-raised here, after the items
    before it. Closing this generator stops (and closes) the producer.
    """
    ready: queue.Queue = queue.Queue(maxsize=depth)
    stop = threading.Event()

    def produce() -> None:
        source = iter(items)
        try:
            for item in source:
                if not _put_until(ready, (True, item), stop):
                    return
            _put_until(ready, (False, None), stop)
        except BaseException as e:  # handed to the consumer
            _put_until(ready, (False, e), stop)
        finally:
            close = getattr(source, "close", None)
            if close is not None:
                close()

    thread = threading.Thread(target=produce, name="prefetch", daemon=True)
    thread.start()
    try:
        while True:
            is_item, value = ready.get()
            if is_item:
                yield value
            elif value is None:
                return
            else:
                raise value
    finally:
        stop.set()
        thread.join()


class InOrder:
    """Runs calls one at a time, in order, on a background thread.

    ``submit`` waits while ``depth`` calls are pending, so memory stays
    bounded; ``result`` of each call, and any error, come back through
    `wait_oldest` / `wait_all`.
    """

    def __init__(self, depth: int = 2):
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=1,
                                                           thread_name_prefix="in-order")
        self._pending: collections.deque = collections.deque()
        self._depth = depth

    def submit(self, fn: Callable, *args) -> list:
        """Queues ``fn(*args)``; returns the results of calls it had to wait for."""
        done = []
        while len(self._pending) >= self._depth:
            done.append(self.wait_oldest())
        self._pending.append(self._pool.submit(fn, *args))
        return done

    def wait_oldest(self):
        return self._pending.popleft().result()

    def wait_all(self) -> list:
        try:
            return [self.wait_oldest() for _ in range(len(self._pending))]
        finally:
            self.close()

    def close(self) -> None:
        """Waits for what is running; drops what has not started."""
        for future in self._pending:
            future.cancel()
        self._pending.clear()
        self._pool.shutdown(wait=True)
