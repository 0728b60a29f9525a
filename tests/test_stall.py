"""The read-stall timeout (tierfs.storage.stall): bounds, moves, and where it settles."""

from __future__ import annotations

import math
import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tierfs.storage.stall import ReadStallSettings, StallTimeout

SETTINGS = ReadStallSettings()  # gcsfuse's defaults


@given(st.lists(st.one_of(st.none(), st.floats(0, 3000, allow_nan=False)), max_size=300))
def test_the_timeout_stays_within_its_bounds(events: list[float | None]) -> None:
    timeout = StallTimeout(SETTINGS)
    assert timeout.current() == 20.0
    for event in events:
        before = timeout.current()
        if event is None:
            timeout.stalled()
            assert timeout.current() >= before
        else:
            timeout.observe(event)
            assert (timeout.current() > before) == (event > before) or timeout.current() in (
                SETTINGS.min_s,
                SETTINGS.max_s,
            )
        assert SETTINGS.min_s <= timeout.current() <= SETTINGS.max_s


def test_a_stall_raises_it_by_e_to_one_over_the_rate() -> None:
    timeout = StallTimeout(SETTINGS)
    timeout.stalled()
    assert timeout.current() == pytest.approx(20.0 * math.exp(1 / 15))


def test_it_settles_where_the_target_share_of_reads_finish_within_it() -> None:
    """Reads taking 10-100 ms (uniform): at 0.9 the timeout settles near the 90th
    percentile, 91 ms, and about one read in ten is cut."""
    settings = ReadStallSettings(initial_s=1.0, min_s=0.001, target_percentile=0.9)
    timeout = StallTimeout(settings)
    draw = random.Random(7)
    cut = 0
    for i in range(200_000):
        latency = draw.uniform(0.010, 0.100)
        if i >= 100_000 and latency > timeout.current():
            cut += 1
        timeout.observe(latency)
    assert timeout.current() == pytest.approx(0.091, abs=0.01)
    assert cut / 100_000 == pytest.approx(0.1, abs=0.02)


@pytest.mark.parametrize(
    "bad",
    [
        {"min_s": 0},
        {"min_s": 5, "max_s": 1},
        {"increase_rate": 0},
        {"target_percentile": 1},
    ],
)
def test_settings_out_of_range_are_refused(bad: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        ReadStallSettings(**bad)
