"""FUSE INTERRUPT: a caller killed while its request waits on GCS is let go.

A process waiting in a FUSE request sleeps in the kernel where even SIGKILL waits
for the daemon's answer: a `cat` of a file whose download stalls, killed, stays in
D state until the download ends. What the kernel does for it is send INTERRUPT,
naming the request. The patched pyfuse3 (deploy/pyfuse3) tells each handler the
id of its request and calls `Interrupts.interrupted` with the id an INTERRUPT
names; here the request's work is cancelled and the kernel answered EINTR.

Which requests: only those that change nothing (`tierfs.fuse.operations.ABANDONABLE`:
lookups, attributes, listings, reads), so an answer in the middle leaves nothing
half done. The others (writes, creates, renames, closes that upload...) run to
their end, bounded by their GCS deadlines (docs/semantics.md).

When: gcsfuse's ``file-system:ignore-interrupts`` (true by default) means an
ordinary signal does not cancel an operation, so a program whose SIGCHLD or
SIGWINCH interrupts a read gets its bytes, not EINTR. A caller that is dying
(SIGKILL pending, or already gone) is let go either way: nobody will read the
answer. With ``ignore-interrupts=false`` every interrupt of such a request
cancels it, as gcsfuse does.
"""

from __future__ import annotations

import errno
import logging
import signal
from collections.abc import Awaitable, Callable
from typing import Any

import pyfuse3
import trio

log = logging.getLogger("tierfs.fuse")

_SIGKILL_BIT = 1 << (signal.SIGKILL - 1)


def dying(pid: int) -> bool:
    """Whether process (or thread) ``pid`` has a SIGKILL pending or is gone."""
    try:
        with open(f"/proc/{pid}/status", encoding="ascii", errors="replace") as status:
            for line in status:
                if line.startswith(("SigPnd:", "ShdPnd:")) and int(line.split()[1], 16) & (
                    _SIGKILL_BIT
                ):
                    return True
    except (OSError, ValueError, IndexError):
        return True  # no such process any more
    return False


class Interrupts:
    """The abandonable requests running now, by the kernel's request id."""

    def __init__(self, *, ignore: bool, is_dying: Callable[[int], bool] = dying) -> None:
        self.ignore = ignore
        self.is_dying = is_dying
        self.cancelled = 0  # requests answered EINTR (tierfs stats: requests interrupted)
        self._running: dict[int, tuple[trio.CancelScope, str, int]] = {}

    async def run(
        self,
        op: str,
        fn: Callable[..., Awaitable[Any]],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> Any:
        """``fn(*args, **kwargs)`` for request ``op``, cancelled by an `interrupted` of its
        request id: then `pyfuse3.FUSEError` EINTR. Must be called at the handler's start,
        before any await (the request id is pyfuse3's current one only until then)."""
        unique, pid = pyfuse3.current_request()  # type: ignore[attr-defined]
        with trio.CancelScope() as scope:
            self._running[unique] = (scope, op, pid)
            try:
                return await fn(*args, **kwargs)
            finally:
                self._running.pop(unique, None)
        raise pyfuse3.FUSEError(errno.EINTR)  # only reached when cancelled

    def interrupted(self, unique: int) -> None:
        """The kernel interrupted request ``unique`` (its caller got a signal)."""
        running = self._running.get(unique)
        if running is None:
            return  # answered already, or one that runs to its end
        scope, op, pid = running
        if self.ignore and not self.is_dying(pid):
            log.debug("%s of pid %d interrupted by a signal: carried on", op, pid)
            return
        self.cancelled += 1
        log.info("%s of pid %d interrupted: answered EINTR", op, pid)
        scope.cancel()
