"""What the controller does between inner-loop calls besides logging, evaluating and saving.

As Orbit's actions: each is handed to the controller, which asks it where
the inner loop must return (`Action.next_boundary`) and calls it after every
call (`Action.__call__` with the step reached). `Profiler` traces
``--profile_steps``.
"""

from __future__ import annotations

import logging
from typing import Callable, Optional, Protocol

import tensorflow as tf

log = logging.getLogger(__name__)


class Action(Protocol):
    def next_boundary(self, step: int) -> Optional[int]:
        """The first step after ``step`` at which the inner loop must return (None: none)."""

    def __call__(self, step: int) -> None:
        """After an inner-loop call that trained up to ``step``."""

    def close(self) -> None:
        """At the end of the run, also after a failure."""


class Profiler:
    """Traces global steps START..END (``--profile_steps``) as whole calls into
    ``logs_dir/plugins/profile``; one profiler per process."""

    def __init__(self, steps: tuple[int, int], logs_dir: str,
                 before_write: Callable[[], None] = lambda: None):
        self.start, self.end = steps
        self.logs_dir = logs_dir
        self.before_write = before_write  # `trainer.run.claim.Claim.check`
        self.running = False

    def next_boundary(self, step: int) -> Optional[int]:
        later = [b for b in (self.start - 1, self.end) if b > step]
        return min(later) if later else None

    def __call__(self, step: int) -> None:
        if not self.running and self.start - 1 <= step < self.end:
            self.before_write()
            tf.profiler.experimental.start(self.logs_dir)
            self.running = True
        elif self.running and step >= self.end:
            self.close()
            log.info("profile of steps %d-%d in %s/plugins/profile", self.start, self.end,
                     self.logs_dir)

    def close(self) -> None:
        if self.running:
            tf.profiler.experimental.stop()
            self.running = False
