"""The slow-request watch (tierfs.fuse.watchdog) on trio's mock clock: no real waiting."""

from __future__ import annotations

import logging

import pytest
import trio
import trio.testing

from tierfs.fuse.watchdog import InFlight


def named(op: str, args: tuple[object, ...]) -> str:
    return f"/dir/{args[0]}"


def test_a_slow_request_is_named_once_per_interval_until_it_ends(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, "tierfs.fuse")
    inflight = InFlight(30, lambda: "HTTP 500 Internal Server Error")

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(inflight.run)
            quick = inflight.begin("getattr", named, ("fast",))
            slow = inflight.begin("mkdir", named, ("stuck",))
            await trio.sleep(5)
            inflight.end(quick)
            assert inflight.warnings == 0 and len(inflight) == 1
            await trio.sleep(30)  # 35 s in: past the first interval
            assert inflight.warnings == 1
            assert inflight.longest_wait_s() == pytest.approx(35, abs=0.01)
            await trio.sleep(30)  # and the next
            assert inflight.warnings == 2
            inflight.end(slow)
            await trio.sleep(120)
            assert inflight.warnings == 2 and len(inflight) == 0
            assert inflight.longest_wait_s() == 0
            nursery.cancel_scope.cancel()

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2
    assert lines[0].startswith("mkdir /dir/stuck: still waiting after 3")
    assert lines[0].endswith("; GCS last failed with: HTTP 500 Internal Server Error")


def test_zero_turns_the_warnings_off_and_a_failing_name_never_breaks_the_watch(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, "tierfs.fuse")

    def broken(op: str, args: tuple[object, ...]) -> str:
        raise KeyError("gone")

    async def main() -> None:
        off = InFlight(0)
        off.begin("read", named, (1,))
        await off.run()  # returns at once: nothing to watch for
        watched = InFlight(1)
        watched.begin("read", broken, (1,))
        await trio.sleep(2)
        watched.check()
        assert watched.warnings == 1

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    assert [r.getMessage() for r in caplog.records] == [
        "read (unnamed: 'gone'): still waiting after 2 s"
    ]
