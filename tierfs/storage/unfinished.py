"""Requests that change GCS, and the unmount that may let go of them.

A request that changes GCS (an upload, a delete, a copy) is waited for when its caller
is cancelled: the caller must know whether it happened. At an unmount with write-back,
though, once GCS has stopped answering, every pending change is in the journal, and
waiting for a request that is still retrying (up to its deadline, 120 s by default)
only holds the exit: the next mount does it again from the journal. `Unfinished.let_go`
lets such requests go: their callers get a `BackendError` at once, and their worker
threads end alone within their HTTP timeouts (trio's worker threads are daemon threads:
the process does not wait for them).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TypeVar

import trio

from tierfs.errors import BackendError

T = TypeVar("T")


class Unfinished:
    """The shielded scopes of the requests in flight that change GCS."""

    def __init__(self) -> None:
        self._scopes: set[trio.CancelScope] = set()
        self._letting_go = False

    async def run(self, request: Callable[[], Awaitable[T]], what: str) -> T:
        """``request()`` (a worker thread abandoned on cancel), shielded from its caller's
        cancellation as an unabandoned thread would be; cut only by `let_go`."""
        with trio.CancelScope(shield=True) as scope:
            self._scopes.add(scope)
            if self._letting_go:
                scope.cancel()
            try:
                return await request()
            finally:
                self._scopes.discard(scope)
        raise BackendError(f"{what}: let go unfinished at unmount (GCS is not answering)")

    def let_go(self) -> None:
        """From now on, changes in flight and new ones fail at once (an unmount's end)."""
        self._letting_go = True
        for scope in self._scopes:
            scope.cancel()
