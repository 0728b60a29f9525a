"""`Slots`: at most N background jobs at once, in order, except one a request waits for.

Why not a `trio.CapacityLimiter`: the metadata prefetch lists a directory's subdirectories
ahead (up to 128 at once, `tierfs.core.lookups`), on the bet that a walker or a stat storm
comes to them. A limiter queues them first come, first served, so a lookup that needs one
of them *now* (the first `stat` in a cold bucket of 100 directories) waited for the
listings queued before its own: 233-455 ms for the first stat on the emulator, where each
listing took 4-5 ms (113-166 ms urged); on GCS, about 100 / 10 x one listing's time. A job
somebody waits for is *urged* here: it runs next, before the bets, and one slot is kept
for such jobs (when there are two or more), so it starts at once unless every slot
already runs one.

Jobs are named (a directory's path); `urge` may come before the job asks for its slot
(the lookup spawns the prefetch, then waits for it) and is forgotten when that job ends.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

import trio

MAX_URGED = 10_000  # names urged and not yet run that are remembered (bounds memory)


class Slots:
    """At most ``total`` jobs run at once; waiting jobs start in order, urged ones first."""

    def __init__(self, total: int) -> None:
        self.total = max(1, total)
        self._reserve = 1 if self.total > 1 else 0  # slots only urged jobs may take
        self.running = 0
        self.urged = 0  # jobs started as urged ones (stats; some would not have waited)
        self._waiting: dict[object, tuple[str, trio.Event]] = {}  # (in arrival order)
        self._urgent: set[str] = set()

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    @contextlib.asynccontextmanager
    async def slot(self, name: str) -> AsyncIterator[None]:
        """Hold a slot for the job ``name`` while in the block."""
        token = object()
        started = trio.Event()
        self._waiting[token] = (name, started)
        self._start()
        try:
            await started.wait()
        except BaseException:
            if self._waiting.pop(token, None) is None:  # given a slot meanwhile: pass it on
                self._end(name)
            raise
        try:
            yield
        finally:
            self._end(name)

    def urge(self, name: str) -> None:
        """A request waits for the job ``name``: it goes before every job not urged."""
        if len(self._urgent) >= MAX_URGED:
            self._urgent.clear()  # (names whose jobs never came; the jobs still run)
        self._urgent.add(name)
        self._start()

    def _end(self, name: str) -> None:
        self.running -= 1
        self._urgent.discard(name)
        self._start()

    def _start(self) -> None:
        """Give free slots to waiting jobs: urged ones in order, then the rest in order."""
        if self._urgent:
            for token, (name, started) in list(self._waiting.items()):
                if self.running >= self.total:
                    return
                if name in self._urgent:
                    self._run(token, started)
                    self.urged += 1
        for token, (_, started) in list(self._waiting.items()):
            if self.running >= self.total - self._reserve:
                return
            self._run(token, started)

    def _run(self, token: object, started: trio.Event) -> None:
        del self._waiting[token]
        self.running += 1
        started.set()
