"""The FUSE requests in flight, and a WARNING for each one that waits too long.

A request that waits on GCS (a mkdir against a run of 500s, a close whose upload
cannot reach the endpoint) blocks the process that made it, in D state, where
even SIGKILL waits. Its retries are bounded (``request-deadline-secs``), but
until the bound the user sees a frozen program and, at the default log level,
nothing. Here every request is registered while it runs (`track`), and `run`
logs a WARNING naming the operation, its path, how long it has waited and the
last thing GCS said, after ``logging:slow-request-secs`` and again each time as
long, so a frozen job's log says what it waits for.

Time comes from trio's clock, so tests drive it with a mock clock.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable
from dataclasses import dataclass

import trio

log = logging.getLogger("tierfs.fuse")


@dataclass
class _Request:
    op: str
    describe: Callable[[str, tuple[object, ...]], str]
    args: tuple[object, ...]
    started: float
    warn_at: float


class InFlight:
    """Requests being served; ``warn_after_s`` 0 keeps count only, never warns."""

    def __init__(self, warn_after_s: float, cause: Callable[[], str] = lambda: "") -> None:
        self.warn_after_s = warn_after_s
        self.cause = cause
        self.warnings = 0  # WARNINGs logged (tierfs stats: slow_request_warnings)
        self._requests: dict[int, _Request] = {}
        self._numbers = itertools.count()

    def begin(
        self, op: str, describe: Callable[[str, tuple[object, ...]], str], args: tuple[object, ...]
    ) -> int:
        """The request ``op`` with ``args`` is in flight until `end` with the number this
        returns. ``describe(op, args)`` names what it works on, called only for a warning.
        (Not a context manager: this runs for every request, creates included.)"""
        number = next(self._numbers)
        now = trio.current_time()
        self._requests[number] = _Request(op, describe, args, now, now + self.warn_after_s)
        return number

    def end(self, number: int) -> None:
        del self._requests[number]

    def __len__(self) -> int:
        return len(self._requests)

    def longest_wait_s(self) -> float:
        """How long the oldest request in flight has waited (0 with none)."""
        if not self._requests:
            return 0.0
        return trio.current_time() - min(r.started for r in self._requests.values())

    def check(self) -> None:
        """Warn about every request past its warning time, and set its next one."""
        now = trio.current_time()
        for request in list(self._requests.values()):
            if now < request.warn_at:
                continue
            request.warn_at = now + self.warn_after_s
            self.warnings += 1
            cause = self.cause()
            try:
                what = request.describe(request.op, request.args)
            except Exception as err:  # naming it must never break the watch
                what = f"(unnamed: {err})"
            log.warning(
                "%s %s: still waiting after %.0f s%s",
                request.op,
                what,
                now - request.started,
                f"; GCS last failed with: {cause}" if cause else "",
            )

    async def run(self) -> None:
        """Check a few times per warning interval, for ever (cancel to stop)."""
        if self.warn_after_s <= 0:
            return
        period = min(5.0, max(0.25, self.warn_after_s / 4))
        while True:
            await trio.sleep(period)
            self.check()
