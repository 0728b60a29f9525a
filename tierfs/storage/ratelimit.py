"""gcsfuse's ``limit-ops-per-sec`` and ``limit-bytes-per-sec``: token buckets in front of GCS.

Each request takes one operation token before it is sent, and a read takes as many byte
tokens as it asks for. A bucket holds at most one second of its rate, so a burst after
a quiet spell is at most one second's worth (gcsfuse measures over 30 s and so lets a
longer burst through; tierfs is the stricter of the two). A request larger than the
bucket is let through once the bucket is full and leaves it in debt, so a 64 MiB read
under a 1 MiB/s limit waits for the reads after it, not for ever.

Time is trio's clock, so tests run on ``trio.testing.MockClock`` and never sleep.
"""

from __future__ import annotations

import math

import trio


class TokenBucket:
    """``rate`` tokens a second, at most ``rate`` held; ``rate`` <= 0 or inf: no limit (as
    in gcsfuse, where only a rate above 0 turns throttling on)."""

    def __init__(self, rate: float) -> None:
        self.rate = math.inf if rate <= 0 else float(rate)
        self.unlimited = not math.isfinite(self.rate)
        self._tokens = self.rate
        self._stamp: float | None = None
        self._lock = trio.Lock()  # first come, first served
        self.waited_s = 0.0  # total time requests spent waiting here (for statistics)
        self.waits = 0

    def _refill(self) -> None:
        now = trio.current_time()
        if self._stamp is not None:
            self._tokens = min(self.rate, self._tokens + (now - self._stamp) * self.rate)
        self._stamp = now

    async def take(self, amount: float = 1.0) -> None:
        if self.unlimited or amount <= 0:
            return
        async with self._lock:
            self._refill()
            need = min(amount, self.rate)  # larger than the bucket: wait until it is full
            if self._tokens < need:
                delay = (need - self._tokens) / self.rate
                self.waits += 1
                self.waited_s += delay
                await trio.sleep(delay)
                self._refill()
            self._tokens -= amount


class Throttle:
    """The two limits of one bucket: operations and bytes read."""

    def __init__(self, ops_per_s: float = -1, bytes_per_s: float = -1) -> None:
        self.ops = TokenBucket(ops_per_s)
        self.bytes = TokenBucket(bytes_per_s)

    async def admit(self, nbytes: int = 0) -> None:
        await self.ops.take(1)
        await self.bytes.take(nbytes)

    def statistics(self) -> dict[str, int]:
        return {
            "throttled": self.ops.waits + self.bytes.waits,
            "throttled_ms": round((self.ops.waited_s + self.bytes.waited_s) * 1000),
        }
