"""Listings made ahead of a warm walker (`tierfs.core.listahead.Walks`): the same tree
walked again within the metadata TTL, when no listing ahead is made for the stat cache's
sake, yet each readdir must list GCS again. Counted in GCS requests, with injected time
(no sleeps); speed is measured by `benchmarks` (meta: ``ls -lR``, warm)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import trio
import trio.testing
from hypothesis import given
from hypothesis import strategies as st

from tests.test_metadata import Clock, listdir
from tierfs.core.background import Background
from tierfs.core.filesystem import Filesystem, Settings
from tierfs.core.inodes import ROOT_INO
from tierfs.core.listahead import FRESH_S, MAX_WALK_NAMES, MAX_WALKS, WALK_GAP_S, Walks
from tierfs.core.lookups import CHILD_ENTRIES
from tierfs.storage.memory import MemoryBucket

DIRS = tuple(f"d{i:02}" for i in range(20))


def core_with_walks(
    bucket: MemoryBucket, tmp_path: Path, clock: Clock, nursery: trio.Nursery, **settings: Any
) -> Filesystem:
    """A core with a metadata TTL of 60 s (the default), background work in ``nursery``."""
    return Filesystem(
        bucket,
        Settings(temp_dir=str(tmp_path), metadata_ttl_s=60.0, **settings),
        monotonic_s=clock,
        background=Background(nursery),
    )


def lists(bucket: MemoryBucket) -> int:
    return bucket.statistics()["lists"]


def ahead(fs: Filesystem) -> int:
    used: int = fs.statistics()["directories"]["listed_ahead"]
    return used


async def test_a_warm_walk_finds_its_listings_made_ahead(tmp_path: Path) -> None:
    """Walked again within the TTL, forwards or backwards: each directory is listed once,
    and all but the first two subdirectories the walker goes into find their listing
    made ahead, whole (not one page, as a cold walk's ahead of a walker not yet seen).
    A single ``ls`` of a directory and then of one subdirectory is no walk: nothing is
    listed ahead of it."""
    bucket = MemoryBucket("walk")
    for d in DIRS:
        bucket.put(f"{d}/", b"")
        bucket.put(f"{d}/f", b"x")
    big = [f"g{i:04}" for i in range(CHILD_ENTRIES + 5)]  # more than a cold one lists ahead
    for name in big:
        bucket.put(f"d10/{name}", b"z")
    clock = Clock()
    async with trio.open_nursery() as nursery:
        fs = core_with_walks(bucket, tmp_path, clock, nursery)
        root = await listdir(fs, ROOT_INO)  # the cold walk: its subdirectories ahead
        for d in DIRS:
            assert "f" in await listdir(fs, root[d].ino)
        clock.now += FRESH_S + 1  # within the TTL: a warm walk

        for order in (DIRS, DIRS[::-1]):
            before, used = lists(bucket), ahead(fs)
            bucket.put(f"{order[-1]}/new", b"y")  # another client's, seen by the walk
            root = await listdir(fs, ROOT_INO)
            walked = {d: sorted(await listdir(fs, root[d].ino)) for d in order}
            await trio.testing.wait_all_tasks_blocked()
            assert walked == {
                **{d: ["f"] for d in DIRS},
                "d10": ["f", *big],
                order[-1]: ["f", "new"],
            }
            assert lists(bucket) - before == 1 + len(DIRS)  # each once
            assert ahead(fs) - used == len(DIRS) - 2
            await bucket.delete(f"{order[-1]}/new")
            clock.now += FRESH_S + 1

        clock.now += WALK_GAP_S + 1  # (the last walk is over)
        before = lists(bucket)
        await listdir(fs, ROOT_INO)
        await listdir(fs, root["d05"].ino)
        await trio.testing.wait_all_tasks_blocked()
        assert lists(bucket) - before == 2  # no walk: nothing ahead
        clock.now += WALK_GAP_S + 1
        await listdir(fs, root["d06"].ino)  # a second one, but long after: no walk either
        await trio.testing.wait_all_tasks_blocked()
        assert lists(bucket) - before == 3
        nursery.cancel_scope.cancel()


def test_a_walker_is_seen_at_its_second_subdirectory_and_never_listed_twice() -> None:
    walks = Walks(ahead=3)
    names = tuple("abcdefgh")
    walks.listed("p", names)
    assert walks.entering("p", "a", 0.0) == ()  # one ls is no walk
    assert walks.entering("p", "b", 1.0) == ("c", "d", "e")
    assert walks.entering("p", "c", 2.0) == ("d", "e", "f")  # a sliding window
    assert walks.entering("p", "h", 3.0) == ()  # the last: nothing after it
    assert walks.entering("p", "f", 4.0) == ("e", "d")  # backwards now (c, b, a visited)
    assert walks.entering("q", "a", 5.0) == ()  # a directory never listed
    assert walks.entering("p", "zz", 5.0) == ()  # a name the listing did not have
    walks.listed("p", names)  # listed again: a new walk
    assert walks.entering("p", "a", 6.0) == ()
    assert walks.entering("p", "b", 6.0 + WALK_GAP_S + 1) == ()  # too far apart
    walks.listed("p", ())
    assert len(walks) == 0


@given(
    st.lists(st.integers(min_value=0, max_value=29), max_size=80),
    st.integers(min_value=1, max_value=8),
)
def test_walks_name_only_unvisited_siblings_within_the_window(
    visits: list[int], window: int
) -> None:
    """Whatever order a walker goes in: each answer is at most the window, of siblings
    not yet gone into, next to the one entered."""
    walks = Walks(ahead=window)
    names = tuple(f"n{i:02}" for i in range(30))
    walks.listed("p", names)
    visited: set[int] = set()
    for step, at in enumerate(visits):
        visited.add(at)
        named = walks.entering("p", names[at], float(step))
        assert len(named) <= window
        assert len(set(named)) == len(named)
        for name in named:
            index = names.index(name)
            assert index not in visited
            assert 0 < abs(index - at) <= window


def test_walks_stay_within_their_bounds() -> None:
    walks = Walks()
    for i in range(MAX_WALKS + 10):
        walks.listed(f"d{i}", ("a", "b"))
    assert len(walks) == MAX_WALKS
    assert walks.entering("d0", "a", 0.0) == () and walks.entering("d0", "b", 0.0) == ()
    walks.listed("big", tuple(f"n{i}" for i in range(MAX_WALK_NAMES - 10)))
    assert len(walks) < 10  # the oldest dropped to make room for its names
    walks.listed("huge", tuple(f"n{i}" for i in range(MAX_WALK_NAMES + 1)))
    assert walks.entering("huge", "n0", 0.0) == () and walks.entering("huge", "n1", 0.0) == ()


async def test_without_the_metadata_prefetch_nothing_is_listed_ahead(tmp_path: Path) -> None:
    """``metadata-cache:enable-metadata-prefetch=false`` turns listing ahead off, a
    walker's too: each readdir lists GCS itself."""
    bucket = MemoryBucket("walk")
    for d in DIRS:
        bucket.put(f"{d}/f", b"x")
    async with trio.open_nursery() as nursery:
        fs = core_with_walks(bucket, tmp_path, Clock(), nursery, metadata_prefetch=False)
        for _walk in range(2):
            before = lists(bucket)
            root = await listdir(fs, ROOT_INO)
            for d in DIRS:
                assert sorted(await listdir(fs, root[d].ino)) == ["f"]
            await trio.testing.wait_all_tasks_blocked()
            assert lists(bucket) - before == 1 + len(DIRS)
        assert ahead(fs) == 0
        nursery.cancel_scope.cancel()


async def test_a_walker_lists_nothing_ahead_that_the_list_cache_keeps(tmp_path: Path) -> None:
    """With ``kernel-list-cache-ttl-secs``, a sibling whose listing is kept answers its
    readdir without GCS: a walker's window skips it instead of listing it again."""
    bucket = MemoryBucket("walk")
    for d in DIRS:
        bucket.put(f"{d}/f", b"x")
    clock = Clock()
    async with trio.open_nursery() as nursery:
        fs = core_with_walks(bucket, tmp_path, clock, nursery, list_ttl_s=30.0)
        root = await listdir(fs, ROOT_INO)
        await listdir(fs, root["d00"].ino)
        await listdir(fs, root["d01"].ino)
        clock.now += 20
        for d in DIRS[2:]:  # kept from now on, for 30 s
            await listdir(fs, root[d].ino)
        await trio.testing.wait_all_tasks_blocked()
        clock.now += 15  # the root's, d00's and d01's kept listings are too old now
        before = lists(bucket)
        root = await listdir(fs, ROOT_INO)
        await listdir(fs, root["d00"].ino)
        await listdir(fs, root["d01"].ino)  # a walk: its window is d02-d17, all kept
        await trio.testing.wait_all_tasks_blocked()
        assert lists(bucket) - before == 3
        nursery.cancel_scope.cancel()
