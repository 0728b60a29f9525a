"""Where the mount's background tasks run: fills, prefetches, uploads, renames, listings.

The core is built before the mount's nursery exists (the FUSE adapter and the metrics
server need it first), and a core driven by a test may have none at all. So the core
gets this object at construction, and the composition root attaches a nursery for as
long as the mount runs (`attached`). Until then `running` is False and the core does
the work in the request itself, or not at all (a prefetch), instead of starting a task.

A task that raises (exception groups included) is logged at ERROR with its traceback
and counted (`errors`, in ``tierfs stats``); it never reaches the nursery, which would
end the daemon and the mount with it. Tasks handle their own expected failures; this
is the net under the ones nobody expected.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Awaitable, Callable, Iterator

import trio

from tierfs.errors import root_cause

log = logging.getLogger("tierfs.fs")

Spawn = Callable[..., None]  # start a background task: spawn(async_fn, *args)


class Background:
    """The mount's spawner: ``spawn(fn, *args)`` runs ``fn(*args)`` in the attached nursery."""

    def __init__(self, nursery: trio.Nursery | None = None) -> None:
        self._nursery = nursery
        self.errors = 0  # tasks that failed with an error nobody expected

    @property
    def running(self) -> bool:
        """A nursery is attached: `spawn` may be called."""
        return self._nursery is not None

    @contextlib.contextmanager
    def attached(self, nursery: trio.Nursery | None) -> Iterator[None]:
        """Run tasks in ``nursery`` inside the block (None: none may start)."""
        before, self._nursery = self._nursery, nursery
        try:
            yield
        finally:
            self._nursery = before

    def spawn(self, fn: Callable[..., Awaitable[object]], *args: object) -> None:
        """Start ``fn(*args)`` in the background. Only while `running`."""
        if self._nursery is None:
            raise RuntimeError("no background tasks can start: the mount is not running")
        name = getattr(fn, "__qualname__", repr(fn))

        async def guarded() -> None:
            try:
                await fn(*args)
            except Exception as err:
                log.error("background task %s failed: %s", name, root_cause(err), exc_info=err)
                self.errors += 1

        self._nursery.start_soon(guarded, name=name)

    def spawner(self) -> Spawn | None:
        """`spawn` while running, else None (for parts that take a plain callable)."""
        return self.spawn if self._nursery is not None else None
