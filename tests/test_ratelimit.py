"""limit-ops-per-sec / limit-bytes-per-sec: the token buckets, on trio's mock clock."""

from __future__ import annotations

import trio
import trio.testing
from hypothesis import given, settings
from hypothesis import strategies as st

from tierfs.storage.ratelimit import Throttle, TokenBucket


async def test_a_burst_of_one_second_then_the_rate(autojump_clock: trio.testing.MockClock) -> None:
    bucket = TokenBucket(10)
    start = trio.current_time()
    for _ in range(10):
        await bucket.take()
    assert trio.current_time() == start  # one second's worth goes at once
    for _ in range(20):
        await bucket.take()
    assert abs(trio.current_time() - start - 2.0) < 1e-6  # then 10 a second
    assert bucket.waits == 20


async def test_a_request_bigger_than_the_bucket_passes_and_leaves_debt(
    autojump_clock: trio.testing.MockClock,
) -> None:
    bucket = TokenBucket(1000)  # bytes a second
    start = trio.current_time()
    await bucket.take(5000)  # full bucket: through at once
    assert trio.current_time() == start
    await bucket.take(1000)  # waits out the 4,000-byte debt and its own 1,000
    assert abs(trio.current_time() - start - 5.0) < 1e-6


async def test_no_limit_never_waits(autojump_clock: trio.testing.MockClock) -> None:
    throttle = Throttle(-1, -1)
    start = trio.current_time()
    for _ in range(1000):
        await throttle.admit(1 << 30)
    assert trio.current_time() == start
    assert throttle.statistics() == {"throttled": 0, "throttled_ms": 0}


@settings(max_examples=30, deadline=None)
@given(
    rate=st.floats(min_value=0.5, max_value=1000),
    amounts=st.lists(st.floats(min_value=0.1, max_value=50), min_size=1, max_size=40),
)
def test_over_any_run_the_rate_is_kept(rate: float, amounts: list[float]) -> None:
    """Whatever is asked, n tokens take at least (n - one bucket) / rate seconds."""

    async def main() -> None:
        bucket = TokenBucket(rate)
        start = trio.current_time()
        for amount in amounts:
            await bucket.take(amount)
        elapsed = trio.current_time() - start
        taken_before_last = sum(amounts[:-1])
        assert elapsed >= (taken_before_last - rate) / rate - 1e-6
        assert elapsed <= (sum(amounts) + rate) / rate + 1e-6  # and no more than needed

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
