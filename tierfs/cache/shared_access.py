"""`Access`: the shared tier's file operations, each in a worker thread within a time bound.

A shared directory fails in ways a local disk does not: the filesystem is not mounted
(the directory is missing), the server is slow or gone (a call hangs for minutes), it
is full or exported read-only. None of that may reach the user or slow the mount
down: the tier steps aside. `Access.run` runs one blocking call in a worker thread
(abandoned if it outlives the bound: a hung NFS call cannot be interrupted, only left
to finish alone, and the limiter bounds how many can be left) and turns a failure
into `Unavailable` after deciding what it means:

- slow beyond ``io_timeout_s``, or an outage errno (EIO, ENOTCONN, ESTALE but on one
  block's files, a missing directory): no I/O at all for ``retry_s`` (`usable` is
  False; every get a miss);
- full or read-only (ENOSPC, EDQUOT, EROFS, EACCES) on a write: no writes for
  ``retry_s`` (`writable` is False), reads go on;
- anything else: counted, and that one call is a miss.

The first time the tier steps aside is a WARNING, later times DEBUG (one line tells a
user as much as thousands), the return INFO.
"""

from __future__ import annotations

import errno
import logging
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import trio

log = logging.getLogger("tierfs.cache")

_OUTAGE = {errno.EIO, errno.ENOTCONN, errno.ESTALE, errno.ETIMEDOUT, errno.EHOSTDOWN, errno.ENOENT}
_NO_WRITES = {errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM}
_WRITES = ("store", "claim", "open")
# Calls on one block's files: ESTALE there is another node's eviction, replacement or
# delete of a file this node had open (NFS keeps an unlinked file for its own client
# only), one miss; it stepped the whole tier aside for ``retry_s`` on every node that
# lost such a race, as ordinary between nodes as evictions are.
_ONE_FILE = ("read", "claim", "delete", "evict")
# A listing of a large share outlasting its bound is not an outage: reads went on fine,
# but the tier stepped aside for them too (and eviction never finished).
_LISTINGS = ("scan", "evict")
T = TypeVar("T")


class Unavailable(Exception):
    """The shared directory cannot be used for this call (already said and counted)."""


class Access:
    """Bounded, failure-classifying calls into one shared directory (see the module)."""

    def __init__(
        self,
        directory: Path,
        *,
        limiter: trio.CapacityLimiter | None,
        io_timeout_s: float,
        retry_s: float,
    ) -> None:
        self.directory = directory
        self.limiter = limiter
        self.io_timeout_s = io_timeout_s
        self.retry_s = retry_s
        self._down_until = -math.inf  # trio time: no I/O at all before it
        self._no_writes_until = -math.inf  # trio time: no writes before it
        self._warned = False
        self._slow_listing = False  # (said once as a warning)
        self.errors = 0
        self.outages = 0

    def usable(self) -> bool:
        return trio.current_time() >= self._down_until

    def writable(self) -> bool:
        return trio.current_time() >= self._no_writes_until

    def down(self) -> bool:
        """Stepped aside now (for statistics; callable outside trio too)."""
        try:
            return not self.usable()
        except RuntimeError:
            return False

    async def run(
        self, what: str, fn: Callable[..., T], *args: Any, timeout_s: float | None = None
    ) -> T:
        """``fn(*args)`` in a worker thread within the bound; `Unavailable` if it fails."""
        bound = self.io_timeout_s if timeout_s is None else timeout_s
        try:
            with trio.fail_after(bound):
                result = await trio.to_thread.run_sync(
                    fn, *args, limiter=self.limiter, abandon_on_cancel=True
                )
        except trio.TooSlowError:
            self.errors += 1
            if what in _LISTINGS:
                log.log(
                    logging.DEBUG if self._slow_listing else logging.WARNING,
                    "shared cache %s: listing it took over %g s; eviction waits for the next",
                    self.directory,
                    bound,
                )
                self._slow_listing = True
            else:
                self._step_aside(what, f"no answer within {bound:g} s", writes_only=False)
            raise Unavailable from None
        except OSError as exc:
            self.errors += 1
            if exc.errno == errno.ESTALE and what in _ONE_FILE:
                log.debug("shared cache: %s raced another node: %s", what, exc)
            elif exc.errno in _NO_WRITES and what in _WRITES:
                self._step_aside(what, str(exc), writes_only=what != "open")
            elif exc.errno in _OUTAGE or what == "open":
                self._step_aside(what, str(exc), writes_only=False)
            else:
                log.debug("shared cache: %s failed: %s", what, exc)
            raise Unavailable from None
        if self._down_until > -math.inf and self.usable():
            log.info("shared cache %s: usable again", self.directory)
            self._down_until = -math.inf
        return result

    def _step_aside(self, what: str, why: str, *, writes_only: bool) -> None:
        until = trio.current_time() + self.retry_s
        if writes_only:
            self._no_writes_until = until
        else:
            self._down_until = until
            self.outages += 1
        log.log(
            logging.DEBUG if self._warned else logging.WARNING,
            "shared cache %s: cannot %s (%s); %s for %g s, reads go to %s",
            self.directory,
            what,
            why,
            "no new blocks stored" if writes_only else "not used",
            self.retry_s,
            "the shared cache and GCS" if writes_only else "the local tiers and GCS",
        )
        self._warned = True
