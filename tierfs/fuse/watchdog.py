"""The FUSE requests in flight, and a WARNING for each one that waits too long.

A request that waits on GCS (a mkdir against a run of 500s, a close whose upload
cannot reach the endpoint) blocks the process that made it, in D state, where
even SIGKILL waits. Its retries are bounded (``request-deadline-secs``), but
until the bound the user sees a frozen program and, at the default log level,
nothing. Here every request is registered while it runs (`track`), and `run`
logs a WARNING naming the operation, its path, how long it has waited and the
last thing GCS said, after ``logging:slow-request-secs`` and again each time as
long, so a frozen job's log says what it waits for.

It also keeps, per operation, how many ran, how many failed and a histogram of
how long they took (`OpLatency`): what the Prometheus endpoint serves as gcsfuse's
``fs_ops_count``, ``fs_ops_error_count`` and ``fs_ops_latency``.

Time comes from trio's clock, so tests drive it with a mock clock.
"""

from __future__ import annotations

import bisect
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


# Upper bounds of the latency buckets, in seconds (the last one is +Inf).
LATENCY_BOUNDS_S = (
    0.0001, 0.0005, 0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0, 60.0, float("inf")
)  # fmt: skip


@dataclass
class OpLatency:
    """One operation's count, failures, and time taken: ``buckets[i]`` counts the
    requests that took at most ``LATENCY_BOUNDS_S[i]`` and more than the bound before."""

    count: int = 0
    errors: int = 0
    total_s: float = 0.0

    def __post_init__(self) -> None:
        self.buckets = [0] * len(LATENCY_BOUNDS_S)

    def copy(self) -> OpLatency:
        twin = OpLatency(self.count, self.errors, self.total_s)
        twin.buckets = list(self.buckets)
        return twin

    def add(self, seconds: float, failed: bool) -> None:
        self.count += 1
        self.errors += failed
        self.total_s += seconds
        self.buckets[bisect.bisect_left(LATENCY_BOUNDS_S, seconds)] += 1


class InFlight:
    """Requests being served; ``warn_after_s`` 0 keeps count only, never warns."""

    def __init__(self, warn_after_s: float, cause: Callable[[], str] = lambda: "") -> None:
        self.warn_after_s = warn_after_s
        self.cause = cause
        self.warnings = 0  # WARNINGs logged (tierfs stats: slow_request_warnings)
        self._requests: dict[int, _Request] = {}
        self._numbers = itertools.count()
        self.ops: dict[str, OpLatency] = {}  # per operation, since the mount

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

    def end(self, number: int, failed: bool = False) -> None:
        request = self._requests.pop(number)
        self.answered(request.op, trio.current_time() - request.started, failed)

    def answered(self, op: str, seconds: float, failed: bool = False) -> None:
        """Count a request of ``op`` answered in ``seconds`` (`end`, or a request answered
        at once, which is never in flight)."""
        latency = self.ops.get(op)
        if latency is None:
            latency = self.ops[op] = OpLatency()
        latency.add(seconds, failed)

    def __len__(self) -> int:
        return len(self._requests)

    def latencies(self) -> dict[str, OpLatency]:
        """A copy of the per-operation counts, safe to read from another thread."""
        return {op: seen.copy() for op, seen in self.ops.items()}

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
