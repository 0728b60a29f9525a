"""The metadata cache, counted in GCS requests, with injected time (no test sleeps)."""

from __future__ import annotations

import errno
import os
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

from tierfs.core.background import Background
from tierfs.core.filesystem import Filesystem, Settings
from tierfs.core.inodes import ROOT_INO, Inode, Kind
from tierfs.core.listahead import FRESH_S, MAX_ENTRIES, ListedAhead
from tierfs.core.lookups import LISTING_WAIT_S, ListingUnderWay
from tierfs.core.metacache import PRUNE_AT, MetadataCache
from tierfs.core.namespace import MISSING, DirListing, Found
from tierfs.errors import NotFound, PreconditionFailed, errno_of
from tierfs.storage import Listing, ObjectInfo
from tierfs.storage.memory import MemoryBucket


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def make(tmp_path: Path, **settings: object) -> tuple[Filesystem, MemoryBucket, Clock]:
    bucket = MemoryBucket("meta")
    clock = Clock()
    fs = Filesystem(bucket, Settings(temp_dir=str(tmp_path), **settings), monotonic_s=clock)
    return fs, bucket, clock


def requests(bucket: MemoryBucket) -> int:
    return bucket.statistics()["requests"]


async def read(fs: Filesystem, name: str) -> bytes:
    ino = (await fs.lookup(ROOT_INO, name)).ino
    handle = await fs.open(ino, os.O_RDONLY)
    try:
        return bytes(await fs.read(handle.fh, 0, 1 << 20))
    finally:
        await fs.release(handle.fh)


async def test_lookup_within_ttl_makes_no_request(tmp_path: Path) -> None:
    fs, bucket, clock = make(tmp_path, metadata_ttl_s=60.0)
    bucket.put("f", b"v1")
    await fs.lookup(ROOT_INO, "f")
    before = requests(bucket)
    for _ in range(5):
        clock.now += 10  # 50 s in all: within the TTL
        await fs.lookup(ROOT_INO, "f")
    assert requests(bucket) == before


async def test_new_bytes_once_the_ttl_has_passed(tmp_path: Path) -> None:
    fs, bucket, clock = make(tmp_path, metadata_ttl_s=60.0)
    bucket.put("f", b"v1")
    assert await read(fs, "f") == b"v1"
    bucket.put("f", b"v2, longer")
    clock.now += 59
    with pytest.raises(PreconditionFailed):  # cached metadata names generation 1, now gone
        await read(fs, "f")
    clock.now += 2
    assert await read(fs, "f") == b"v2, longer"


async def test_negative_entry_until_it_expires(tmp_path: Path) -> None:
    fs, bucket, clock = make(tmp_path, negative_ttl_s=5.0)
    with pytest.raises(NotFound):
        await fs.lookup(ROOT_INO, "late")
    before = requests(bucket)
    bucket.put("late", b"here now")
    clock.now += 4
    with pytest.raises(NotFound):
        await fs.lookup(ROOT_INO, "late")
    assert requests(bucket) == before
    clock.now += 2
    assert (await fs.lookup(ROOT_INO, "late")).size == len(b"here now")


async def test_ttl_zero_asks_every_time(tmp_path: Path) -> None:
    fs, bucket, _ = make(tmp_path, metadata_ttl_s=0.0, negative_ttl_s=0.0)
    bucket.put("f", b"x")
    await fs.lookup(ROOT_INO, "f")
    before = requests(bucket)
    await fs.lookup(ROOT_INO, "f")
    assert requests(bucket) > before


async def test_listing_fills_the_cache(tmp_path: Path) -> None:
    fs, bucket, _ = make(tmp_path)
    for i in range(20):
        bucket.put(f"f{i}", b"x" * i)
    fh = fs.opendir(ROOT_INO)
    assert len(await fs.readdir(fh, 0)) == 20
    fs.releasedir(fh)
    before = requests(bucket)
    for i in range(20):
        assert (await fs.lookup(ROOT_INO, f"f{i}")).size == i
    assert requests(bucket) == before  # ls -l after ls: no stat per entry


async def test_own_changes_are_seen_at_once(tmp_path: Path) -> None:
    fs, _bucket, _ = make(tmp_path, metadata_ttl_s=3600.0, negative_ttl_s=3600.0)
    with pytest.raises(NotFound):
        await fs.lookup(ROOT_INO, "new")  # cached as missing for an hour...
    handle, _ = await fs.create(ROOT_INO, "new", os.O_WRONLY)
    await fs.write(handle.fh, 0, b"mine")
    await fs.release(handle.fh)
    assert await read(fs, "new") == b"mine"  # ...but this mount made it
    await fs.unlink(ROOT_INO, "new")
    with pytest.raises(NotFound):
        await fs.lookup(ROOT_INO, "new")
    await fs.mkdir(ROOT_INO, "d")
    assert (await fs.lookup(ROOT_INO, "d")).ino
    await fs.rmdir(ROOT_INO, "d")
    with pytest.raises(NotFound):
        await fs.lookup(ROOT_INO, "d")


async def test_implied_directory_vanishes_with_its_last_object(tmp_path: Path) -> None:
    """Once the metadata TTL has passed (gcsfuse's type cache), or at its rmdir: until
    then it is an empty directory, so that `rm -rf` can remove it after its files."""
    fs, bucket, clock = make(tmp_path, implicit_dirs=True, metadata_ttl_s=60.0)
    for name in ("x/y", "z/y"):
        bucket.put(name, b"y")
    for top in ("x", "z"):
        d = await fs.lookup(ROOT_INO, top)
        await fs.lookup(d.ino, "y")
        await fs.unlink(d.ino, "y")
        again = await fs.lookup(ROOT_INO, top)
        assert again.ino == d.ino and await fs._list(again) == []
    await fs.rmdir(ROOT_INO, "x")
    with pytest.raises(NotFound):
        await fs.lookup(ROOT_INO, "x")
    clock.now += 61
    with pytest.raises(NotFound) as info:
        await fs.lookup(ROOT_INO, "z")
    assert errno_of(info.value) == errno.ENOENT


def test_cache_stays_within_its_byte_budget() -> None:
    clock = Clock()
    cache = MetadataCache(ttl_s=60, negative_ttl_s=5, max_bytes=10_000, clock=clock)
    for i in range(1000):
        cache.put(f"dir/file-{i}", Found(False, ObjectInfo(f"dir/file-{i}", i, i + 1)))
        assert cache.statistics()["used_bytes"] <= 10_000
    assert 0 < cache.statistics()["entries"] < 1000
    assert cache.get("dir/file-999") is not None  # the most recent survive


def test_disabled_cache_never_hits() -> None:
    cache = MetadataCache(ttl_s=60, negative_ttl_s=5, max_bytes=0, type_max_bytes=0)
    cache.put("a", Found(True))
    cache.put("f", Found(False, ObjectInfo("f", 1, 1)))
    assert cache.get("a") is MISSING
    assert cache.get("f") is MISSING


def test_directories_are_kept_in_the_type_cache_budget() -> None:
    """type-cache-max-size-mb bounds directory entries, stat-cache-max-size-mb the rest:
    with the type cache off a directory is asked again, a file still hits."""
    cache = MetadataCache(ttl_s=60, negative_ttl_s=5, max_bytes=10_000, type_max_bytes=0)
    cache.put("d", Found(True))
    cache.put("f", Found(False, ObjectInfo("f", 1, 1)))
    assert cache.get("d") is MISSING
    assert cache.get("f") is not None
    small = MetadataCache(ttl_s=60, negative_ttl_s=5, max_bytes=0, type_max_bytes=2_000)
    for i in range(100):
        small.put(f"dir-{i}", Found(True))
    stats = small.statistics()
    assert 0 < stats["type_entries"] < 100 and stats["type_used_bytes"] <= 2_000
    assert stats["used_bytes"] == 0
    assert small.get("dir-99") is not None  # the most recent survive


async def listing(fs: Filesystem) -> set[str]:
    fh = fs.opendir(ROOT_INO)
    try:
        return {name for name, _, _ in await fs.readdir(fh, 0)}
    finally:
        fs.releasedir(fh)


async def test_listings_kept_for_the_list_cache_ttl(tmp_path: Path) -> None:
    fs, bucket, clock = make(tmp_path, list_ttl_s=30.0)
    bucket.put("a", b"1")
    assert await listing(fs) == {"a"}
    before = requests(bucket)
    bucket.put("b", b"2")  # another client: unseen while the listing is kept
    assert await listing(fs) == {"a"}
    assert requests(bucket) == before
    handle, _ = await fs.create(ROOT_INO, "mine", os.O_WRONLY)
    await fs.release(handle.fh)  # our own change evicts the kept listing
    assert await listing(fs) == {"a", "b", "mine"}
    bucket.put("c", b"3")
    clock.now += 31
    assert await listing(fs) == {"a", "b", "c", "mine"}


async def test_list_cache_off_by_default(tmp_path: Path) -> None:
    fs, bucket, _ = make(tmp_path)
    bucket.put("a", b"1")
    assert await listing(fs) == {"a"}
    bucket.put("b", b"2")
    assert await listing(fs) == {"a", "b"}


async def test_metadata_prefetch_lists_a_directory_once_per_ttl(tmp_path: Path) -> None:
    bucket = MemoryBucket("meta")
    clock = Clock()
    for i in range(30):
        bucket.put(f"d/f{i}", b"x")
    bucket.put("d/", b"")
    async with trio.open_nursery() as nursery:
        fs = Filesystem(
            bucket,
            Settings(temp_dir=str(tmp_path), metadata_prefetch_entries=10),
            monotonic_s=clock,
            background=Background(nursery),
        )
        d = await fs.lookup(ROOT_INO, "d")
        await fs.lookup(d.ino, "f0")  # first lookup in d: lists d in the background
        await trio.testing.wait_all_tasks_blocked()
        lists = bucket.statistics()["lists"]
        before = requests(bucket)
        # The first 10 entries are 'd/' and the first 9 names in GCS order; the last of a
        # cut listing is not trusted, so the first 8 names are cached.
        names = sorted(f"f{i}" for i in range(30))[:8]
        for name in names:
            await fs.lookup(d.ino, name)
        assert bucket.statistics()["lists"] == lists  # listed once per TTL
        assert requests(bucket) == before  # every sibling came from the cache
        await fs.lookup(d.ino, sorted(f"f{i}" for i in range(30))[20])
        assert requests(bucket) > before  # beyond the prefetch limit: asked GCS


async def test_a_cut_listing_never_calls_a_directory_a_file(tmp_path: Path) -> None:
    """'foo-v2' and 'foo.bak' sort between 'foo' and 'foo/' ('-' and '.' come before '/'):
    a prefetch cut after them says nothing of 'foo/'. It cached 'foo' as a file, so a stat
    said regular file and ``ls foo/`` ENOTDIR, where gcsfuse (and GCS) have a directory."""
    bucket = MemoryBucket("meta")
    bucket.put("d/", b"")
    for name in [*(f"a{i}" for i in range(7)), "foo", "foo-v2", "foo.bak", "foo/x"]:
        bucket.put(f"d/{name}", b"x")
    async with trio.open_nursery() as nursery:
        fs = Filesystem(
            bucket,
            Settings(temp_dir=str(tmp_path), implicit_dirs=True, metadata_prefetch_entries=10),
            monotonic_s=Clock(),
            background=Background(nursery),
        )
        d = await fs.lookup(ROOT_INO, "d")
        await fs.lookup(d.ino, "a0")  # lists 'd/', a0-a6, foo, foo-v2 ahead: cut there
        await trio.testing.wait_all_tasks_blocked()
        foo = await fs.lookup(d.ino, "foo")
        assert foo.kind is Kind.DIR
        assert [name for name, _ in await fs._list(foo)] == ["x"]
        nursery.cancel_scope.cancel()
    fs.close()


async def test_listing_a_directory_lists_its_subdirectories_ahead(tmp_path: Path) -> None:
    """A stat storm over an unknown tree: the first lookup lists the root, and the root's
    listing has its subdirectories listed too (one page each, in the background), so the
    first stat in each of them waits for no listing of its own and asks GCS nothing."""
    bucket = MemoryBucket("meta")
    for d in range(5):
        for f in range(3):
            bucket.put(f"d{d}/f{f}", b"x")
            bucket.put(f"d{d}/deeper/g{f}", b"y")
    async with trio.open_nursery() as nursery:
        fs = Filesystem(
            bucket,
            Settings(temp_dir=str(tmp_path), implicit_dirs=True),
            background=Background(nursery),
        )
        d0 = await fs.lookup(ROOT_INO, "d0")
        await fs.lookup(d0.ino, "f0")
        await trio.testing.wait_all_tasks_blocked()
        lists = bucket.statistics()["lists"]
        assert lists == 1 + 5  # the root, then each of its five subdirectories, once
        before = requests(bucket)
        for d in range(1, 5):
            sub = await fs.lookup(ROOT_INO, f"d{d}")
            assert (await fs.lookup(sub.ino, "f2")).size == 1
        assert requests(bucket) == before  # all from the listings made ahead
        deeper = await fs.lookup(d0.ino, "deeper")  # one level only: deeper/ is not listed
        await fs.lookup(deeper.ino, "g0")
        await trio.testing.wait_all_tasks_blocked()
        assert bucket.statistics()["lists"] == lists + 1  # listed when a lookup got there
        nursery.cancel_scope.cancel()


async def listdir(fs: Filesystem, ino: int) -> dict[str, Inode]:
    fh = fs.opendir(ino)
    try:
        return {name: inode for name, inode, _ in await fs.readdir(fh, 0)}
    finally:
        fs.releasedir(fh)


async def test_a_listing_confirms_the_directories_whose_placeholders_it_names(
    tmp_path: Path,
) -> None:
    """Default options (no implicit-dirs): a listing names the placeholders of its
    prefixes, so ``ls -l`` of a tree made by gcsfuse (placeholders everywhere) needs no
    lookup of each directory (two stats each before); a prefix without a placeholder is
    still listed but not confirmed, and is not found."""
    fs, bucket, _ = make(tmp_path, entry_timeout_s=60.0)  # (a mount's, from the TTL)
    for d in range(3):
        bucket.put(f"d{d}/", b"")
        bucket.put(f"d{d}/f", b"x")
    bucket.put("bare/f", b"x")  # another tool's object: no placeholder
    entries = await listdir(fs, ROOT_INO)
    assert sorted(entries) == ["bare", "d0", "d1", "d2"]
    assert [entries[f"d{d}"].placeholder for d in range(3)] == [True, True, True]
    assert fs.attr(entries["d0"]).entry_timeout_s == 60.0  # the kernel may keep the name
    assert fs.attr(entries["bare"]).entry_timeout_s == 0.0  # it must ask, and find nothing
    before = bucket.statistics()["stats"]
    for d in range(3):
        assert (await fs.lookup(ROOT_INO, f"d{d}")).ino == entries[f"d{d}"].ino
    assert bucket.statistics()["stats"] == before  # confirmed by the listing
    with pytest.raises(NotFound):
        await fs.lookup(ROOT_INO, "bare")


async def test_a_walkers_readdir_takes_the_listing_made_ahead_once_and_only_while_fresh(
    tmp_path: Path,
) -> None:
    """``ls -lR``: listing a directory lists its subdirectories in the background, and the
    walker's readdir of each takes that listing instead of waiting for its own (one round
    trip per directory, one after another, was the cold walk's time). Only once, only
    within `FRESH_S` of when it was sent, and never after a change through this mount:
    else the readdir lists GCS, as with no listing ahead."""
    bucket = MemoryBucket("meta")
    clock = Clock()
    for d in range(4):
        bucket.put(f"d{d}/", b"")
        bucket.put(f"d{d}/f", b"x")
    async with trio.open_nursery() as nursery:
        fs = Filesystem(
            bucket,
            Settings(temp_dir=str(tmp_path)),
            monotonic_s=clock,
            background=Background(nursery),
        )
        root = await listdir(fs, ROOT_INO)
        await trio.testing.wait_all_tasks_blocked()
        lists = bucket.statistics()["lists"]
        assert lists == 1 + 4  # the root, and each subdirectory ahead of the walker
        bucket.put("d0/new", b"y")  # another client, after d0 was listed ahead
        assert sorted(await listdir(fs, root["d0"].ino)) == ["f"]  # the listing made ahead
        assert bucket.statistics()["lists"] == lists
        assert sorted(await listdir(fs, root["d0"].ino)) == ["f", "new"]  # once only
        assert bucket.statistics()["lists"] == lists + 1
        clock.now += FRESH_S + 0.1  # d1's listing is now too old to answer
        bucket.put("d1/new", b"y")
        assert sorted(await listdir(fs, root["d1"].ino)) == ["f", "new"]
        assert bucket.statistics()["lists"] == lists + 2
        clock.now -= FRESH_S + 0.1  # (d2's and d3's are fresh again, for the last check)
        bucket.put("d2/new", b"y")
        handle, _ = await fs.create(root["d3"].ino, "mine", os.O_WRONLY)
        await fs.release(handle.fh)  # a change through this mount: no listing ahead serves
        assert sorted(await listdir(fs, root["d2"].ino)) == ["f", "new"]
        assert sorted(await listdir(fs, root["d3"].ino)) == ["f", "mine"]
        nursery.cancel_scope.cancel()


def test_listings_kept_ahead_stay_within_their_entry_budget() -> None:
    ahead = ListedAhead(ttl_s=60.0)
    files = tuple((f"f{i}", ObjectInfo(f"d/f{i}", 1, 1)) for i in range(999))
    for d in range(MAX_ENTRIES // 1000 + 10):
        ahead.put(f"d{d}", DirListing(files, (), sent_s=0.0), changes=0)
    assert len(ahead) == MAX_ENTRIES // 1000  # the oldest dropped first
    assert ahead.take("d0", 0.0, 0) is None and ahead.take(f"d{len(ahead) + 9}", 0.0, 0)
    ahead.put("cut", DirListing(files, (), sent_s=0.0, complete=False), changes=0)
    assert ahead.take("cut", 0.0, 0) is None  # a cut listing cannot answer a readdir
    assert ListedAhead(ttl_s=0.0).fresh_s == 0.0  # metadata TTL 0: nothing is kept


async def test_lookups_during_a_prefetch_wait_for_it_instead_of_asking_gcs(
    tmp_path: Path,
) -> None:
    bucket = MemoryBucket("meta")
    bucket.put("d/", b"")
    for i in range(20):
        bucket.put(f"d/f{i}", b"x")
    async with trio.open_nursery() as nursery:
        fs = Filesystem(bucket, Settings(temp_dir=str(tmp_path)), background=Background(nursery))
        d = await fs.lookup(ROOT_INO, "d")
        before, stats = requests(bucket), bucket.statistics()["stats"]
        async with trio.open_nursery() as lookups:
            for i in range(5):  # a data loader's first stats in a fresh directory
                lookups.start_soon(fs.lookup, d.ino, f"f{i}")
        # One listing answered all five (made ahead with the root's, or by the first of them).
        assert requests(bucket) - before <= 1 and bucket.statistics()["stats"] == stats
        nursery.cancel_scope.cancel()


class GatedLists(MemoryBucket):
    """A bucket whose listings wait for ``gate``: a prefetch of a huge directory."""

    def __init__(self) -> None:
        super().__init__("meta")
        self.gate = trio.Event()

    async def list(self, prefix: str, **kwargs: Any) -> Listing:
        await self.gate.wait()
        return await super().list(prefix, **kwargs)


async def test_a_lookup_waits_for_a_long_prefetch_only_so_long(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    """The first stat in a directory waited for its whole metadata prefetch, a thousand
    pages for a million names with ``metadata-prefetch-entries-limit=-1``; gcsfuse's
    never holds a lookup. A lookup waits until `LISTING_WAIT_S` after the prefetch began,
    then asks GCS itself; a sibling after that does not wait at all. The listing goes on
    and answers the rest."""
    bucket = GatedLists()
    for i in range(3):
        bucket.put(f"f{i}", b"x" * i)
    async with trio.open_nursery() as nursery:
        fs = Filesystem(bucket, Settings(temp_dir=str(tmp_path)), background=Background(nursery))
        began = trio.current_time()
        with trio.fail_after(10 * LISTING_WAIT_S):  # (without a bound: forever)
            assert (await fs.lookup(ROOT_INO, "f1")).size == 1
        assert trio.current_time() - began == pytest.approx(LISTING_WAIT_S)  # it waited
        stats = bucket.statistics()["stats"]
        with trio.fail_after(LISTING_WAIT_S / 10):
            assert (await fs.lookup(ROOT_INO, "f2")).size == 2
        assert bucket.statistics()["stats"] > stats  # asked GCS itself, at once
        bucket.gate.set()
        await trio.testing.wait_all_tasks_blocked()
        stats = bucket.statistics()["stats"]
        assert (await fs.lookup(ROOT_INO, "f0")).size == 0
        assert bucket.statistics()["stats"] == stats  # the listing answered it
        nursery.cancel_scope.cancel()


@pytest.mark.parametrize(
    ("sent_at", "done_at", "returns_at"),
    [
        (0.5, 1.2, 1.2),  # queued for a slot half the bound: its whole bound from there
        (0.5, None, 1.5),
        (None, None, 1.0),  # never sent: as long as the bound, for it to be sent
        (2.0, 2.1, 1.0),  # sent past that: not waited for
    ],
)
async def test_a_lookup_waits_for_a_listing_from_when_it_is_sent(
    autojump_clock: trio.testing.MockClock,
    sent_at: float | None,
    done_at: float | None,
    returns_at: float,
) -> None:
    """The bound counts from when the listing got a slot, not from when it was queued:
    list-ahead queues 128 listings for 10 slots, and a stat found its listing past the
    bound before it was even sent (its urge makes it next), then asked GCS itself."""
    listing = ListingUnderWay()
    began = trio.current_time()

    async def run() -> None:
        if sent_at is not None:
            await trio.sleep(sent_at * LISTING_WAIT_S)
            listing.send()
            if done_at is not None:
                await trio.sleep((done_at - sent_at) * LISTING_WAIT_S)
                listing.done.set()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(run)
        await listing.wait()
        assert trio.current_time() - began == pytest.approx(returns_at * LISTING_WAIT_S)
        assert listing.done.is_set() == (returns_at == done_at)


async def test_a_kept_listing_is_not_rebuilt_until_something_changes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A warm ``ls`` of a kept listing reuses the inodes built last time (rebuilding them
    was half the daemon's time); a local change still shows at once."""
    fs, bucket, _ = make(tmp_path, list_ttl_s=30.0)
    bucket.put("a", b"1")
    bucket.put("b", b"22")
    built: list[str] = []
    file_inode = fs._file_inode

    async def counting(path: str, info: ObjectInfo) -> Inode:
        built.append(path)
        return await file_inode(path, info)

    monkeypatch.setattr(fs, "_file_inode", counting)
    assert await listing(fs) == {"a", "b"}
    assert sorted(built) == ["a", "b"]
    built.clear()
    assert await listing(fs) == {"a", "b"}
    assert built == []  # reused
    await fs.rename(ROOT_INO, "a", ROOT_INO, "c")
    assert await listing(fs) == {"b", "c"}


async def test_the_kernel_keeps_its_listing_only_while_ours_is_kept(tmp_path: Path) -> None:
    """opendir lets the kernel keep its cached listing (FOPEN_KEEP_CACHE) only while the
    listing it was given is still the kept one: not after the TTL, nor after a change
    made through this mount."""
    fs, bucket, clock = make(tmp_path, list_ttl_s=30.0)
    bucket.put("a", b"1")

    def keeps() -> bool:
        fh = fs.opendir(ROOT_INO)
        try:
            return fs.kernel_may_keep_listing(fh)
        finally:
            fs.releasedir(fh)

    assert not keeps()  # the kernel was never given a listing
    assert await listing(fs) == {"a"}
    assert keeps()
    clock.now += 29
    assert keeps()
    clock.now += 2  # the TTL has passed: the kernel must ask again
    assert not keeps()
    assert await listing(fs) == {"a"}
    assert keeps()
    handle, _ = await fs.create(ROOT_INO, "mine", os.O_WRONLY)
    await fs.release(handle.fh)
    assert not keeps()
    assert await listing(fs) == {"a", "mine"}
    assert keeps()
    assert fs.statistics()["directories"] == {
        "opens": 10,
        "kept": 4,
        "listings_served": 3,
        "listed_ahead": 0,
        "listed_ahead_unused": 0,
        "listings_urged": 0,
        "prefilled": 0,  # (no kernel to read a directory through)
        "prefilled_entries": 0,
        "prefill_failed": 0,
    }


async def test_without_a_list_ttl_the_kernel_never_keeps_a_listing(tmp_path: Path) -> None:
    fs, bucket, _ = make(tmp_path)
    bucket.put("a", b"1")
    assert await listing(fs) == {"a"}
    fh = fs.opendir(ROOT_INO)
    assert not fs.kernel_may_keep_listing(fh)
    fs.releasedir(fh)


async def test_a_lookup_that_asks_gcs_keeps_the_parents_listing(tmp_path: Path) -> None:
    """Asking GCS about a name changes nothing: the kept listings stay (they used to be
    dropped, so every cold stat re-listed every ancestor)."""
    fs, bucket, _ = make(tmp_path, list_ttl_s=30.0)
    bucket.put("d/", b"")
    bucket.put("d/a", b"1")
    assert await listing(fs) == {"d"}
    d = await fs.lookup(ROOT_INO, "d")  # asks GCS: a listing names no placeholder's info
    with pytest.raises(NotFound):
        await fs.lookup(d.ino, "missing")
    lists = bucket.statistics()["lists"]
    assert await listing(fs) == {"d"}
    assert bucket.statistics()["lists"] == lists  # the root's listing was still kept
    fh = fs.opendir(ROOT_INO)
    assert fs.kernel_may_keep_listing(fh)
    fs.releasedir(fh)


def test_an_answer_older_than_a_change_of_this_mount_is_not_kept() -> None:
    """A listing sent before a background upload ended answers after it: its older view of
    that path must not replace what the mount knows; other paths in it are kept."""
    cache = MetadataCache(ttl_s=60, negative_ttl_s=5, max_bytes=10_000)
    new = Found(False, ObjectInfo("a", 10, 2))
    asked = cache.asking()
    cache.put("a", new)  # the upload ended while the listing was out
    cache.forget_below("dir")  # and a directory was renamed away
    cache.put_answer("a", Found(False, ObjectInfo("a", 3, 1)), asked)
    cache.put_answer("dir/x", Found(False, ObjectInfo("dir/x", 1, 1)), asked)
    cache.put_answer("b", Found(False, ObjectInfo("b", 1, 1)), asked)
    cache.answered(asked)
    assert cache.get("a") is new
    assert cache.get("dir/x") is MISSING
    assert cache.get("b") is not MISSING
    # With nothing out, later answers are simply kept, and nothing is remembered.
    asked = cache.asking()
    cache.put_answer("a", Found(False, ObjectInfo("a", 11, 3)), asked)
    cache.answered(asked)
    assert cache.get("a").info.generation == 3
    assert not cache._touched and not cache._touched_below


def test_on_a_mount_never_without_a_request_out_the_changes_kept_stay_bounded() -> None:
    """Overlapping requests, one always out: what is remembered of changes is pruned to
    those a request still out may need, and a change still counts against its answer."""
    cache = MetadataCache(ttl_s=60, negative_ttl_s=5, max_bytes=1 << 20)
    held = cache.asking()  # a slow listing, out the whole time
    cache.put("x", Found(False, ObjectInfo("x", 1, 9)))
    previous = cache.asking()
    for i in range(10 * PRUNE_AT):
        cache.put(f"f{i}", Found(False, ObjectInfo(f"f{i}", 1, 1)))
        current = cache.asking()
        cache.answered(previous)  # each request overlaps the next
        previous = current
        if i == 5 * PRUNE_AT:
            cache.answered(held)  # the slow one answers at last
    assert len(cache._touched) <= PRUNE_AT + 1
    cache.put("late", Found(False, ObjectInfo("late", 1, 5)))
    cache.put_answer("late", Found(False, ObjectInfo("late", 1, 4)), previous)
    assert cache.get("late").info.generation == 5  # the newer change still wins
    cache.answered(previous)
    assert not cache._touched


@pytest.mark.parametrize("elsewhere", ["replaced", "deleted"])
async def test_touch_of_a_file_another_client_changed_succeeds(
    tmp_path: Path, elsewhere: str
) -> None:
    """gcsfuse's SetMtime ignores "not found" and "changed": ``touch``, ``cp -p`` and
    ``rsync -t`` on a shared bucket go on (tierfs said ESTALE or ENOENT). Theirs stays
    untouched, and the next lookup finds it."""
    fs, bucket, _clock = make(tmp_path, metadata_ttl_s=60.0)
    bucket.put("f", b"ours")
    inode = await fs.lookup(ROOT_INO, "f")
    if elsewhere == "replaced":
        bucket.put("f", b"theirs, longer")
    else:
        await bucket.delete("f")
    attr = await fs.setattr(inode.ino, mtime_ns=1_234_567_890_000_000_000)
    assert attr.mtime_ns == 1_234_567_890_000_000_000  # this mount's, as gcsfuse's
    if elsewhere == "replaced":
        assert "gcsfuse_mtime" not in (await bucket.stat("f")).metadata
        assert (await fs.lookup(ROOT_INO, "f")).size == len(b"theirs, longer")


@pytest.mark.parametrize(
    ("metadata", "expected_ns"),
    [
        ({"gcsfuse_mtime": "2024-05-06T07:08:09.123456789Z"}, 1_714_979_289_123_456_789),
        ({"gcsfuse_mtime": "2024-05-06T09:08:09.123456789+02:00"}, 1_714_979_289_123_456_789),
        ({"gcsfuse_mtime": "2024-05-06T02:08:09.5-05:00"}, 1_714_979_289_500_000_000),
        ({"gcsfuse_mtime": "2024-05-06T07:08:09z"}, 1_714_979_289_000_000_000),
        ({"goog-reserved-file-mtime": "-86400"}, -86_400_000_000_000),
        ({"gcsfuse_mtime": "not a time"}, 42_000_000_000),
    ],
)
def test_an_mtime_with_any_rfc3339_offset_is_read(
    metadata: dict[str, str], expected_ns: int
) -> None:
    """gcsfuse reads ``gcsfuse_mtime`` with Go's RFC 3339 parser, offsets included; a time
    written with ``+02:00`` by another tool was ignored here (the update time shown), and
    a legacy mtime before 1970 too."""
    from tierfs.core.writer import format_mtime, parse_mtime

    assert parse_mtime(metadata, 42.0) == expected_ns
    if "gcsfuse_mtime" in metadata and expected_ns != 42_000_000_000:
        assert parse_mtime({"gcsfuse_mtime": format_mtime(expected_ns)}, 0) == expected_ns
