"""The shared tier (`SharedTier`): several tiers on one directory stand for several nodes.

Blocks whole or not at all, CRC32C checked (a torn or rotten file is never served),
fetch markers with expiries (trio's MockClock: no sleeps), eviction within a cap by
each node alone (also two at once), a directory that cannot be reached or answers too
slowly, and `Blocks` over two "nodes" fetching each block from GCS once."""

from __future__ import annotations

import dataclasses
import errno
import logging
import math
import os
import stat
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

import mount_options
from tierfs import settings
from tierfs.cache import BlockKey
from tierfs.cache import shared_format as fmt
from tierfs.cache.ram import RamTier
from tierfs.cache.shared import AUTO, SharedTier
from tierfs.core.blocks import Blocks
from tierfs.storage.memory import MemoryBucket

BLOCK = 64 * 1024
BUCKET = "bkt"


def node(root: Path, max_bytes: int = 1 << 30, **kw: float) -> SharedTier:
    """One node's shared tier; trio's clock for the markers, no I/O bound (the mock clock
    jumps while a worker thread runs, which would look like a stall)."""
    options: dict[str, float] = {"io_timeout_s": math.inf, **kw}
    return SharedTier(root, BUCKET, max_bytes, block_size=BLOCK, clock=trio.current_time, **options)


async def opened(root: Path, max_bytes: int = 1 << 30, **kw: float) -> SharedTier:
    tier = node(root, max_bytes, **kw)
    await tier.open()
    return tier


def block(seed: int, size: int = BLOCK) -> bytes:
    return bytes([seed % 251]) * size


async def test_a_block_one_node_puts_another_reads_whole(tmp_path: Path) -> None:
    a, b = await opened(tmp_path), await opened(tmp_path)
    key = BlockKey("ckpt/shard-0", 7, 3)
    assert await b.get(key) is None
    await a.put(key, block(1))
    assert await b.get(key) == block(1)
    assert b.holds(key)
    assert b.statistics()["hits"] == 1 and b.statistics()["misses"] == 1
    assert a.statistics()["bytes_written"] == BLOCK
    # Another generation, another block index or another object is another key.
    for other in (BlockKey("ckpt/shard-0", 8, 3), BlockKey("ckpt/shard-0", 7, 4)):
        assert await b.get(other) is None
    modes = {p.stat().st_mode & 0o777 for p in (tmp_path / "tierfs-shared").rglob("*")}
    assert modes == {0o600, 0o700}
    assert not list(tmp_path.rglob(".tmp-*"))


async def test_a_second_put_of_a_published_block_keeps_the_first_copy(tmp_path: Path) -> None:
    a, b = await opened(tmp_path), await opened(tmp_path)
    key = BlockKey("f", 1, 0)
    await a.put(key, block(1))
    inode = a.path_of(key).stat().st_ino
    await b.put(key, block(1))
    assert a.path_of(key).stat().st_ino == inode  # a reader of it is not disturbed
    assert b.statistics()["bytes_written"] == 0


@pytest.mark.parametrize("damage", ["truncate", "flip", "empty", "header"])
async def test_a_torn_or_rotten_block_is_never_served(tmp_path: Path, damage: str) -> None:
    a, b = await opened(tmp_path), await opened(tmp_path)
    key = BlockKey("model.bin", 1, 0)
    await a.put(key, block(9))
    path = a.path_of(key)
    raw = bytearray(path.read_bytes())
    if damage == "truncate":
        os.truncate(path, len(raw) // 2)
    elif damage == "flip":
        raw[-100] ^= 0xFF
        path.write_bytes(bytes(raw))
    elif damage == "empty":
        os.truncate(path, 0)
    else:
        raw[0:4] = b"XXXX"
        path.write_bytes(bytes(raw))
    assert await b.get(key) is None
    assert b.statistics()["corrupt"] == 1
    assert not path.exists()  # deleted, for every node
    await b.put(key, block(9))  # fetched again from GCS and published again
    assert await a.get(key) == block(9)


async def waiting(tier: SharedTier) -> None:
    """Until ``tier`` waits for another node's claim. The autojump clock also jumps while
    a task waits for a worker thread: without this, the other node's download could end
    before this one even looked, and nothing would have been waited for. (Checkpoints, not
    sleeps: a task that never blocks keeps the clock where it is.)"""
    while not tier.statistics()["waits"]:
        await trio.lowlevel.checkpoint()


async def test_a_reader_waits_for_the_block_another_node_is_fetching(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    a, b = await opened(tmp_path), await opened(tmp_path)
    key = BlockKey("ckpt", 1, 0)
    assert await a.fetching(key) is None  # a claims it
    assert a.path_of(key).with_name(a.path_of(key).name + ".fetching").exists()
    got: list[bytes | None] = []
    got_at: list[float] = []
    start = trio.current_time()

    async def reader() -> None:
        assert await b.get(key) is None  # the miss that sends it to fetch
        got.append(await b.fetching(key))
        got_at.append(trio.current_time())

    async with trio.open_nursery() as nursery:
        nursery.start_soon(reader)
        await waiting(b)
        await trio.sleep(3)  # a's download takes 3 s
        await a.put(key, block(5))
        await a.fetched(key)
        published = trio.current_time()
    assert got == [block(5)]
    # Measured from the publication, not the start: while a's put and fetched wait for
    # their threads, b's polls (each a sleep of up to 50 ms) move the autojump clock on.
    assert 3 <= got_at[0] - start and got_at[0] - published < 1
    numbers = b.statistics()
    assert numbers["waits"] == 1 and numbers["wait_hits"] == 1 and numbers["wait_timeouts"] == 0
    assert (numbers["hits"], numbers["misses"]) == (1, 0)  # one lookup (was 1 and 1)
    assert not list(tmp_path.rglob("*.fetching"))


async def test_a_claim_that_expires_is_not_waited_for_longer(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    a, b = await opened(tmp_path, marker_s=5), await opened(tmp_path, wait_s=30)
    key = BlockKey("ckpt", 1, 0)
    assert await a.fetching(key) is None  # and a dies: no put, no fetched
    start = trio.current_time()
    assert await b.fetching(key) is None  # b fetches itself after the marker's 5 s
    assert 5 <= trio.current_time() - start < 6
    assert b.statistics()["wait_timeouts"] == 1
    # The expired marker is taken over: b's claim now, and a third node waits for b.
    c = await opened(tmp_path, wait_s=2)
    start = trio.current_time()
    assert await c.fetching(key) is None
    assert 2 <= trio.current_time() - start < 3  # c's own bound, shorter than the marker


async def test_a_failed_fetch_lets_the_waiting_node_go_at_once(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    a, b = await opened(tmp_path), await opened(tmp_path)
    key = BlockKey("ckpt", 1, 0)
    assert await a.fetching(key) is None
    start = trio.current_time()
    got: list[bytes | None] = [b"unset"]

    done_at: list[float] = []

    async def reader() -> None:
        got[0] = await b.fetching(key)
        done_at.append(trio.current_time())

    async with trio.open_nursery() as nursery:
        nursery.start_soon(reader)
        await waiting(b)
        await trio.sleep(1)
        await a.fetched(key)  # the download failed: nothing published
        released = trio.current_time()  # (b's polls move the clock while fetched's thread runs)
    assert got == [None]
    assert b.statistics()["waits"] == 1
    assert done_at[0] - start >= 1 and done_at[0] - released < 1


class _SlowLookAfterClaim(SharedTier):
    """A node whose look for the block just after its claim hangs until ``go`` (a slow
    shared file system), so that its reader can be interrupted there."""

    go = trio.Event()
    reached = trio.Event()

    async def _read(self, key: BlockKey) -> bytes | None:
        if key in self._claims:
            self.reached.set()
            await self.go.wait()
        return await super()._read(key)


async def test_a_reader_interrupted_after_its_claim_leaves_no_marker(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    """A reader interrupted (killed, ^C) between its claim and its download left the marker
    and the claim: every later read of the block, on this node and the others, waited for
    the marker to expire (20 s) before fetching it."""
    bucket = MemoryBucket(BUCKET)
    data = os.urandom(BLOCK)
    info = bucket.put("ckpt", data)
    shared = _SlowLookAfterClaim(
        tmp_path, BUCKET, 1 << 30, block_size=BLOCK, clock=trio.current_time, io_timeout_s=math.inf
    )
    shared.go, shared.reached = trio.Event(), trio.Event()
    await shared.open()
    blocks = Blocks(bucket, [shared], block_size=BLOCK, downloads=trio.CapacityLimiter(4))
    key = BlockKey("ckpt", info.generation, 0)
    # Interrupted once it is there (not at a deadline: the autojump clock could reach one
    # while the first lookup waits for its thread, before any claim).
    with trio.CancelScope() as interrupted:
        async with trio.open_nursery() as nursery:

            async def interrupt() -> None:
                await shared.reached.wait()
                interrupted.cancel()

            nursery.start_soon(interrupt)
            await blocks.get(key, len(data))
    assert interrupted.cancelled_caught
    assert not list(tmp_path.rglob("*.fetching"))
    shared.go.set()
    other = await opened(tmp_path)
    start = trio.current_time()
    assert await other.fetching(key) is None  # its own claim at once: nobody to wait for
    assert trio.current_time() - start < 1
    await other.fetched(key)
    assert await blocks.get(key, len(data)) == data
    assert trio.current_time() - start < 1


async def test_a_reader_interrupted_in_its_claim_leaves_no_marker(
    tmp_path: Path, autojump_clock: trio.testing.MockClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Interrupted while its claim's file is being made (a slow shared file system): the
    worker thread made the marker after the reader had gone, and nothing removed it."""
    create = fmt.create_marker
    begun = threading.Event()

    def slow_create(*args: object) -> bool:
        begun.set()
        time.sleep(0.3)  # (real time, in the worker thread)
        return create(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(fmt, "create_marker", slow_create)
    bucket = MemoryBucket(BUCKET)
    data = os.urandom(BLOCK)
    info = bucket.put("ckpt", data)
    blocks = Blocks(
        bucket, [await opened(tmp_path)], block_size=BLOCK, downloads=trio.CapacityLimiter(4)
    )
    async with trio.open_nursery() as nursery:
        reader = trio.CancelScope()

        async def read() -> None:
            with reader:
                await blocks.get(BlockKey("ckpt", info.generation, 0), len(data))

        nursery.start_soon(read)
        await trio.to_thread.run_sync(begun.wait)
        reader.cancel()  # interrupted while the marker is being made
    time.sleep(0.6)  # (real time: a thread abandoned would have made its marker by now)
    assert not list(tmp_path.rglob("*.fetching"))


def set_age(tier: SharedTier, key: BlockKey, age_s: float) -> None:
    when = os.stat(tier.path_of(key)).st_mtime - age_s
    os.utime(tier.path_of(key), (when, when))


async def test_each_node_keeps_the_cap_by_evicting_the_least_recently_used(
    tmp_path: Path,
) -> None:
    size = len(fmt.block_bytes(b"f", 1, 0, BLOCK, block(0)))
    a = await opened(tmp_path, max_bytes=4 * size)
    keys = [BlockKey("f", 1, i) for i in range(4)]
    for i, key in enumerate(keys):
        await a.put(key, block(i))
        set_age(a, key, 1000 - i)  # key 0 the oldest
    set_age(a, keys[0], -500)  # ...but read since: the newest now
    await a.put(BlockKey("f", 1, 4), block(4))
    assert a.statistics()["used_bytes"] <= 4 * size
    assert a.statistics()["evictions"] >= 1
    assert a.path_of(keys[0]).exists()  # recently used: kept
    assert not a.path_of(keys[1]).exists()  # the least recently used: gone
    assert await a.get(BlockKey("f", 1, 4)) == block(4)


async def test_a_hit_touches_the_file_at_most_once_a_minute(tmp_path: Path) -> None:
    a = await opened(tmp_path)
    key = BlockKey("f", 1, 0)
    await a.put(key, block(1))
    before = os.stat(a.path_of(key)).st_mtime
    await a.get(key)
    assert os.stat(a.path_of(key)).st_mtime == before  # fresh: no utime
    set_age(a, key, 120)
    aged = os.stat(a.path_of(key)).st_mtime
    await a.get(key)
    assert os.stat(a.path_of(key)).st_mtime > aged + 100


async def test_two_nodes_evicting_at_once_keep_what_is_in_use(tmp_path: Path) -> None:
    size = len(fmt.block_bytes(b"f", 1, 0, BLOCK, block(0)))
    cap = 20 * size
    a, b = await opened(tmp_path, max_bytes=cap), await opened(tmp_path, max_bytes=cap)
    hot = [BlockKey("hot", 1, i) for i in range(5)]
    cold = [BlockKey("cold", 1, i) for i in range(30)]
    writer = node(tmp_path, max_bytes=1 << 40)  # a node with a bigger cap overfills it
    await writer.open()
    for i, key in enumerate(cold):
        await writer.put(key, block(i))
        set_age(writer, key, 10_000 - i)
    for key in hot:
        await writer.put(key, block(7))
    async with trio.open_nursery() as nursery:
        nursery.start_soon(lambda: a._evict_if_due(force=True))
        nursery.start_soon(lambda: b._evict_if_due(force=True))
    left = [p for p in (tmp_path / "tierfs-shared").rglob("*") if p.is_file()]
    used = sum(p.stat().st_size for p in left)
    assert used <= cap
    assert used >= int(cap * 0.9) - 2 * size  # together they did not evict twice over
    for key in hot:  # the blocks in use are all there, and whole
        assert await a.get(key) == block(7)


async def test_a_missing_shared_directory_is_one_warning_and_no_errors(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    tier = await opened(tmp_path / "not-mounted")
    key = BlockKey("f", 1, 0)
    assert await tier.get(key) is None
    await tier.put(key, block(1))
    assert await tier.fetching(key) is None
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "not-mounted" in warnings[0].getMessage()
    assert tier.statistics()["unavailable"] == 1
    assert not (tmp_path / "not-mounted").exists()  # never made on the local disk


async def test_a_full_shared_directory_stops_puts_not_gets(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    a, b = await opened(tmp_path), await opened(tmp_path)
    stored = BlockKey("f", 1, 0)
    await a.put(stored, block(1))

    def full(*args: object) -> bool:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(fmt, "write_block", full)
    await b.put(BlockKey("f", 1, 1), block(2))
    await b.put(BlockKey("f", 1, 2), block(3))
    assert b.statistics()["puts_skipped"] == 1  # the second was not even tried
    assert await b.get(stored) == block(1)
    assert len([r for r in caplog.records if r.levelno == logging.WARNING]) == 1


async def test_a_shared_directory_slower_than_the_bound_is_stepped_around(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    autojump_clock: trio.testing.MockClock,
) -> None:
    tier = await opened(tmp_path, retry_s=30)
    tier._access.io_timeout_s = 5.0
    release = threading.Event()
    calls = []

    def hung(*args: object) -> tuple[str, bytes]:
        calls.append(args)
        release.wait(10)
        return fmt.MISSING, b""

    monkeypatch.setattr(fmt, "read_block", hung)
    try:
        start = trio.current_time()
        assert await tier.get(BlockKey("f", 1, 0)) is None
        assert trio.current_time() - start == pytest.approx(5)
        assert await tier.get(BlockKey("f", 1, 1)) is None  # no I/O while stepped aside
        deadline = trio.current_time()  # (the abandoned thread may not have started yet)
        while not calls and trio.current_time() < deadline + 5:
            await trio.to_thread.run_sync(release.wait, 0.01)
        assert len(calls) == 1
        assert tier.statistics()["unavailable"] == 1
        assert len([r for r in caplog.records if r.levelno == logging.WARNING]) == 1
    finally:
        release.set()
    monkeypatch.undo()
    tier._access.io_timeout_s = math.inf  # (the mock clock would jump past it while a thread works)
    await trio.sleep(31)
    await tier.put(BlockKey("f", 1, 2), block(2))  # back after retry_s
    assert await tier.get(BlockKey("f", 1, 2)) == block(2)
    assert tier.statistics()["unavailable"] == 0


async def test_discard_removes_an_object_generation_for_every_node(tmp_path: Path) -> None:
    a, b = await opened(tmp_path), await opened(tmp_path)
    for i in range(3):
        await a.put(BlockKey("f", 1, i), block(i))
    await a.put(BlockKey("f", 2, 0), block(9))
    await b.discard("f", 1)
    assert [await a.get(BlockKey("f", 1, i)) for i in range(3)] == [None] * 3
    assert await a.get(BlockKey("f", 2, 0)) == block(9)


async def test_blocks_on_two_nodes_fetch_each_block_from_gcs_once(tmp_path: Path) -> None:
    bucket = MemoryBucket(BUCKET)
    data = os.urandom(10 * BLOCK + 17)
    info = bucket.put("ckpt", data)

    def blocks_of_a_node() -> Blocks:
        shared = node(tmp_path, poll_s=0.001)
        return Blocks(
            bucket, [RamTier(1 << 24), shared], block_size=BLOCK, downloads=trio.CapacityLimiter(4)
        )

    nodes = [blocks_of_a_node() for _ in range(3)]
    for blocks in nodes:
        await blocks.tiers[-1].open()  # type: ignore[attr-defined]
    results: dict[int, bytes] = {}

    async def restore(i: int) -> None:
        await nodes[i].fill("ckpt", info.generation, len(data), None)
        parts = [
            await nodes[i].get(BlockKey("ckpt", info.generation, b), len(data))
            for b in range(nodes[i].blocks_of(len(data)))
        ]
        results[i] = b"".join(parts)

    async with trio.open_nursery() as nursery:
        for i in range(3):
            nursery.start_soon(restore, i)
    assert all(result == data for result in results.values())
    assert sum(blocks.gcs_blocks for blocks in nodes) == 11  # each block fetched once
    # A node joining later reads it all from the shared tier.
    late = blocks_of_a_node()
    await late.tiers[-1].open()  # type: ignore[attr-defined]
    await late.fill("ckpt", info.generation, len(data), None)
    assert late.gcs_blocks == 0
    assert late.statistics()["tiers"]["shared"]["hits"] == 11


async def test_a_just_uploaded_file_is_published_to_the_shared_tier(tmp_path: Path) -> None:
    bucket = MemoryBucket(BUCKET)
    data = os.urandom(3 * BLOCK)
    info = bucket.put("saved", data)
    source = tmp_path / "staged"
    source.write_bytes(data)
    shared = await opened(tmp_path)
    blocks = Blocks(bucket, [shared], block_size=BLOCK, downloads=trio.CapacityLimiter(2))
    fd = os.open(source, os.O_RDONLY)
    try:
        await blocks.store_local(fd, "saved", info.generation, len(data), lambda: True)
    finally:
        os.close(fd)
    other = await opened(tmp_path)
    got = [await other.get(BlockKey("saved", info.generation, i)) for i in range(3)]
    assert b"".join(g or b"" for g in got) == data
    assert stat.S_IMODE(os.stat(other.path_of(BlockKey("saved", info.generation, 0))).st_mode) == (
        0o600
    )


def settings_of(*flags: str) -> tuple[settings.SharedSettings, settings.TierSettings]:
    config = mount_options.load(mount_options.parse_flags(list(flags)).parsed)
    return settings.shared(config), settings.tiers(config)


def test_the_options_place_the_shared_tier() -> None:
    on = "--enable-experimental-shared-chunk-cache"
    shared, tiers = settings_of("--cache-dir=/ssd", on, "--file-cache-shared-cache-dir=/nfs")
    assert shared.enabled and shared.directory == "/nfs" and shared.max_bytes == -1
    assert tiers.ssd and tiers.block_bytes == 8 << 20  # a local SSD tier beside it
    # gcsfuse's meaning: without a directory of its own, cache-dir is the shared one.
    shared, tiers = settings_of(
        "--cache-dir=/nfs", on, "--file-cache-shared-cache-chunk-size-mb=16"
    )
    assert shared.enabled and shared.directory == "/nfs" and not tiers.ssd
    assert tiers.block_bytes == 16 << 20  # the chunk size is every tier's block size
    shared, _ = settings_of(
        on, "--file-cache-shared-cache-dir=/nfs", "--file-cache-shared-cache-max-size-mb=0"
    )
    assert not shared.enabled
    shared, _ = settings_of("--cache-dir=/ssd", "--file-cache-shared-cache-dir=/nfs")
    assert not shared.enabled  # the option turns it on


async def test_an_empty_marker_holds_no_reader(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    """A marker left empty (made, then its write failed on a full share, or its node died
    in between) read as live for ever: every reader of that block, on every node, waited
    the whole wait before fetching it, and no scan removed it. It reads as expired."""
    tier = await opened(tmp_path)
    key = BlockKey("ckpt", 7, 0)
    marker = tier._marker(key)
    marker.parent.mkdir(parents=True, exist_ok=True)
    marker.write_bytes(b"")
    start = trio.current_time()
    assert await tier.fetching(key) is None  # claimed at once, not after the wait
    assert trio.current_time() - start < 1
    assert float(marker.read_text()) > 0  # ours now
    await tier.fetched(key)
    marker.write_bytes(b"")
    assert fmt.scan(tier.directory, time.time(), 0.0).stale_removed == 1
    assert not marker.exists()


def test_a_claim_whose_write_fails_leaves_no_marker(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The marker is written whole, then linked into place: a write that fails (ENOSPC)
    leaves neither a marker nor its temporary."""
    marker = tmp_path / "top" / "ab" / f"abc.7.65536.0{fmt.MARKER_SUFFIX}"
    (tmp_path / "top").mkdir()

    def full(fd: int, data: bytes) -> int:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(fmt.os, "write", full)
    with pytest.raises(OSError):
        fmt.create_marker(marker, tmp_path / "top", 100.0, 1.0)
    monkeypatch.undo()
    assert list((tmp_path / "top").rglob("*")) == [marker.parent]
    assert fmt.create_marker(marker, tmp_path / "top", 100.0, 1.0)
    assert not fmt.create_marker(marker, tmp_path / "top", 100.0, 2.0)  # live: another's
    assert fmt.create_marker(marker, tmp_path / "top", 200.0, 150.0)  # expired: taken over
    assert float(marker.read_text()) == 200.0


async def test_a_block_another_node_evicted_under_a_read_is_one_miss(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On NFS, a file another node unlinks (evicts, replaces) while this node reads it
    fails that read with ESTALE. That is one miss, not an outage: it stepped the whole
    tier aside for 30 s (every read a miss) and warned."""
    a, b = await opened(tmp_path), await opened(tmp_path)
    key = BlockKey("ckpt", 7, 0)
    await a.put(key, block(3))
    read_block = fmt.read_block
    raced = []

    def stale_once(*args: object, **kwargs: object) -> object:
        if not raced:
            raced.append(True)
            raise OSError(errno.ESTALE, os.strerror(errno.ESTALE))
        return read_block(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(fmt, "read_block", stale_once)
    assert await b.get(key) is None  # the raced read: a miss
    assert b.statistics()["outages"] == 0
    assert await b.get(key) == block(3)  # the tier is still in use


async def test_a_cap_sized_by_the_volume_is_kept_between_timed_scans(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``shared-cache-max-size-mb: -1`` (the volume's free space less a margin): a node
    scans once it wrote a sixteenth of the cap the last scan measured, as with a set
    cap. Only the 30 s timer did (the cap it compared with was infinite), so the nodes
    wrote 30 s of blocks past it."""
    size = len(fmt.block_bytes(b"f", 1, 0, BLOCK, block(0)))
    scan = fmt.scan

    def volume_of_four_blocks(top: Path, now: float, marker_now: float) -> fmt.Listing:
        found = scan(top, now, marker_now)  # room for 9 blocks, 5 of them the margin
        free = max(0, 9 * size - found.used_bytes)
        return dataclasses.replace(found, total_bytes=100 * size, free_bytes=free)

    monkeypatch.setattr(fmt, "scan", volume_of_four_blocks)
    a = await opened(tmp_path, max_bytes=AUTO)
    for i in range(16):
        await a.put(BlockKey("f", 1, i), block(i))
    kept = [p for p in a.directory.rglob("*") if p.is_file()]
    assert len(kept) <= 5, len(kept)  # 16 before


async def test_a_share_mounted_after_the_node_started_is_used_once_it_is_there(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    """The shared file system mounted after tierfs (a boot-order race; the first node
    ever): tierfs's folder inside it did not exist, puts stopped at it (ENOENT) and the
    tier stepped aside again and again, for good. Puts now make that folder (never the
    share's own directory)."""
    root = tmp_path / "share"
    tier = node(root)
    await tier.open()  # not there: the tier steps aside
    key = BlockKey("ckpt", 7, 0)
    await tier.put(key, block(5))
    assert not root.exists()  # the share's own directory is never made
    root.mkdir()  # mounted now
    await trio.sleep(60)  # past the step-aside
    await tier.put(key, block(5))
    assert await tier.get(key) == block(5)
    assert stat.S_IMODE(os.stat(tier.directory).st_mode) == 0o700


async def test_a_listing_slower_than_its_bound_is_no_outage_and_never_piles_up(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A share so large its listing outlasts the bound: the tier stepped aside for reads
    too (they were fine), and each later write started another listing beside the one
    still running. Reads go on; one listing runs at a time."""
    scan = fmt.scan
    running, most = 0, 0
    lock = threading.Lock()

    def slow_scan(top: Path, now: float, marker_now: float) -> fmt.Listing:
        nonlocal running, most
        with lock:
            running += 1
            most = max(most, running)
        time.sleep(0.5)  # (real time, in the worker thread)
        with lock:
            running -= 1
        return scan(top, now, marker_now)

    monkeypatch.setattr(fmt, "scan", slow_scan)
    tier = await opened(tmp_path, max_bytes=BLOCK)
    run = tier._access.run

    async def listings_in_0_3_s(what: str, fn: Any, *args: Any, timeout_s: Any = None) -> Any:
        # Only the listings' bound is short: 50 ms for every store and read was a stall
        # (an outage) on a loaded machine.
        return await run(what, fn, *args, timeout_s=0.3 if what == "scan" else timeout_s)

    tier._access.run = listings_in_0_3_s  # type: ignore[method-assign]
    for i in range(3):
        await tier.put(BlockKey("f", 1, i), block(i))  # each over a sixteenth of the cap
    assert tier.statistics()["outages"] == 0
    assert await tier.get(BlockKey("f", 1, 2)) == block(2)
    await trio.to_thread.run_sync(time.sleep, 0.6)  # the abandoned listing ends
    assert most == 1


async def test_a_node_whose_claim_expired_leaves_the_claim_another_node_took_over(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    """Node A's fetch outlasts its claim; B takes the claim over. A, done, removed the
    marker whatever it held: B's live claim went, and a third node fetched beside B."""
    a, b = await opened(tmp_path, marker_s=1), await opened(tmp_path, marker_s=20)
    key = BlockKey("ckpt", 7, 0)
    assert await a.fetching(key) is None  # A claims and fetches
    await trio.sleep(2)  # ... for longer than its claim
    assert await b.fetching(key) is None  # B takes the expired claim over
    await a.fetched(key)
    assert a._marker(key).exists()  # B's claim stays
    await b.fetched(key)
    assert not a._marker(key).exists()


async def test_a_damaged_copy_replaced_by_a_good_one_meanwhile_is_not_deleted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A reader finds a damaged copy; before it deletes it, another node publishes a good
    copy in its place. That good copy stays (it was deleted: another fetch from GCS)."""
    a, b = await opened(tmp_path), await opened(tmp_path)
    key = BlockKey("ckpt", 7, 0)
    await a.put(key, block(4))
    path = a.path_of(key)
    good = path.read_bytes()
    damaged = bytearray(good)
    damaged[-1] ^= 0xFF
    path.write_bytes(bytes(damaged))
    read_block = fmt.read_block

    def then_replaced(*args: object, **kwargs: object) -> object:
        answer = read_block(*args, **kwargs)  # type: ignore[arg-type]
        fmt._publish(path, good)  # the other node's good copy, renamed into place
        return answer

    monkeypatch.setattr(fmt, "read_block", then_replaced)
    assert await b.get(key) is None  # the damaged copy: a miss
    assert b.statistics()["corrupt"] == 1
    monkeypatch.undo()
    assert path.exists()
    assert await b.get(key) == block(4)
    path.write_bytes(bytes(damaged))  # damaged, and nobody replaces it: deleted
    assert await b.get(key) is None and not path.exists()


def test_a_claim_on_a_file_system_without_hard_links_is_made_whole_too(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where ``link`` is refused (EPERM: some FUSE and SMB shares), the marker is made with
    O_EXCL and written; a live one is still another node's, an expired one taken over."""
    marker = tmp_path / "top" / "ab" / f"abc.7.65536.0{fmt.MARKER_SUFFIX}"
    (tmp_path / "top").mkdir()

    def no_links(source: object, target: object) -> None:
        raise OSError(errno.EPERM, os.strerror(errno.EPERM))

    monkeypatch.setattr(fmt.os, "link", no_links)
    assert fmt.create_marker(marker, tmp_path / "top", 100.0, 1.0)
    assert float(marker.read_text()) == 100.0
    assert not fmt.create_marker(marker, tmp_path / "top", 100.0, 2.0)
    assert fmt.create_marker(marker, tmp_path / "top", 200.0, 150.0)
    assert float(marker.read_text()) == 200.0
    assert [p.name for p in marker.parent.iterdir()] == [marker.name]  # no temporaries
