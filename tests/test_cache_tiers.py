"""The data tiers: `RamTier` and `SsdTier` against the `Tier` contract, LRU accounting
(hypothesis against a reference model), and the SSD tier's persistence, corruption
detection, file modes, path containment, regex filters, capacity and disk errors."""

from __future__ import annotations

import errno
import hashlib
import logging
import math
import mmap
import os
import re
import stat
import tempfile
from collections import OrderedDict
from pathlib import Path

import pytest
import trio
import trio.testing
from hypothesis import given, settings
from hypothesis import strategies as st

from tierfs.cache import BlockKey, PieceKey
from tierfs.cache import ram as ram_module
from tierfs.cache.buffers import SPARE, BlockBuffers, pooled
from tierfs.cache.ram import RamTier
from tierfs.cache.ssd import SsdTier
from tierfs.cache.ssd_format import (
    AUTO,
    CACHE_DIR_NAME,
    HEADER,
    GiB,
    MiB,
    _auto_capacity,
    _header,
    capacity_for,
)
from tierfs.cache.ssd_seals import Passthrough
from tierfs.core import uploads as uploads_module
from tierfs.core.background import Background
from tierfs.core.blocks import Blocks
from tierfs.core.filesystem import Filesystem, Settings
from tierfs.core.inodes import ROOT_INO
from tierfs.errors import BackendError
from tierfs.storage.memory import MemoryBucket

BUCKET = "bkt"
BLOCK = 64 * 1024
STAT_KEYS = {
    "hits",
    "misses",
    "bytes_read",
    "bytes_written",
    "evictions",
    "used_bytes",
    "capacity_bytes",
    "entries",
    "errors",
}


FOOT = 8192 + 4096
"""What a block of 5,000 bytes with a short name costs on a 4 KiB-fragment volume: its
payload in the object's data file, and its record."""


def payload(key: BlockKey, length: int) -> bytes:
    """Deterministic bytes for one key (the same key always has the same bytes)."""
    seed = f"{key.name}|{key.generation}|{key.index}|".encode("utf-8", "surrogatepass")
    return (seed * (length // len(seed) + 1))[:length]


def cache_files(root: Path) -> list[Path]:
    """The tier's files, without the lock beside each bucket's directory."""
    return sorted(
        p for p in (root / CACHE_DIR_NAME).rglob("*") if p.is_file() and p.suffix != ".lock"
    )


def block_files(root: Path) -> list[Path]:
    """The blocks' records (one per cached block), without data files and seals."""
    return [p for p in cache_files(root) if p.suffix not in (".data", ".seal")]


def temp_files(root: Path) -> list[Path]:
    return [p for p in cache_files(root) if p.name.startswith(".tmp-")]


async def open_ssd(root: Path, max_bytes: int = MiB, **kwargs: object) -> SsdTier:
    kwargs.setdefault("block_size", BLOCK)
    return await SsdTier.create(root, BUCKET, max_bytes, **kwargs)  # type: ignore[arg-type]


@pytest.fixture(params=["ram", "ssd"])
async def tier(request: pytest.FixtureRequest, tmp_path: Path) -> RamTier | SsdTier:
    if request.param == "ram":
        return RamTier(MiB)
    return await open_ssd(tmp_path / "cache")


# --- both tiers ---------------------------------------------------------------------------


async def test_miss_then_put_then_hit(tier: RamTier | SsdTier) -> None:
    key = BlockKey("dir/object", 7, 3)
    data = os.urandom(BLOCK - 5)
    assert await tier.get(key) is None
    await tier.put(key, data)
    assert await tier.get(key) == data
    stats = tier.statistics()
    assert STAT_KEYS <= stats.keys()
    assert (stats["hits"], stats["misses"], stats["entries"]) == (1, 1, 1)
    assert stats["bytes_read"] == stats["bytes_written"] == len(data)
    assert 0 < stats["used_bytes"] <= stats["capacity_bytes"] == MiB


async def test_generation_and_index_are_part_of_the_key(tier: RamTier | SsdTier) -> None:
    await tier.put(BlockKey("a", 1, 0), b"generation one")
    assert await tier.get(BlockKey("a", 2, 0)) is None
    assert await tier.get(BlockKey("a", 1, 1)) is None
    assert await tier.get(BlockKey("b", 1, 0)) is None
    await tier.put(BlockKey("a", 2, 0), b"generation two")
    assert await tier.get(BlockKey("a", 1, 0)) == b"generation one"
    assert await tier.get(BlockKey("a", 2, 0)) == b"generation two"


async def test_discard_removes_only_that_object(tier: RamTier | SsdTier) -> None:
    keys = [BlockKey(n, g, i) for n in ("a", "b", "a/b") for g in (1, 2) for i in (0, 1)]
    for key in keys:
        await tier.put(key, payload(key, 100))
    await tier.discard("a", 1)
    for key in keys:
        gone = key.name == "a" and key.generation == 1
        assert (await tier.get(key) is None) == gone, key
    await tier.discard("a")
    for key in keys:
        assert (await tier.get(key) is None) == (key.name == "a"), key
    await tier.discard("never-cached")
    assert tier.statistics()["entries"] == 8
    if isinstance(tier, SsdTier):
        assert len(block_files(tier.root)) == 8


async def test_block_larger_than_the_capacity_is_not_stored(tmp_path: Path) -> None:
    ram = RamTier(1000)
    await ram.put(BlockKey("small", 1, 0), b"x" * 600)
    await ram.put(BlockKey("big", 1, 0), b"y" * 1001)
    assert await ram.get(BlockKey("big", 1, 0)) is None
    assert await ram.get(BlockKey("small", 1, 0)) == b"x" * 600
    ssd = await open_ssd(tmp_path, max_bytes=8192, block_size=BLOCK)
    await ssd.put(BlockKey("small", 1, 0), b"x" * 600)
    await ssd.put(BlockKey("big", 1, 0), b"y" * 9000)
    assert await ssd.get(BlockKey("big", 1, 0)) is None
    assert await ssd.get(BlockKey("small", 1, 0)) == b"x" * 600
    for tier in (ram, ssd):
        assert tier.statistics()["evictions"] == 0
        assert tier.statistics()["entries"] == 1


async def test_ram_tier_disabled_at_zero() -> None:
    ram = RamTier(0)
    key = BlockKey("a", 1, 0)
    await ram.put(key, b"data")
    await ram.put(BlockKey("empty", 1, 0), b"")
    assert await ram.get(key) is None
    stats = ram.statistics()
    assert (stats["used_bytes"], stats["entries"], stats["capacity_bytes"]) == (0, 0, 0)
    assert stats["misses"] == 1


async def test_ssd_tier_disabled_at_zero(tmp_path: Path) -> None:
    ssd = await open_ssd(tmp_path / "cache", max_bytes=0)
    await ssd.put(BlockKey("a", 1, 0), b"data")
    assert await ssd.get(BlockKey("a", 1, 0)) is None
    assert not (tmp_path / "cache").exists()
    assert ssd.statistics()["capacity_bytes"] == 0


@pytest.mark.parametrize("touch", ["get", "put"])
async def test_use_makes_a_block_most_recent(tmp_path: Path, touch: str) -> None:
    ssd = await open_ssd(tmp_path, max_bytes=2 * FOOT)
    for tier in (RamTier(2 * 5000), ssd):
        a, b, c = (BlockKey(name, 1, 0) for name in "abc")
        await tier.put(a, b"a" * 5000)
        await tier.put(b, b"b" * 5000)
        if touch == "get":
            assert await tier.get(a) == b"a" * 5000
        else:
            await tier.put(a, b"a" * 5000)
        await tier.put(c, b"c" * 5000)
        assert await tier.get(b) is None, tier.name
        assert await tier.get(a) == b"a" * 5000
        assert await tier.get(c) == b"c" * 5000
        assert tier.statistics()["evictions"] == 1
        assert tier.statistics()["bytes_written"] == 3 * 5000
        await tier.put(b, b"b" * 5000)  # an evicted block can come back
        assert await tier.get(b) == b"b" * 5000


async def test_a_block_a_reader_went_past_is_evicted_before_one_not_read_yet() -> None:
    """A fill's block ahead of its reader stays; the one the reader has gone past goes,
    though the reader used it last (`RamTier.demote`)."""
    tier = RamTier(2 * 5000)
    ahead, passed, new = (BlockKey("obj", 1, index) for index in (1, 0, 2))
    await tier.put(ahead, b"1" * 5000)  # brought in by the fill
    await tier.put(passed, b"0" * 5000)
    assert await tier.get(passed) == b"0" * 5000  # read: the most recent now
    tier.demote(passed)  # and gone past
    await tier.put(new, b"2" * 5000)
    assert await tier.get(passed) is None
    assert await tier.get(ahead) == b"1" * 5000


# --- LRU accounting against a reference model --------------------------------------------

KEYS = [
    BlockKey(name, gen, index) for name in ("x", "y/z", "w") for gen in (1, 2) for index in (0, 1)
]
OPS = st.lists(
    st.tuples(
        st.sampled_from(["put", "put", "get", "part", "demote"]), st.integers(0, len(KEYS) - 1)
    ),
    max_size=40,
)
SIZES = st.lists(st.integers(1, 20_000), min_size=len(KEYS), max_size=len(KEYS))


def check_lru(tier: RamTier | SsdTier, capacity: int, ops: list[tuple[str, int]], sizes: list[int]):
    """Apply ``ops`` to ``tier`` and to a plain LRU of (key → cost); they must agree."""

    def cost(key: BlockKey) -> int:
        if isinstance(tier, SsdTier):
            return tier.footprint(key, sizes[KEYS.index(key)])
        return sizes[KEYS.index(key)]

    async def run() -> None:
        model: OrderedDict[BlockKey, int] = OrderedDict()
        evictions = 0
        for op, i in ops:
            key = KEYS[i]
            data = payload(key, sizes[i])
            if op == "put":
                await tier.put(key, data)
                if key in model:
                    model.move_to_end(key)
                elif cost(key) <= capacity:
                    while sum(model.values()) + cost(key) > capacity:
                        model.popitem(last=False)
                        evictions += 1
                    model[key] = cost(key)
            elif op == "get":
                got = await tier.get(key)
                assert got == (data if key in model else None), (op, key)
                if key in model:
                    model.move_to_end(key)
            elif op == "demote":  # a sequential reader went past it: evicted first (RAM)
                if isinstance(tier, RamTier):
                    tier.demote(key)
                    if key in model:
                        model.move_to_end(key, last=False)
            else:  # a random reader's part of the block (the SSD tier: on a kept descriptor)
                start, length = len(data) // 3, max(1, len(data) // 3)
                part = await tier.read_part(key, start, length)
                assert part == (data[start : start + length] if key in model else None), (op, key)
                if key in model:  # a part read is a use of its block
                    model.move_to_end(key)
            stats = tier.statistics()
            assert stats["used_bytes"] == sum(model.values()) <= capacity
            assert stats["entries"] == len(model)
            assert stats["evictions"] == evictions
        if isinstance(tier, SsdTier):
            files = block_files(tier.root)
            assert len(files) == len(model)
            again = await open_ssd(tier.root, capacity, block_size=20_000)
            assert again.statistics()["used_bytes"] == sum(model.values())
            for key in model:
                assert await again.get(key) == payload(key, sizes[KEYS.index(key)])
            assert again.statistics()["bytes_written"] == 0

    trio.run(run)


@settings(max_examples=100, deadline=None)
@given(ops=OPS, sizes=SIZES, capacity=st.integers(1, 60_000))
def test_ram_lru_matches_model(ops: list[tuple[str, int]], sizes: list[int], capacity: int) -> None:
    check_lru(RamTier(capacity), capacity, ops, sizes)


@settings(max_examples=80, deadline=None)
@given(ops=OPS, sizes=SIZES, capacity=st.integers(1, 160_000))
def test_ssd_lru_matches_model(ops: list[tuple[str, int]], sizes: list[int], capacity: int) -> None:
    # As in every object, only a last block is short: block 0 of each object is full
    # (after a remount, a block's length follows from its index and its file's size).
    sizes = [20_000 if key.index == 0 else size for key, size in zip(KEYS, sizes, strict=True)]
    with tempfile.TemporaryDirectory() as root:
        tier = trio.run(lambda: open_ssd(Path(root), capacity, block_size=20_000))
        check_lru(tier, capacity, ops, sizes)


@pytest.mark.parametrize("blocks", [2, 10])
async def test_ssd_concurrent_puts_and_gets_keep_the_invariants(
    tmp_path: Path, blocks: int
) -> None:
    capacity = blocks * FOOT
    ssd = await open_ssd(tmp_path, capacity, limiter=trio.CapacityLimiter(8))
    keys = [BlockKey(f"obj{n}", 1, i) for n in range(8) for i in range(4)]
    worst = 0

    async def worker(offset: int) -> None:
        for j in range(40):
            key = keys[(offset * 7 + j * 3) % len(keys)]
            await ssd.put(key, payload(key, 5000))
            got = await ssd.get(keys[(offset + j) % len(keys)])
            assert got is None or got == payload(keys[(offset + j) % len(keys)], 5000)

    async def monitor() -> None:
        nonlocal worst
        while True:
            stats = ssd.statistics()
            worst = max(worst, stats["used_bytes"] + stats["pending_bytes"])
            await trio.sleep(0)

    async with trio.open_nursery() as outer:
        outer.start_soon(monitor)
        async with trio.open_nursery() as workers:
            for offset in range(6):
                workers.start_soon(worker, offset)
        outer.cancel_scope.cancel()
    stats = ssd.statistics()
    assert 0 < worst <= capacity
    assert stats["pending_bytes"] == 0
    assert stats["evictions"] > 0
    assert len(block_files(tmp_path)) == stats["entries"]
    assert stats["used_bytes"] == stats["entries"] * FOOT
    assert stats["errors"] == stats["corrupt"] == 0


# --- SSD: persistence and corruption -----------------------------------------------------


async def test_ssd_blocks_survive_a_remount(tmp_path: Path) -> None:
    first = await open_ssd(tmp_path)
    keys = [BlockKey("model/weights.bin", 1712, i) for i in range(3)]
    for key in keys:
        await first.put(key, payload(key, BLOCK if key.index < 2 else 123))
    second = await open_ssd(tmp_path)
    assert second.statistics()["entries"] == 3
    assert second.statistics()["used_bytes"] == first.statistics()["used_bytes"]
    for key in keys:
        assert await second.get(key) == payload(key, BLOCK if key.index < 2 else 123)
    stats = second.statistics()
    assert (stats["hits"], stats["misses"], stats["bytes_written"]) == (3, 0, 0)
    assert await second.get(BlockKey("model/weights.bin", 1713, 0)) is None


async def test_ssd_remount_orders_lru_by_last_use_and_enforces_a_smaller_limit(
    tmp_path: Path,
) -> None:
    first = await open_ssd(tmp_path)
    keys = [BlockKey(name, 1, 0) for name in "abcd"]
    for key in keys:
        await first.put(key, payload(key, 5000))
    for age, key in zip((40, 10, 30, 20), keys, strict=True):
        os.utime(first.path_of(key), (1_000_000 - age, 1_000_000 - age))
    before = first.path_of(keys[0]).stat().st_mtime
    assert await first.get(keys[0]) is not None
    assert first.path_of(keys[0]).stat().st_mtime > before  # a hit records its use on disk

    second = await open_ssd(tmp_path, max_bytes=2 * FOOT)
    assert second.statistics()["evictions"] == 2
    present = [k.name for k in keys if await second.get(k) is not None]
    assert present == ["a", "b"]  # c (age 30) and d (age 20) were the least recently used
    assert len(block_files(tmp_path)) == 2


def data_file(record: Path) -> Path:
    """The object's data file, beside the record of one of its blocks."""
    return record.with_name(record.name.rsplit(".", 1)[0] + ".data")


def damage_flip_payload(path: Path) -> None:
    index = int(path.name.rsplit(".", 1)[1])
    with data_file(path).open("r+b") as f:
        f.seek(index * BLOCK + 1234)
        byte = f.read(1)[0]
        f.seek(index * BLOCK + 1234)
        f.write(bytes([byte ^ 0x40]))


def damage_flip_name(path: Path) -> None:
    raw = bytearray(path.read_bytes())
    raw[-10] ^= 0x40
    path.write_bytes(bytes(raw))


def damage_flip_generation(path: Path) -> None:
    raw = bytearray(path.read_bytes())
    raw[12] ^= 0x01
    path.write_bytes(bytes(raw))


def damage_truncate(path: Path) -> None:
    with path.open("r+b") as f:
        f.truncate(path.stat().st_size // 2)


def damage_short_header(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: HEADER.size - 3])


def damage_empty(path: Path) -> None:
    path.write_bytes(b"")


def damage_garbage_header(path: Path) -> None:
    raw = path.read_bytes()
    path.write_bytes(b"\xa5" * HEADER.size + raw[HEADER.size :])


def damage_append(path: Path) -> None:
    with path.open("ab") as f:
        f.write(b"trailing")


def damage_other_block(path: Path) -> None:
    sibling = path.with_name(path.name[:-1] + "1")  # block 1 of the same object
    path.write_bytes(sibling.read_bytes())


def damage_other_object(path: Path) -> None:
    # A valid block of another object, as a name-hash collision would leave.
    data = payload(BlockKey("data/shard-9", 99, 0), 3000)
    path.write_bytes(_header(b"data/shard-9", 99, 0, BLOCK, data) + data)


def damage_symlink(path: Path) -> None:
    outside = path.parents[5] / "outside"
    outside.write_bytes(path.read_bytes())  # a perfect copy, but not our file
    path.unlink()
    path.symlink_to(outside)


DAMAGE = [
    damage_flip_payload,
    damage_flip_name,
    damage_flip_generation,
    damage_truncate,
    damage_short_header,
    damage_empty,
    damage_garbage_header,
    damage_append,
    damage_other_block,
    damage_other_object,
    damage_symlink,
]


@pytest.mark.parametrize("damage", DAMAGE, ids=lambda f: f.__name__.removeprefix("damage_"))
@pytest.mark.parametrize("remount", [False, True], ids=["mounted", "remounted"])
async def test_ssd_damaged_block_is_detected_deleted_and_refetched(
    tmp_path: Path, damage: object, remount: bool, caplog: pytest.LogCaptureFixture
) -> None:
    root = tmp_path / "cache"
    ssd = await open_ssd(root)
    key, other = BlockKey("data/shard-0", 99, 0), BlockKey("data/shard-0", 99, 1)
    await ssd.put(key, payload(key, 3000))
    await ssd.put(other, payload(other, 2000))
    path = ssd.path_of(key)
    damage(path)  # type: ignore[operator]
    if remount:
        ssd = await open_ssd(root)
    with caplog.at_level(logging.WARNING, logger="tierfs.cache"):
        assert await ssd.get(key) is None
    assert "damaged" in caplog.text
    stats = ssd.statistics()
    assert (stats["corrupt"], stats["misses"], stats["entries"]) == (1, 1, 1)
    assert not path.exists() and not path.is_symlink()
    assert stats["used_bytes"] == ssd.footprint(other, 2000)
    if damage is damage_symlink:
        assert (tmp_path / "outside").exists()  # the link was removed, never its target
    await ssd.put(key, payload(key, 3000))
    assert await ssd.get(key) == payload(key, 3000)
    assert await ssd.get(other) == payload(other, 2000)
    assert ssd.statistics()["corrupt"] == 1


@pytest.mark.parametrize("damage", ["truncate", "delete", "symlink"])
async def test_ssd_damaged_data_file_drops_its_object(tmp_path: Path, damage: str) -> None:
    ssd = await open_ssd(tmp_path / "cache")
    keys = [BlockKey("ckpt/shard", 7, i) for i in range(3)]
    for key in keys:
        await ssd.put(key, payload(key, BLOCK if key.index < 2 else 500))
    data = ssd.data_path_of("ckpt/shard", 7)
    if damage == "truncate":
        os.truncate(data, 2 * BLOCK + 100)  # the last block is short now
    elif damage == "delete":
        data.unlink()
    else:
        outside = tmp_path / "outside"
        outside.write_bytes(data.read_bytes())  # a perfect copy, but not our file
        data.unlink()
        data.symlink_to(outside)
    ssd = await open_ssd(tmp_path / "cache")
    assert await ssd.get(keys[2]) is None
    assert ssd.statistics()["corrupt"] == 1
    if damage != "truncate":  # no data file of ours: nothing of the object is left
        assert ssd.statistics()["entries"] == 0
        assert block_files(tmp_path / "cache") == []
        assert not data.is_symlink()
    for key in keys:  # and it can be stored again
        await ssd.put(key, payload(key, BLOCK if key.index < 2 else 500))
        assert await ssd.get(key) == payload(key, BLOCK if key.index < 2 else 500)
    assert (tmp_path / "outside").exists() or damage != "symlink"


# --- SSD: seals and passthrough -----------------------------------------------------------


def shard(n: int = 3, last: int = 500) -> list[tuple[BlockKey, bytes]]:
    keys = [BlockKey("ckpt/shard", 7, i) for i in range(n)]
    return [(key, payload(key, BLOCK if key.index < n - 1 else last)) for key in keys]


SHARD_SIZE = 2 * BLOCK + 500


async def test_ssd_seal_needs_the_whole_object_written_or_checked_here(tmp_path: Path) -> None:
    ssd = await open_ssd(tmp_path)
    blocks = shard()
    for key, data in blocks[:2]:
        await ssd.put(key, data)
    assert not await ssd.seal("ckpt/shard", 7, SHARD_SIZE)  # block 2 is missing
    assert await ssd.passthrough("ckpt/shard", 7, SHARD_SIZE) is None
    await ssd.put(*blocks[2])
    assert not await ssd.seal("ckpt/shard", 7, SHARD_SIZE + 1)  # not that object's size
    assert await ssd.seal("ckpt/shard", 7, SHARD_SIZE)
    pinned = await ssd.passthrough("ckpt/shard", 7, SHARD_SIZE)
    assert pinned is not None
    assert pinned.path.read_bytes() == b"".join(data for _, data in blocks)
    ssd.unpin(pinned)
    # Another process (a remount) trusts the seal while the file is as it was sealed ...
    again = await open_ssd(tmp_path)
    pinned = await again.passthrough("ckpt/shard", 7, SHARD_SIZE)
    assert pinned is not None and again.statistics()["hits"] == 0  # nothing read
    again.unpin(pinned)
    # ... but not one that was not sealed: it must check every block first.
    await again.discard("ckpt/shard")
    for key, data in blocks:
        await again.put(key, data)
    third = await open_ssd(tmp_path)
    assert await third.passthrough("ckpt/shard", 7, SHARD_SIZE) is None
    for key, data in blocks:
        assert await third.get(key) == data  # checked: now this process may seal it
    assert await third.passthrough("ckpt/shard", 7, SHARD_SIZE) is not None


@pytest.mark.parametrize("change", ["flip", "same bytes", "replace", "truncate"])
async def test_ssd_seal_breaks_when_the_file_changes(tmp_path: Path, change: str) -> None:
    ssd = await open_ssd(tmp_path)
    blocks = shard()
    for key, data in blocks:
        await ssd.put(key, data)
    assert await ssd.seal("ckpt/shard", 7, SHARD_SIZE)
    path = ssd.data_path_of("ckpt/shard", 7)
    raw = bytearray(path.read_bytes())
    if change == "flip":
        raw[BLOCK + 10] ^= 1
        path.write_bytes(bytes(raw))
    elif change == "same bytes":  # rewritten in place with the very same bytes
        path.write_bytes(bytes(raw))
    elif change == "replace":  # a copy put in its place (a restore from backup)
        copy = path.with_name("copy")
        copy.write_bytes(bytes(raw))
        os.replace(copy, path)
    else:
        os.truncate(path, SHARD_SIZE - 1)
    again = await open_ssd(tmp_path)
    assert await again.passthrough("ckpt/shard", 7, SHARD_SIZE) is None
    damaged = 0
    for key, data in blocks:
        got = await again.get(key)
        damaged += got is None
        assert got in (data, None)
    assert damaged == (0 if change in ("same bytes", "replace") else 1)


async def pinned_shard(
    root: Path, max_bytes: int
) -> tuple[SsdTier, list[tuple[BlockKey, bytes]], Passthrough]:
    """An SSD tier holding a whole shard, handed to the kernel (pinned) as passthrough."""
    ssd = await open_ssd(root, max_bytes=max_bytes)
    blocks = shard()
    for key, data in blocks:
        await ssd.put(key, data)
    pinned = await ssd.passthrough("ckpt/shard", 7, SHARD_SIZE)
    assert pinned is not None
    return ssd, blocks, pinned


async def push_out(ssd: SsdTier, count: int) -> None:
    """Put ``count`` blocks of other objects: the oldest go."""
    for n in range(count):
        key = BlockKey(f"other{n}", 1, 0)
        await ssd.put(key, payload(key, BLOCK))


async def test_ssd_a_file_the_kernel_reads_is_evicted_last(tmp_path: Path) -> None:
    """A shard read through passthrough looks unused to the tier (the kernel reads it
    directly); puts of other blocks evict each other, not it: unlinked, its file would
    free nothing while open, and its next open would fetch it all again."""
    ssd, blocks, pinned = await pinned_shard(tmp_path, 4 * (BLOCK + 4096))
    await push_out(ssd, 3)  # room for one more block: the others take turns in it
    assert pinned.path.exists()
    assert [await ssd.get(key) == data for key, data in blocks] == [True] * 3
    assert ssd.statistics()["entries"] == 4 and ssd.statistics()["evictions"] == 2
    ssd.unpin(pinned)  # not read through the kernel now: evicted as any other
    for n in range(4):
        key = BlockKey(f"later{n}", 1, 0)
        await ssd.put(key, payload(key, BLOCK))
    assert not pinned.path.exists()


async def test_ssd_pinned_file_is_unlinked_never_punched(tmp_path: Path) -> None:
    ssd, blocks, pinned = await pinned_shard(tmp_path, 3 * (BLOCK + 4096) + 4096)
    with pinned.path.open("rb") as kernel_copy:  # as the kernel holds its backing file
        await push_out(ssd, 3)  # nothing else to evict: the shard's blocks
        assert not pinned.path.exists()  # the whole file went, at its first evicted block
        assert ssd.statistics()["entries"] == 3  # ... and with it every block of the shard
        assert kernel_copy.read() == b"".join(data for _, data in blocks)  # intact
    ssd.unpin(pinned)
    for key, _ in blocks:
        assert await ssd.get(key) is None


async def test_ssd_a_file_mapped_through_passthrough_is_never_punched_after_close(
    tmp_path: Path,
) -> None:
    """``np.load(mmap_mode='r')``, safetensors: open, mmap, close, read on. The mapping
    reads the backing file, so the close's RELEASE unpins it while it is still in use, and
    the eviction of one block then punched a hole the mapping read as zeros. A file once
    handed to the kernel is unlinked whole instead (the mapping keeps its inode)."""
    ssd, blocks, pinned = await pinned_shard(tmp_path, 3 * (BLOCK + 4096) + 4096)
    with pinned.path.open("rb") as kernel_copy:
        mapped = mmap.mmap(kernel_copy.fileno(), 0, prot=mmap.PROT_READ)
    ssd.unpin(pinned)  # the close's RELEASE: the mapping lives on
    try:
        await push_out(ssd, 1)  # block 0 of the shard, the oldest
        assert mapped[:] == b"".join(data for _, data in blocks)  # never zeros
    finally:
        mapped.close()
    assert ssd.statistics()["corrupt"] == 0


async def test_ssd_a_put_into_a_file_made_anew_is_never_unlinked_under_it(
    tmp_path: Path,
) -> None:
    """An object whose old file the kernel still reads (pinned), evicted whole, then put
    again into a new file: a drop of it while that put wrote took the old pin for the new
    file and unlinked the file being written (its block then read as zeros). A file being
    written is punched, never unlinked."""
    ssd, blocks, pinned = await pinned_shard(tmp_path, 3 * (BLOCK + 4096) + 4096)
    await push_out(ssd, 1)  # the pinned shard goes whole, its file unlinked (the pin stays)
    assert await ssd.get(blocks[0][0]) is None
    await ssd.put(*blocks[1])  # into a new data file
    obj = ssd.data_path_of("ckpt/shard", 7).name.removesuffix(".data")
    (stem,) = ssd._objects[obj]
    ssd._writing[obj] += 1  # another put into that file is under way
    try:
        ssd._forget(stem)  # evicted meanwhile
        (drop,) = ssd._drops([stem])
        assert drop.punch is not None  # punched: the file being written stays
    finally:
        ssd._writing[obj] -= 1
        ssd._release([drop])
    ssd.unpin(pinned)


async def test_ssd_unpinned_eviction_punches_only_that_block(tmp_path: Path) -> None:
    ssd = await open_ssd(tmp_path, max_bytes=3 * (BLOCK + 4096) + 4096)
    blocks = shard()
    for key, data in blocks:
        await ssd.put(key, data)
    key = BlockKey("other", 1, 0)
    await ssd.put(key, payload(key, BLOCK))  # evicts block 0 of the shard, the oldest
    path = ssd.data_path_of("ckpt/shard", 7)
    raw = path.read_bytes()
    assert raw[:BLOCK] == bytes(BLOCK)  # a hole now
    assert os.stat(path).st_blocks * 512 < SHARD_SIZE
    assert await ssd.get(blocks[0][0]) is None
    assert [await ssd.get(k) == d for k, d in blocks[1:]] == [True, True]
    assert ssd.statistics()["corrupt"] == 0


async def test_ssd_part_reads_take_no_thread_and_never_read_a_file_that_went(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Parts of trusted blocks are read on the trio thread from a kept descriptor (a
    thread hop cost more than the read); that descriptor is closed when its object's
    last block goes, so a data file made anew under the same name is the one read."""
    ssd = await open_ssd(tmp_path, max_bytes=2 * (BLOCK + 4096))
    blocks = shard()
    await ssd.put(*blocks[1])
    threads = 0
    real = trio.to_thread.run_sync

    async def counted(*args: object, **kwargs: object) -> object:
        nonlocal threads
        threads += 1
        return await real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(trio.to_thread, "run_sync", counted)
    key, data = blocks[1]
    for offset in (0, 4096, BLOCK - 4096):
        assert await ssd.read_part(key, offset, 4096) == data[offset : offset + 4096]
    assert threads == 0
    for n in range(2):  # push the shard out: its data file is unlinked
        other = BlockKey(f"other{n}", 1, 0)
        await ssd.put(other, payload(other, BLOCK))
    assert not ssd.data_path_of("ckpt/shard", 7).exists()
    assert await ssd.read_part(key, 0, 4096) is None
    changed = bytes(reversed(data))  # other bytes than the old file held, to tell them apart
    await ssd.put(key, changed)
    assert await ssd.read_part(key, 4096, 4096) == changed[4096:8192]


async def test_ssd_open_deletes_the_old_format_and_orphans(tmp_path: Path) -> None:
    bucket_hash = hashlib.sha256(BUCKET.encode()).hexdigest()[:16]
    old = tmp_path / CACHE_DIR_NAME / bucket_hash / "ab"  # format 2: one file per block
    old.mkdir(parents=True)
    (old / ("ab" + "0" * 30 + ".1.65536.0")).write_bytes(b"TFSB" + bytes(100))
    ssd = await open_ssd(tmp_path)
    blocks = shard()
    for key, data in blocks:
        await ssd.put(key, data)
    for key, _ in blocks:  # records gone (a crash between a data write and its record)
        ssd.path_of(key).unlink()
    again = await open_ssd(tmp_path)
    assert not old.parent.exists()
    assert again.statistics()["entries"] == again.statistics()["used_bytes"] == 0
    assert cache_files(tmp_path) == []  # the orphaned data file went too


async def test_ssd_block_deleted_behind_its_back_is_a_plain_miss(tmp_path: Path) -> None:
    ssd = await open_ssd(tmp_path)
    key = BlockKey("a", 1, 0)
    await ssd.put(key, b"data")
    ssd.path_of(key).unlink()
    assert await ssd.get(key) is None
    stats = ssd.statistics()
    assert stats["corrupt"] == stats["errors"] == stats["entries"] == stats["used_bytes"] == 0


async def test_ssd_open_removes_temporaries_left_by_a_crash(tmp_path: Path) -> None:
    ssd = await open_ssd(tmp_path)
    key = BlockKey("a", 1, 0)
    await ssd.put(key, b"data")
    torn = ssd.path_of(key).with_name(".tmp-" + ssd.path_of(key).name + "-deadbeef")
    torn.write_bytes(b"half a blo")
    again = await open_ssd(tmp_path)
    assert temp_files(tmp_path) == []
    assert again.statistics()["entries"] == 1
    assert await again.get(key) == b"data"


async def test_ssd_block_size_change_never_serves_old_blocks(tmp_path: Path) -> None:
    old = await open_ssd(tmp_path, max_bytes=4 * 8192, block_size=BLOCK)
    key = BlockKey("a", 1, 1)
    await old.put(key, payload(key, 5000))
    new = await open_ssd(tmp_path, max_bytes=4 * FOOT, block_size=BLOCK // 2)
    assert await new.get(key) is None  # block 1 is another byte range now
    assert new.statistics()["used_bytes"] == FOOT  # but its file is accounted ...
    for i in range(4):
        await new.put(BlockKey("b", 1, i), b"z" * 5000)
    assert not old.path_of(key).exists()  # ... and ages out
    assert not old.data_path_of(key.name, key.generation).exists()
    assert new.statistics()["used_bytes"] == 4 * FOOT


# --- SSD: files, names, filters ----------------------------------------------------------


@pytest.mark.parametrize("umask", [0o000, 0o022, 0o077, 0o777])
async def test_ssd_files_0600_and_directories_0700_whatever_the_umask(
    tmp_path: Path, umask: int
) -> None:
    old = os.umask(umask)
    try:
        ssd = await open_ssd(tmp_path / "cache")
        for n in range(20):
            await ssd.put(BlockKey(f"f{n}", 1, 0), b"data")
    finally:
        os.umask(old)
    assert await ssd.get(BlockKey("f3", 1, 0)) == b"data"
    dirs = [tmp_path / "cache", *(p for p in (tmp_path / "cache").rglob("*") if p.is_dir())]
    files = block_files(tmp_path / "cache")
    assert len(files) == 20 and len(dirs) >= 4
    assert {stat.S_IMODE(d.stat().st_mode) for d in dirs} == {0o700}
    assert {stat.S_IMODE(f.stat().st_mode) for f in files} == {0o600}


HOSTILE_NAMES = [
    "../../etc/passwd",
    "/abs/path",
    "a/../../b",
    "..",
    ".",
    "",
    "x" * 1024,
    "é" * 512,
    "line\nbreak\r\n",
    "nul\x00byte",
    "surrogate\udcff",
    "dir/",
    "~/.ssh/authorized_keys",
]


async def test_ssd_no_object_name_escapes_the_cache_dir(tmp_path: Path) -> None:
    root = tmp_path / "cache"
    ssd = await open_ssd(root)
    for n, name in enumerate(HOSTILE_NAMES):
        await ssd.put(BlockKey(name, n + 1, n), payload(BlockKey(name, n + 1, n), 500))
    for n, name in enumerate(HOSTILE_NAMES):
        assert await ssd.get(BlockKey(name, n + 1, n)) == payload(BlockKey(name, n + 1, n), 500)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cache"]
    real_root = os.path.realpath(root)
    everything = list(root.rglob("*"))
    assert len(block_files(root)) == len(HOSTILE_NAMES)
    assert len([p for p in everything if p.suffix == ".data"]) == len(HOSTILE_NAMES)
    for path in everything:
        assert os.path.realpath(path).startswith(real_root + os.sep)
        assert not path.is_symlink()
    again = await open_ssd(root)
    assert again.statistics()["entries"] == len(HOSTILE_NAMES)
    await again.discard("../../etc/passwd")
    assert again.statistics()["entries"] == len(HOSTILE_NAMES) - 1


async def test_ssd_header_names_the_object_for_diagnostics(tmp_path: Path) -> None:
    ssd = await open_ssd(tmp_path)
    key = BlockKey("datasets/imagenet/train-00001.tar", 1_712_345_678_901_234, 5)
    await ssd.put(key, b"payload")
    raw = ssd.path_of(key).read_bytes()
    assert raw.startswith(b"TFSB")
    assert raw[HEADER.size :] == key.name.encode()
    assert key.name not in str(ssd.path_of(key))
    data = ssd.data_path_of(key.name, key.generation).read_bytes()
    assert data == bytes(5 * BLOCK) + b"payload"  # the object's bytes at their own offsets


async def test_ssd_include_and_exclude_regex_match_bucket_slash_name(tmp_path: Path) -> None:
    ssd = await open_ssd(tmp_path, include=re.compile(r"^bkt/data/"), exclude=re.compile(r"\.tmp$"))
    wanted, excluded, outside = (
        BlockKey("data/a", 1, 0),
        BlockKey("data/a.tmp", 1, 0),
        BlockKey("other/b", 1, 0),
    )
    for key in (wanted, excluded, outside):
        await ssd.put(key, b"bytes")
    assert await ssd.get(wanted) == b"bytes"
    assert await ssd.get(excluded) is None
    assert await ssd.get(outside) is None
    assert len(block_files(tmp_path)) == 1
    only_names = await open_ssd(tmp_path / "2", include=re.compile(r"^data/"))
    await only_names.put(wanted, b"bytes")  # the bucket comes first: ^data/ never matches
    assert only_names.statistics()["entries"] == 0


async def test_ssd_max_entries_bounds_the_index(tmp_path: Path) -> None:
    ssd = await open_ssd(tmp_path, max_entries=3)
    for n in range(5):
        await ssd.put(BlockKey(f"tiny{n}", 1, 0), b"t")
    assert ssd.statistics()["entries"] == 3
    assert len(block_files(tmp_path)) == 3
    assert await ssd.get(BlockKey("tiny0", 1, 0)) is None
    assert await ssd.get(BlockKey("tiny4", 1, 0)) == b"t"


async def test_ssd_misuse_is_loud(tmp_path: Path) -> None:
    ssd = SsdTier(tmp_path, BUCKET, MiB, block_size=BLOCK)
    with pytest.raises(RuntimeError, match="before open"):
        await ssd.get(BlockKey("a", 1, 0))
    await ssd.open()
    with pytest.raises(ValueError, match="block size"):
        await ssd.put(BlockKey("a", 1, 0), b"x" * (BLOCK + 1))
    with pytest.raises(ValueError, match="unsigned"):
        await ssd.get(BlockKey("a", -1, 0))


# --- SSD: capacity and disk errors -------------------------------------------------------


def test_capacity_for() -> None:
    st_ = os.statvfs("/tmp")
    free = st_.f_bavail * st_.f_frsize
    auto = capacity_for(Path("/tmp/does/not/exist/yet"), -1)
    assert 0 < auto < free
    assert capacity_for(Path("/tmp"), 0) == 0
    assert capacity_for(Path("/tmp"), 5) == 5 * MiB
    with pytest.raises(ValueError):
        capacity_for(Path("/tmp"), -2)
    assert _auto_capacity(100 * GiB, 10 * GiB, 5 * GiB) == 14 * GiB  # margin: 1 GiB
    assert _auto_capacity(10 * GiB, 2 * GiB, 0) == 2 * GiB - GiB // 2  # margin: 5% of 10 GiB
    assert _auto_capacity(10 * GiB, 100 * MiB, 0) == 0


async def test_ssd_auto_capacity_counts_its_own_files(tmp_path: Path) -> None:
    ssd = await open_ssd(tmp_path, max_bytes=AUTO)
    st_ = os.statvfs(tmp_path)
    assert 0 < ssd.statistics()["capacity_bytes"] < st_.f_bavail * st_.f_frsize
    await ssd.put(BlockKey("a", 1, 0), b"data")
    assert await ssd.get(BlockKey("a", 1, 0)) == b"data"


class FakeVolume:
    """What os.statvfs answers for a 320 MiB volume (margin: 16 MiB) with ``free_bytes``."""

    def __init__(self, free_bytes: int) -> None:
        self.f_frsize = 4096
        self.f_blocks = 20 * 4096
        self.f_bavail = free_bytes // 4096


async def test_ssd_auto_capacity_keeps_what_the_cache_already_holds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ssd = await open_ssd(tmp_path)
    for n in range(4):
        await ssd.put(BlockKey(f"b{n}", 1, 0), b"x" * 5000)
    margin = 16 * MiB
    monkeypatch.setattr(os, "statvfs", lambda path: FakeVolume(margin + 8192))
    again = await open_ssd(tmp_path, max_bytes=AUTO)  # a full volume: all free space is ours
    assert again.statistics()["capacity_bytes"] == 4 * FOOT + 8192
    assert again.statistics()["entries"] == 4
    assert again.statistics()["evictions"] == 0
    assert capacity_for(tmp_path, -1) == 8192


@pytest.mark.parametrize("failing", ["open", "write", "replace"])
async def test_ssd_disk_full_is_logged_counted_and_leaves_nothing(
    tmp_path: Path, failing: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    ssd = await open_ssd(tmp_path)
    kept = BlockKey("kept", 1, 0)
    await ssd.put(kept, b"kept")

    def disk_full(*args: object, **kwargs: object) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    key = BlockKey("big", 1, 0)
    with monkeypatch.context() as patch, caplog.at_level(logging.WARNING, "tierfs.cache"):
        patch.setattr(os, failing, disk_full)
        await ssd.put(key, b"x" * 5000)
    assert "No space left on device" in caplog.text
    stats = ssd.statistics()
    assert (stats["errors"], stats["entries"], stats["pending_bytes"]) == (1, 1, 0)
    assert stats["used_bytes"] == ssd.footprint(kept, 4)
    assert temp_files(tmp_path) == []
    assert not ssd.path_of(key).exists()
    assert await ssd.get(key) is None
    await ssd.put(key, b"x" * 5000)
    assert await ssd.get(key) == b"x" * 5000
    assert await ssd.get(kept) == b"kept"


async def test_ssd_failures_of_one_kind_warn_once_and_all_count(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    ssd = await open_ssd(tmp_path)

    def disk_full(*args: object, **kwargs: object) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    with monkeypatch.context() as patch, caplog.at_level(logging.DEBUG, "tierfs.cache"):
        patch.setattr(os, "open", disk_full)
        for index in range(3):
            await ssd.put(BlockKey("big", 1, index), b"x" * 100)
    stores = [r for r in caplog.records if "cannot store" in r.getMessage()]
    assert [r.levelno for r in stores] == [logging.WARNING, logging.DEBUG, logging.DEBUG]
    assert "tierfs stats" in stores[0].getMessage()
    assert ssd.statistics()["errors"] == 3


async def test_ssd_unreadable_block_is_dropped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    ssd = await open_ssd(tmp_path)
    key = BlockKey("a", 1, 0)
    await ssd.put(key, b"data")

    def io_error(*args: object, **kwargs: object) -> bytes:
        raise OSError(errno.EIO, os.strerror(errno.EIO))

    with monkeypatch.context() as patch, caplog.at_level(logging.WARNING, "tierfs.cache"):
        patch.setattr(os, "pread", io_error)
        assert await ssd.get(key) is None
    assert "Input/output error" in caplog.text
    stats = ssd.statistics()
    assert (stats["errors"], stats["corrupt"], stats["entries"]) == (1, 0, 0)
    assert not ssd.path_of(key).exists()


# -- Blocks over the tiers ---------------------------------------------------------------------


async def blocks_over(bucket: MemoryBucket, tmp_path: Path, block: int) -> Blocks:
    ssd = await open_ssd(tmp_path, max_bytes=MiB, block_size=block)
    return Blocks(bucket, [RamTier(MiB), ssd], block_size=block, downloads=trio.CapacityLimiter(4))


async def test_fill_of_an_object_the_ssd_tier_holds_reads_nothing(tmp_path: Path) -> None:
    bucket = MemoryBucket()
    data = os.urandom(10 * 4096 + 100)
    info = bucket.put("obj", data)
    first = await blocks_over(bucket, tmp_path, 4096)
    await first.fill("obj", info.generation, len(data), None)
    assert first.gcs_blocks == 11
    # A remount: empty RAM tier, the same cache dir.
    again = await blocks_over(bucket, tmp_path, 4096)
    await again.fill("obj", info.generation, len(data), None)
    ram, ssd = again.tiers
    assert again.gcs_blocks == 0
    assert ssd.statistics()["hits"] == 0  # not one block file was read
    assert ram.statistics()["used_bytes"] == 0  # nor pushed into RAM
    key = BlockKey("obj", info.generation, 10)
    assert await again.get(key, len(data)) == data[40960:]


async def test_concurrent_gets_share_one_read_of_a_block_file(tmp_path: Path) -> None:
    bucket = MemoryBucket()
    data = os.urandom(4096)
    info = bucket.put("obj", data)
    first = await blocks_over(bucket, tmp_path, 4096)
    await first.fill("obj", info.generation, len(data), None)
    again = await blocks_over(bucket, tmp_path, 4096)
    key = BlockKey("obj", info.generation, 0)
    got: list[bytes] = []

    async def get() -> None:
        got.append(await again.get(key, len(data)))

    async with trio.open_nursery() as nursery:
        for _ in range(5):
            nursery.start_soon(get)
    assert got == [data] * 5
    assert again.tiers[1].statistics()["hits"] == 1
    assert again.shared_waits == 4
    assert again.gcs_blocks == 0


# --- unmount and the SSD-tier copy of an upload ---------------------------------------------


async def test_unmount_waits_for_the_ssd_copy_of_an_upload(tmp_path: Path) -> None:
    """A file written through the mount is copied into the SSD tier in the background after
    its upload. `Filesystem.finish` (unmount) waits for that copy and seals the file, so that
    a restore right after the remount reads it from disk; cancelled, the copy would be partial
    and the restore would read the rest from GCS."""
    bucket = MemoryBucket(BUCKET)
    ssd = await open_ssd(tmp_path / "cache", max_bytes=MiB)
    gate = trio.Event()
    put = ssd.put

    async def gated_put(key: BlockKey, data: bytes) -> None:
        await gate.wait()
        await put(key, data)

    ssd.put = gated_put  # type: ignore[method-assign]
    blocks = Blocks(bucket, [ssd], block_size=BLOCK, downloads=trio.CapacityLimiter(4))
    fs = Filesystem(bucket, Settings(temp_dir=str(tmp_path), file_cache=True), blocks=blocks)
    data = os.urandom(3 * BLOCK + 5)
    finished = trio.Event()
    async with trio.open_nursery() as nursery:
        with fs.background.attached(nursery):
            handle, _ = await fs.create(ROOT_INO, "ckpt", os.O_WRONLY)
            await fs.write(handle.fh, 0, data)
            await fs.release(handle.fh)  # uploaded; its copy waits at the gate
            assert bucket.get("ckpt") == data

            async def unmount() -> None:
                await fs.finish()
                finished.set()

            nursery.start_soon(unmount)
            await trio.testing.wait_all_tasks_blocked()
            assert not finished.is_set()  # waiting for the copy
            gate.set()
            await finished.wait()
            nursery.cancel_scope.cancel()
    fs.close()
    generation = (await bucket.stat("ckpt")).generation
    assert all(ssd.holds(BlockKey("ckpt", generation, i)) for i in range(4))
    pinned = await blocks.passthrough("ckpt", generation, len(data))
    assert pinned is not None  # sealed: the next mount may hand it to the kernel
    blocks.unpin(pinned)


async def test_ssd_copies_of_uploads_run_one_at_a_time_and_a_backlog_is_bounded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Copies of uploads into the SSD tier run one at a time (beside many uploads, more
    threads only contend for the GIL), and once `CACHE_COPIES_WAITING` wait, an upload is
    not copied at all: counted, a miss later, never a growing pile of open files."""
    monkeypatch.setattr(uploads_module, "CACHE_COPIES_WAITING", 3)
    bucket = MemoryBucket(BUCKET)
    ssd = await open_ssd(tmp_path / "cache", max_bytes=MiB)
    gate = trio.Event()
    put = ssd.put
    storing = 0
    most = 0

    async def gated_put(key: BlockKey, data: bytes) -> None:
        nonlocal storing, most
        storing += 1
        most = max(most, storing)
        await gate.wait()
        await put(key, data)
        storing -= 1

    ssd.put = gated_put  # type: ignore[method-assign]
    blocks = Blocks(bucket, [ssd], block_size=BLOCK, downloads=trio.CapacityLimiter(4))
    fs = Filesystem(bucket, Settings(temp_dir=str(tmp_path), file_cache=True), blocks=blocks)
    async with trio.open_nursery() as nursery:
        with fs.background.attached(nursery):
            for i in range(5):
                handle, _ = await fs.create(ROOT_INO, f"f{i}", os.O_WRONLY)
                await fs.write(handle.fh, 0, b"x%d" % i)
                await fs.release(handle.fh)  # uploaded; its copy waits
                await trio.testing.wait_all_tasks_blocked()
            assert all(bucket.get(f"f{i}") == b"x%d" % i for i in range(5))
            stats = fs.statistics()["writeback"]
            assert isinstance(stats, dict)
            assert (stats["copying"], stats["not_copied"]) == (3, 2)
            # The first copy reads its file in a worker thread before it stores, and
            # wait_all_tasks_blocked() also returns while a task waits for a thread.
            with trio.fail_after(30):
                while storing < 1:
                    await trio.sleep(0.001)
            await trio.testing.wait_all_tasks_blocked()
            assert storing == 1  # the others wait their turn
            gate.set()
            await fs.finish()
            nursery.cancel_scope.cancel()
    fs.close()
    assert most == 1
    for i in range(5):
        generation = (await bucket.stat(f"f{i}")).generation
        assert ssd.holds(BlockKey(f"f{i}", generation, 0)) == (i < 3)


def test_a_background_task_that_fails_never_ends_the_nursery(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The mount's nursery runs every background task; one that raises (an exception
    group included, as a task with a nursery of its own raises) is logged at ERROR with
    its traceback and counted, and the nursery and its other tasks go on."""
    caplog.set_level(logging.ERROR, "tierfs.fs")
    background = Background()
    finished: list[str] = []

    async def broken() -> None:
        raise ValueError("nobody expected this")

    async def broken_group() -> None:
        async with trio.open_nursery() as inner:
            inner.start_soon(broken)

    async def steady() -> None:
        await trio.sleep(1)
        finished.append("steady")

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            with background.attached(nursery):
                background.spawn(broken)
                background.spawn(broken_group)
                background.spawn(steady)
        assert not background.running

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    assert finished == ["steady"]
    assert background.errors == 2
    messages = [r.getMessage() for r in caplog.records]
    assert all("nobody expected this" in m for m in messages) and len(messages) == 2
    assert all(r.exc_info is not None for r in caplog.records)


async def test_a_copy_whose_clean_up_fails_still_lets_unmount_go_on() -> None:
    """`CacheCopies`: a job that fails is logged, and a clean-up that raises (a journal
    file that cannot be removed) still counts the copy as ended, so unmount's wait for
    the copies returns instead of hanging."""
    copies = uploads_module.CacheCopies()
    ran: list[str] = []

    async def job() -> None:
        ran.append("job")
        raise OSError("disk gone")

    def cleanup() -> None:
        ran.append("cleanup")
        raise OSError("cannot remove")

    background = Background()
    async with trio.open_nursery() as nursery:
        with background.attached(nursery):
            copies.start(background.spawn, "f", job, cleanup)
            assert copies.running == 1
            with trio.fail_after(5):
                await copies.wait_idle()
    assert ran == ["job", "cleanup"] and copies.running == 0 and background.errors == 1


# --- block buffers (`tierfs.cache.buffers`) through the tiers ------------------------------


async def test_both_tiers_keep_a_block_buffer_as_it_is_and_copy_other_buffers(
    tier: RamTier | SsdTier,
) -> None:
    """A block buffer's view is stored without a copy (the RAM tier keeps that very view);
    a buffer that may change (a bytearray) is copied: changed after the put, the stored
    block is what was put."""
    pooled_key, other_key = BlockKey("a", 1, 0), BlockKey("a", 1, 1)
    view = BlockBuffers(BLOCK).take(BLOCK)
    view[:] = payload(pooled_key, BLOCK)
    await tier.put(pooled_key, view)
    changing = bytearray(payload(other_key, BLOCK))
    await tier.put(other_key, changing)
    changing[:10] = b"x" * 10
    assert await tier.get(pooled_key) == payload(pooled_key, BLOCK)
    assert await tier.get(other_key) == payload(other_key, BLOCK)
    if isinstance(tier, RamTier):
        assert await tier.get(pooled_key) is view


async def big_object_over_ram(
    object_blocks: int, ram_blocks: int
) -> tuple[bytes, int, RamTier, Blocks]:
    """An object of ``object_blocks`` blocks ("big") in a bucket, read through a RAM tier of
    ``ram_blocks``: (its bytes, its generation, the tier, the blocks)."""
    bucket = MemoryBucket(BUCKET)
    data = os.urandom(object_blocks * BLOCK)
    info = await bucket.write_bytes("big", data, if_generation_match=0)
    ram = RamTier(ram_blocks * BLOCK)
    blocks = Blocks(bucket, [ram], block_size=BLOCK, downloads=trio.CapacityLimiter(4), memory=ram)
    return data, info.generation, ram, blocks


async def test_blocks_land_in_buffers_reused_within_the_ram_tier() -> None:
    """Downloaded blocks are block buffers; reading 4 times what the RAM tier holds maps no
    more buffers than its blocks and the spare ones, and every block reads back right."""
    data, generation, _, blocks = await big_object_over_ram(32, 8)
    for index in range(32):
        block = await blocks.get(BlockKey("big", generation, index), len(data))
        assert pooled(block)
        assert block == data[index * BLOCK : (index + 1) * BLOCK]
    del block
    numbers = blocks.statistics()["block_buffers"]
    assert numbers["made"] <= 8 + SPARE
    assert numbers["reused"] >= 32 - 8 - SPARE


async def test_idle_buffers_make_way_for_what_else_the_ram_tier_holds() -> None:
    """Pieces of random reads (bytes) that fill the RAM tier leave no room for block
    buffers: those its blocks were in, evicted for the pieces, are unmapped, not kept
    beside them (the daemon's memory stays the tier's size)."""
    data, generation, ram, blocks = await big_object_over_ram(32, 8)
    for index in range(6):
        await blocks.get(BlockKey("big", generation, index), len(data))
    assert ram.statistics()["pooled_bytes"] == 6 * BLOCK
    assert ram.buffer_room(BLOCK) == 8  # (blocks in buffers leave their room to buffers)
    piece = blocks.piece_bytes
    for offset in range(16 * BLOCK, 24 * BLOCK, piece):  # 8 blocks' worth of pieces
        key = BlockKey("big", generation, offset // BLOCK)
        got = await blocks.read_random(key, offset, 100, len(data))
        assert got == data[offset : offset + 100]
    numbers = ram.statistics()
    assert numbers["pooled_bytes"] == 0 and numbers["used_bytes"] == 8 * BLOCK
    assert ram.buffer_room(BLOCK) == 0
    assert blocks.statistics()["block_buffers"]["mapped"] <= SPARE


@pytest.mark.parametrize("downloads", [3, math.inf])
async def test_without_a_ram_tier_as_many_buffers_are_kept_as_downloads_run(
    downloads: float,
) -> None:
    """No RAM tier: downloads still land in buffers, and as many idle ones are kept as
    downloads may run at once, so parallel downloads do not map fresh ones each time."""
    bucket = MemoryBucket(BUCKET)
    data = os.urandom(12 * BLOCK)
    info = await bucket.write_bytes("big", data, if_generation_match=0)
    blocks = Blocks(bucket, [], block_size=BLOCK, downloads=trio.CapacityLimiter(downloads))
    got: list[bytes] = []
    held: list[object] = []  # a round's blocks, all in use at once, then let go together

    async def one(index: int) -> None:
        block = await blocks.get(BlockKey("big", info.generation, index), len(data))
        held.append(block)
        got.append(bytes(block))

    for round_ in range(4):
        async with trio.open_nursery() as nursery:
            for index in range(3 * round_, 3 * round_ + 3):
                nursery.start_soon(one, index)
        held.clear()
    assert sorted(got) == sorted(data[i * BLOCK : (i + 1) * BLOCK] for i in range(12))
    assert blocks.statistics()["block_buffers"]["made"] == 3


class _FailingReads(MemoryBucket):
    """Each read fails after ``delay_s`` (GCS failing until the retry deadline ends)."""

    def __init__(self, delay_s: float) -> None:
        super().__init__(BUCKET)
        self.delay_s = delay_s
        self.reads = 0

    async def read(self, *args: object, **kwargs: object) -> bytes:
        self.reads += 1
        await trio.sleep(self.delay_s)
        raise BackendError("503 after every retry")


async def test_readers_of_a_block_whose_download_failed_hear_of_it_at_once(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A reader, a prefetch and a fill waiting for one block whose download failed each
    tried it again in turn, each for a whole retry deadline: the reader's request took
    two or three times the bound. They now fail with the download's error at once (a
    download cancelled, not failed, is still taken over)."""
    bucket = _FailingReads(delay_s=10)
    info = bucket.put("ckpt", os.urandom(BLOCK))
    blocks = Blocks(bucket, [], block_size=BLOCK, downloads=trio.CapacityLimiter(4))
    key = BlockKey("ckpt", info.generation, 0)
    failed_at: list[float] = []

    async def reader() -> None:
        with pytest.raises(BackendError):
            await blocks.get(key, BLOCK)
        failed_at.append(trio.current_time())

    start = trio.current_time()
    async with trio.open_nursery() as nursery:
        for _ in range(3):
            nursery.start_soon(reader)
    assert bucket.reads == 1
    assert [t - start for t in failed_at] == [10, 10, 10]


async def test_heap_memory_given_up_for_buffers_goes_back_to_the_kernel(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Pieces (heap memory) evicted to make room for block buffers: once
    `HEAP_GIVE_BACK_BYTES` of them are gone, the heap's free pages are handed back; pieces
    evicted for pieces are not (the heap reuses them)."""
    calls: list[int] = []
    monkeypatch.setattr(ram_module, "give_back_heap", lambda: calls.append(1) or True)
    block = 4 * MiB
    size = ram_module.HEAP_GIVE_BACK_BYTES * 2
    ram = RamTier(size)
    piece = 64 * 1024
    for index in range(2 * size // piece):  # pieces evicting pieces: nothing to give back
        ram.put_piece(PieceKey("p", 1, index * piece), os.urandom(piece))
    assert calls == []
    pool = BlockBuffers(block)
    for index in range(ram_module.HEAP_GIVE_BACK_BYTES // block):
        await ram.put(BlockKey("b", 1, index), pool.take(block))
    assert calls == [1]
    for index in range(size // block):  # buffers evicting buffers: nothing either
        await ram.put(BlockKey("c", 1, index), pool.take(block))
    assert len(calls) == 2  # (the second half of the pieces, evicted by the first of these)


async def test_a_reservation_cancelled_while_the_heap_is_given_back_is_not_lost(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`reserve` gives the heap back after taking its room: a cancel then must not leave
    that room held by no one (its caller releases only what `reserve` returned for)."""
    monkeypatch.setattr(ram_module, "give_back_heap", lambda: True)
    ram = RamTier(8 * MiB)
    ram._heap_freed = ram_module.HEAP_GIVE_BACK_BYTES
    with trio.CancelScope() as scope:
        scope.cancel()
        await ram.reserve(MiB)
        ram.release(MiB)
    assert ram.statistics()["reserved_bytes"] == 0


async def settled(blocks: Blocks, ssd: SsdTier) -> None:
    """Until no download runs and the SSD tier writes nothing (their worker threads hold
    blocks too), and every task waits."""
    while True:
        await trio.testing.wait_all_tasks_blocked()
        if not blocks._inflight and not ssd.statistics()["pending_bytes"]:
            return
        await trio.sleep(0.001)  # (a worker thread is busy)


async def test_a_paced_fill_holds_no_block_the_ram_tier_let_go(tmp_path: Path) -> None:
    """A fill's workers waiting for their reader's pace hold no block: each used to keep
    its last one, which the RAM tier evicted and could not count, so a cold read with a
    cache dir held up to a block per worker beyond the tier (its downloads then found no
    buffer and went to the heap: the daemon's peak RSS 370-380 MiB, against 331 since)."""
    bucket = MemoryBucket(BUCKET)
    data = os.urandom(32 * BLOCK)
    info = await bucket.write_bytes("big", data, if_generation_match=0)
    ram = RamTier(8 * BLOCK)
    ssd = await open_ssd(tmp_path / "cache", max_bytes=64 * BLOCK)
    blocks = Blocks(
        bucket, [ram, ssd], block_size=BLOCK, downloads=trio.CapacityLimiter(8), memory=ram
    )
    job = ("big", info.generation)
    blocks.paces.opened(job)
    blocks.paces.at(job, 0)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(blocks.fill, "big", info.generation, len(data), None)
        for index in range(32):  # a reader a block at a time, the fill paced ahead of it
            await settled(blocks, ssd)
            pooled_blocks = ram.statistics()["pooled_bytes"] // BLOCK
            assert blocks.buffers.in_use() <= pooled_blocks, index  # nothing held beside
            got = await blocks.get(BlockKey("big", info.generation, index), len(data))
            assert got == data[index * BLOCK : (index + 1) * BLOCK]
            del got
            blocks.paces.at(job, index)
        blocks.paces.closed(job)
    assert blocks.statistics()["block_buffers"]["refused"] == 0
    assert blocks.paces.waits > 0
