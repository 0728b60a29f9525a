"""`MetadataCache` against a model: a dict of path -> (answer, expiry), with injected time.

The cache keeps its entries in LRU caches and checks each one's expiry when it is read
(cheaper per listed entry than a time-aware cache that expires on every call), so what
these properties guard is that the cheaper form still answers as the TTLs say: never an
expired answer, never an answer the mount replaced or forgot, the byte budget held, and
the statistics counting only what is live.
"""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tierfs.core import metacache
from tierfs.core.metacache import MetadataCache
from tierfs.core.namespace import MISSING, Found
from tierfs.storage import ObjectInfo

PATHS = ["a", "a/b", "a/b/c", "a/d", "e", "e/f"]
TTL, NEGATIVE_TTL = 60.0, 5.0


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def answer(kind: int, path: str, generation: int) -> Found | None:
    if kind == 0:
        return None  # "nothing there"
    if kind == 1:
        return Found(True)  # a directory (the type cache)
    return Found(False, ObjectInfo(path, generation, generation))


operation = st.one_of(
    st.tuples(st.just("put"), st.sampled_from(PATHS), st.integers(0, 2), st.integers(1, 9)),
    st.tuples(st.just("forget"), st.sampled_from(PATHS)),
    st.tuples(st.just("forget_below"), st.sampled_from(PATHS)),
    st.tuples(st.just("wait"), st.sampled_from([0.5, 4.0, 6.0, 59.0, 61.0])),
    st.tuples(st.just("get"), st.sampled_from(PATHS)),
)


def run(cache: MetadataCache, clock: Clock, ops: list[tuple], *, exact: bool) -> None:
    """Apply ``ops`` to the cache and the model; with ``exact`` (no budget in the way)
    every read must equal the model's, else a hit must still be the model's answer."""
    model: dict[str, tuple[Found | None, float]] = {}
    for op in ops:
        if op[0] == "put":
            _, path, kind, generation = op
            found = answer(kind, path, generation)
            cache.put(path, found)
            model[path] = (found, clock.now + (TTL if found is not None else NEGATIVE_TTL))
        elif op[0] == "forget":
            cache.forget(op[1])
            model.pop(op[1], None)
        elif op[0] == "forget_below":
            for path in [p for p in model if p == op[1] or p.startswith(op[1] + "/")]:
                del model[path]
            cache.forget_below(op[1])
        elif op[0] == "wait":
            clock.now += op[1]
        else:
            got = cache.get(op[1])
            kept = model.get(op[1])
            want = kept[0] if kept is not None and clock.now < kept[1] else MISSING
            if exact or got is not MISSING:
                assert got is want, (op, got, want)
    live = {path for path, (_, expiry) in model.items() if clock.now < expiry}
    stats = cache.statistics()
    if exact:
        assert stats["entries"] == len(live)
    assert stats["entries"] <= len(live)


@settings(max_examples=300, deadline=None)
@given(st.lists(operation, max_size=60))
def test_answers_as_the_model_with_no_budget_in_the_way(ops: list[tuple]) -> None:
    clock = Clock()
    cache = MetadataCache(ttl_s=TTL, negative_ttl_s=NEGATIVE_TTL, max_bytes=math.inf, clock=clock)
    run(cache, clock, ops, exact=True)


@settings(max_examples=300, deadline=None)
@given(st.lists(operation, max_size=60), st.integers(330, 1500), st.integers(330, 1500))
def test_a_small_budget_only_forgets_never_answers_wrong(
    ops: list[tuple], max_bytes: int, type_max_bytes: int
) -> None:
    clock = Clock()
    cache = MetadataCache(
        ttl_s=TTL,
        negative_ttl_s=NEGATIVE_TTL,
        max_bytes=max_bytes,
        type_max_bytes=type_max_bytes,
        clock=clock,
    )
    run(cache, clock, ops, exact=False)
    stats = cache.statistics()
    assert stats["used_bytes"] <= max_bytes and stats["type_used_bytes"] <= type_max_bytes


def test_nothing_expires_with_ttl_forever_and_negatives_off() -> None:
    """The checkpointing line (ttl-secs -1, negative-ttl-secs 0): kept for good."""
    clock = Clock()
    cache = MetadataCache(ttl_s=math.inf, negative_ttl_s=0, max_bytes=math.inf, clock=clock)
    cache.put("f", Found(False, ObjectInfo("f", 1, 1)))
    cache.put("gone", None)
    clock.now += 1e9
    assert cache.get("f") is not MISSING
    assert cache.get("gone") is MISSING
    assert cache.statistics()["entries"] == 1


def test_statistics_look_at_a_bounded_number_of_the_longest_stored(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A sweep of every entry took 417 ms at 1,000,000 entries, on the event loop, at every
    metrics scrape: `statistics` drops the expired among the `SWEEP_ENTRIES` stored
    longest ago; the rest go when read."""
    monkeypatch.setattr(metacache, "SWEEP_ENTRIES", 2)
    clock = Clock()
    cache = MetadataCache(ttl_s=TTL, negative_ttl_s=NEGATIVE_TTL, max_bytes=math.inf, clock=clock)
    for name in "abcde":
        cache.put(name, answer(2, name, 1))
    clock.now += TTL / 2
    cache.put("a", answer(2, "a", 2))  # stored again: now the last in store order
    clock.now += TTL / 2 + 1  # b-e expired, a not
    assert cache.statistics()["entries"] == 3  # b and c, the longest stored, swept
    assert cache.get("a") is not MISSING
    assert cache.get("e") is MISSING  # dropped when read
    assert cache.statistics()["entries"] == 1  # d swept, a live


def test_the_byte_budget_counts_what_an_entry_really_takes() -> None:
    """`stat-cache-max-size-mb` bounds memory only if an entry's estimate is what it takes:
    it was 320 bytes of overhead where Python spends ~760 (a 32 MiB cache held over 70 MiB).
    Measured with tracemalloc over entries shaped like a dataset's: within a fifth."""
    import tracemalloc

    count = 20_000
    cache = MetadataCache(ttl_s=60, negative_ttl_s=5, max_bytes=math.inf)
    estimated = 0
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for i in range(count):
            path = f"datasets/train/n{i:08d}/img_{i:08d}.JPEG"
            info = ObjectInfo(
                (path + "/")[:-1],  # its own string, as a listing's is
                100_000 + i,
                1_700_000_000_000_000 + i,
                1,
                1.7e9 + i,
                {"gcsfuse_mtime": "2024-01-01T00:00:00.123456789Z"},
                "image/jpeg",
                "AAAAAA==",
            )
            found = Found(False, info)
            cache.put(path, found)
            estimated += metacache._entry_bytes(path, found)
        taken = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert 0.8 <= estimated / taken <= 1.25, (estimated / count, taken / count)
