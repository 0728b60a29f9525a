"""The write-back uploader: a queue of files waiting for GCS, a few workers, retries.

Why a piece of its own: the queueing policy does not depend on how a file is
uploaded, and it is where write-back's promises live:

- a file is queued at most once, however often it is closed (a key per file);
- a file written and committed again while its upload ran is queued again when
  that upload ends (``again``), so the last version always goes up;
- a failed upload is tried again after ``retry_s``, doubling up to five minutes,
  without holding a worker while it waits;
- ``idle()`` says when nothing is queued, running or waiting for a retry, which is
  what ``tierfs sync`` and unmount wait for;
- uploads yield to a save in progress: a worker starts an upload only once no file
  is open for writing (``writing()``) and the writers have been quiet for
  ``QUIET_S`` (`busy` marks them), or after it has waited ``MAX_YIELD_S``. An
  upload is a few ms of CPU in the GCS client, and on a 2-core machine uploads
  running beside a save of small files cut it from 640 to 170 files/s; the
  save, not the upload, is what training waits for.

The filesystem gives it ``attempt(item) -> bool`` (False: try again later) and
``again(item) -> bool``.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Awaitable, Callable
from typing import Generic, TypeVar

import trio

T = TypeVar("T")

MAX_RETRY_S = 300.0
QUIET_S = 0.1
MAX_YIELD_S = 5.0

log = logging.getLogger("tierfs.fs")


class Uploader(Generic[T]):
    def __init__(
        self,
        attempt: Callable[[T], Awaitable[bool]],
        again: Callable[[T], bool],
        writing: Callable[[], bool] = lambda: False,
    ) -> None:
        self._attempt = attempt
        self._again = again
        self._writing = writing
        self._send, self._receive = trio.open_memory_channel[tuple[int, T]](math.inf)
        self._queued: set[int] = set()  # waiting for a worker, or for a retry
        self._running = 0
        self._nursery: trio.Nursery | None = None
        self._last_busy = -math.inf  # trio.current_time() of the last write-path call

    def busy(self) -> None:
        """A writer did something (create, close...): uploads hold back for a moment."""
        self._last_busy = trio.current_time()

    async def _yield_to_writers(self) -> None:
        start = trio.current_time()
        while True:
            now = trio.current_time()
            if now - start >= MAX_YIELD_S:
                return
            if self._writing():
                self._last_busy = now
            quiet_until = self._last_busy + QUIET_S
            if now >= quiet_until:
                return
            await trio.sleep(min(quiet_until, start + MAX_YIELD_S) - now)

    def queue(self, key: int, item: T, delay_s: float = 0.0) -> None:
        """Queue ``item`` (after ``delay_s``, once the uploader runs) unless it is queued."""
        if key in self._queued:
            return
        self._queued.add(key)
        if delay_s > 0 and self._nursery is not None:
            self._nursery.start_soon(self._later, key, item, delay_s)
        else:
            self._send.send_nowait((key, item))

    @property
    def running(self) -> bool:
        """Whether workers are taking items (`run` is under way)."""
        return self._nursery is not None

    def idle(self) -> bool:
        """No upload queued, running or waiting to be retried."""
        return not self._queued and not self._running

    def waiting(self) -> int:
        return len(self._queued)

    async def run(self, workers: int, retry_s: float = 5.0) -> None:
        """Upload until cancelled, ``workers`` at a time."""
        delays: dict[int, float] = {}

        async def worker() -> None:
            async for key, item in self._receive:
                await self._yield_to_writers()
                self._running += 1
                try:
                    done = await self._attempt(item)
                except Exception as err:  # (exception groups too) a local fault, say the
                    # journal's disk gone read-only: retried, never the end of the daemon
                    log.error("write-back: background work failed, will retry: %s", err)
                    done = False
                finally:
                    self._running -= 1
                if done:
                    self._queued.discard(key)
                    delays.pop(key, None)
                    if self._again(item):
                        self.queue(key, item)
                    continue
                delay = delays[key] = min(delays.get(key, retry_s / 2) * 2, MAX_RETRY_S)
                nursery.start_soon(self._later, key, item, delay)

        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                for _ in range(max(1, workers)):
                    nursery.start_soon(worker)
        finally:
            self._nursery = None

    async def _later(self, key: int, item: T, delay_s: float) -> None:
        await trio.sleep(delay_s)
        self._send.send_nowait((key, item))  # in _queued all along: nobody else queued it
