"""The request counters of `GcsBucket` (``tierfs stats``'s ``gcs`` section).

They are updated from the worker threads that run google-cloud-storage calls and read
from trio code, hence the lock; ``in_flight_peak`` is the most requests ever running at
once (what ``max-conns-per-host`` caps).
"""

from __future__ import annotations

import threading

from tierfs.storage import STAT_KEYS


class Counters:
    """Statistics shared by trio code and worker threads, hence the lock."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._values = dict.fromkeys(STAT_KEYS, 0)
        self._in_flight = 0

    def add(self, **increments: int) -> None:
        with self._lock:
            for key, value in increments.items():
                self._values[key] += value

    def enter(self) -> None:
        """A request's thread starts (for ``in_flight_peak``)."""
        with self._lock:
            self._in_flight += 1
            self._values["in_flight_peak"] = max(self._values["in_flight_peak"], self._in_flight)

    def leave(self) -> None:
        with self._lock:
            self._in_flight -= 1

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return dict(self._values)
