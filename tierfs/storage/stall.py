"""The read-stall timeout: how long a read may wait for GCS before it is cut and retried.

GCS answers most reads in tens of milliseconds, and now and then one stalls for
tens of seconds (a slow replica, a dropped connection nobody noticed). A fixed
timeout is either too short for the slow tail of healthy reads or far too long
for a stall. gcsfuse (``gcs-retries:read-stall:*``) keeps a timeout that follows
the reads it sees, and so does tierfs, with the same options and meaning:

- it starts at ``initial-req-timeout`` and stays within ``min-req-timeout`` and
  ``max-req-timeout``;
- every read that took longer than the timeout (or was cut by it) raises the
  timeout by a factor e^(1/rate); every read within it lowers it by a smaller
  factor, chosen so that the timeout settles where a fraction
  ``req-target-percentile`` of reads finish within it (at 0.99, one read in a
  hundred is cut and retried).

The timeout applies to the wait for the response's head and to every wait for
more of its body, so a stream that stops midway is cut too. One instance is
shared by the worker threads of a bucket, hence the lock.
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass


@dataclass(frozen=True)
class ReadStallSettings:
    """gcsfuse's ``gcs-retries:read-stall:*`` options, in seconds."""

    enabled: bool = True
    initial_s: float = 20.0
    min_s: float = 1.5
    max_s: float = 1200.0
    increase_rate: float = 15.0
    target_percentile: float = 0.99

    def __post_init__(self) -> None:
        if not 0 < self.min_s <= self.max_s:
            raise ValueError(f"read-stall timeouts need 0 < min <= max: {self.min_s}, {self.max_s}")
        if self.increase_rate <= 0:
            raise ValueError(f"read-stall increase rate must be > 0: {self.increase_rate}")
        if not 0 < self.target_percentile < 1:
            raise ValueError(f"read-stall percentile must be in (0, 1): {self.target_percentile}")


class StallTimeout:
    """The current read-stall timeout (`current`), moved by what reads took (`observe`)."""

    def __init__(self, settings: ReadStallSettings) -> None:
        self.settings = settings
        self._up = math.exp(1 / settings.increase_rate)
        p = settings.target_percentile
        # up^(1-p) * down^p == 1: at the target percentile the two moves balance.
        self._down = math.exp(-(1 - p) / (p * settings.increase_rate))
        self._lock = threading.Lock()
        self._timeout = self._clamp(settings.initial_s)

    def _clamp(self, value: float) -> float:
        return min(self.settings.max_s, max(self.settings.min_s, value))

    def current(self) -> float:
        with self._lock:
            return self._timeout

    def observe(self, seconds: float) -> None:
        """A read (its head, or a wait for more body) took ``seconds``."""
        with self._lock:
            factor = self._up if seconds > self._timeout else self._down
            self._timeout = self._clamp(self._timeout * factor)

    def stalled(self) -> None:
        """A read was cut by the timeout."""
        self.observe(math.inf)
