"""FUSE INTERRUPT handling (tierfs.fuse.interrupts) without a mount: which interrupts cancel."""

from __future__ import annotations

import errno
import os
import subprocess

import pyfuse3
import pytest
import trio
import trio.testing

from tierfs.fuse.interrupts import Interrupts, dying


@pytest.mark.parametrize(
    ("ignore", "caller_dying", "cancelled"),
    [(True, False, False), (True, True, True), (False, False, True)],
)
def test_an_interrupt_cancels_when_the_caller_dies_or_interrupts_are_not_ignored(
    monkeypatch: pytest.MonkeyPatch, ignore: bool, caller_dying: bool, cancelled: bool
) -> None:
    """gcsfuse's ignore-interrupts (true) lets a signal pass; a dying caller is let go
    either way; an interrupt of another request, or of one that ended, does nothing."""
    monkeypatch.setattr(pyfuse3, "current_request", lambda: (77, 1234), raising=False)
    interrupts = Interrupts(ignore=ignore, is_dying=lambda pid: pid == 1234 and caller_dying)
    outcome: list[object] = []

    async def stalled() -> str:
        await trio.sleep(60)
        return "answered"

    async def main() -> None:
        async def request() -> None:
            try:
                outcome.append(await interrupts.run("getattr", stalled, (), {}))
            except pyfuse3.FUSEError as err:
                outcome.append(err.errno)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(request)
            await trio.sleep(1)
            interrupts.interrupted(76)  # another request: nothing
            interrupts.interrupted(77)
        interrupts.interrupted(77)  # ended: nothing

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    assert outcome == ([errno.EINTR] if cancelled else ["answered"])
    assert interrupts.cancelled == int(cancelled)


def test_dying_means_gone_or_killed() -> None:
    assert not dying(os.getpid())
    done = subprocess.Popen(["true"])
    done.wait()
    assert dying(done.pid)
