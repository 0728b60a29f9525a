"""`tierfs.fuse.collector`: the pauses of Python's collector, timed with an injected clock,
and the freeze of what the daemon made at startup."""

from __future__ import annotations

import gc

from hypothesis import given
from hypothesis import strategies as st

from tierfs.fuse.collector import Collections


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_each_collection_is_counted_by_generation_with_its_pause() -> None:
    clock = Clock()
    seen = Collections(clock)
    for generation, pause in ((0, 0.001), (2, 0.030), (0, 0.002)):
        seen("start", {"generation": generation})
        clock.now += pause
        seen("stop", {"generation": generation, "collected": 0, "uncollectable": 0})
    stats = seen.statistics()
    assert stats["collections"] == [2, 0, 1]
    assert abs(stats["paused_s"] - 0.033) < 1e-9
    assert stats["longest_pause_s"] == 0.03


def test_a_stop_without_its_start_is_not_timed() -> None:
    """Installed during a collection: its stop comes without a start."""
    clock = Clock()
    seen = Collections(clock)
    seen("stop", {"generation": 2})
    assert seen.statistics()["collections"] == [0, 0, 0]
    assert seen.paused_s == 0


@given(st.lists(st.tuples(st.integers(0, 2), st.floats(0, 1)), max_size=30))
def test_pauses_add_up_and_the_longest_is_one_of_them(
    collections: list[tuple[int, float]],
) -> None:
    clock = Clock()
    seen = Collections(clock)
    for generation, pause in collections:
        seen("start", {"generation": generation})
        clock.now += pause
        seen("stop", {"generation": generation})
    assert sum(seen.counts) == len(collections)
    pauses = [pause for _, pause in collections]
    assert abs(seen.paused_s - sum(pauses)) < 1e-6
    assert seen.longest_s <= seen.paused_s + 1e-9
    if collections:
        assert min(abs(seen.longest_s - p) for p in pauses) < 1e-6


def test_installed_it_sees_real_collections_and_removed_it_does_not() -> None:
    seen = Collections().install()
    try:
        seen.install()  # (once only)
        assert gc.callbacks.count(seen) == 1
        gc.collect()
        assert seen.counts[2] >= 1 and seen.longest_s > 0
    finally:
        seen.remove()
    counted = list(seen.counts)
    gc.collect()
    assert seen.counts == counted and seen not in gc.callbacks


def test_freeze_keeps_what_is_alive_out_of_collections() -> None:
    """Run in a child (freezing would keep the test process's objects forever)."""
    import json
    import subprocess
    import sys

    code = (
        "import gc, json\n"
        "from tierfs.fuse.collector import freeze_startup\n"
        "kept = [[i] for i in range(50_000)]\n"
        "frozen = freeze_startup()\n"
        "print(json.dumps([frozen, len(gc.get_objects())]))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    frozen, tracked = json.loads(out.stdout)
    assert frozen >= 50_000 and tracked < 1_000, (frozen, tracked)
