"""Downloads take their memory from the RAM tier (issue 18): a block being downloaded is
held back in the tier `DOWNLOAD_COPIES` times, so what the tier stores plus what
downloads hold never exceeds its size, however many run at once."""

from __future__ import annotations

import os
from collections.abc import Callable

import trio
import trio.testing

from tests.buckets import HookedReads
from tierfs.cache import BlockKey
from tierfs.cache.ram import RamTier
from tierfs.core.blockreader import BlockReader
from tierfs.core.blocks import DOWNLOAD_COPIES, Blocks
from tierfs.core.keptlast import LAST_KEPT
from tierfs.storage.memory import MemoryBucket

BLOCK = 1 << 20


class HeldBucket(HookedReads):
    """Reads wait at a gate, so that downloads pile up; the most at once is kept."""

    def __init__(self, name: str, ram: list[RamTier]) -> None:
        super().__init__(name)
        self.gate = trio.Event()
        self.running = 0
        self.most = 0
        self.ram = ram
        self.worst = 0  # the most bytes stored and held back at once, seen from a read

    async def before_read(self, offset: int) -> None:
        self.running += 1
        self.most = max(self.most, self.running)
        stats = self.ram[0].statistics()
        self.worst = max(self.worst, stats["used_bytes"] + stats["reserved_bytes"])
        await self.gate.wait()
        self.running -= 1


async def get_all(blocks: Blocks, generation: int, size: int, blocked: Callable[[], None]) -> bytes:
    """Every block of "obj", all asked for at once; ``blocked`` runs once they all wait
    (it checks, then opens the gate they wait at). The object's bytes, in order."""
    count = size // BLOCK
    got: dict[int, bytes] = {}

    async def one(index: int) -> None:
        got[index] = await blocks.get(BlockKey("obj", generation, index), size)

    async with trio.open_nursery() as nursery:
        for index in range(count):
            nursery.start_soon(one, index)
        await trio.testing.wait_all_tasks_blocked()
        blocked()
    return b"".join(got[i] for i in range(count))


async def test_downloads_wait_for_room_in_the_ram_tier() -> None:
    ram = RamTier(3 * DOWNLOAD_COPIES * BLOCK)  # room for three downloads at once
    bucket = HeldBucket("b", [ram])
    data = os.urandom(12 * BLOCK)
    generation = bucket.put("obj", data).generation
    blocks = Blocks(bucket, [ram], block_size=BLOCK, downloads=trio.CapacityLimiter(16), memory=ram)

    def blocked() -> None:
        assert bucket.most == 3  # the limiter allows 16; the tier's room, three
        bucket.gate.set()

    assert await get_all(blocks, generation, len(data), blocked) == data
    stats = ram.statistics()
    assert stats["reserved_bytes"] == 0
    assert stats["reserved_peak_bytes"] <= 3 * DOWNLOAD_COPIES * BLOCK
    assert bucket.worst <= 3 * DOWNLOAD_COPIES * BLOCK
    assert stats["used_bytes"] <= 3 * DOWNLOAD_COPIES * BLOCK


async def test_a_download_larger_than_the_tier_still_goes_ahead_alone() -> None:
    ram = RamTier(BLOCK)  # smaller than one download's two copies
    bucket = MemoryBucket("b")
    data = os.urandom(2 * BLOCK)
    generation = bucket.put("obj", data).generation
    blocks = Blocks(bucket, [ram], block_size=BLOCK, downloads=trio.CapacityLimiter(4), memory=ram)
    parts = []
    for index in range(2):
        parts.append(await blocks.get(BlockKey("obj", generation, index), len(data)))
    assert b"".join(parts) == data
    assert ram.statistics()["reserved_bytes"] == 0


class SlowTier(RamTier):
    """A tier whose stores wait at a gate (a disk slower than the link)."""

    name = "slow"

    def __init__(self, max_bytes: int) -> None:
        super().__init__(max_bytes)
        self.gate = trio.Event()
        self.storing = 0

    async def put(self, key: BlockKey, data: bytes) -> None:
        self.storing += 1
        await self.gate.wait()
        await super().put(key, data)
        self.storing -= 1


def over_a_slower_tier(
    slower: SlowTier, blocks_in_object: int
) -> tuple[RamTier, Blocks, bytes, int]:
    """A RAM tier with room for 4 downloads in front of ``slower``, and an object "obj" of
    that many blocks: (ram, blocks, its bytes, its generation)."""
    ram = RamTier(4 * DOWNLOAD_COPIES * BLOCK)
    bucket = MemoryBucket("b")
    data = os.urandom(blocks_in_object * BLOCK)
    generation = bucket.put("obj", data).generation
    blocks = Blocks(
        bucket, [ram, slower], block_size=BLOCK, downloads=trio.CapacityLimiter(4), memory=ram
    )
    return ram, blocks, data, generation


async def test_a_block_being_stored_in_a_slower_tier_stays_counted() -> None:
    """While a slower tier still stores a downloaded block, the RAM tier keeps one copy of
    it held back: if it evicts its own copy meanwhile, the bytes are in memory all the
    same (in the store), and the tier's size must still bound them."""
    slow = SlowTier(64 * BLOCK)
    ram, blocks, data, generation = over_a_slower_tier(slow, 3)

    def blocked() -> None:
        assert slow.storing == 3
        assert ram.statistics()["reserved_bytes"] == 3 * BLOCK  # one copy each, not two
        slow.gate.set()

    assert await get_all(blocks, generation, len(data), blocked) == data
    assert ram.statistics()["reserved_bytes"] == 0


async def test_readers_have_a_block_before_a_slower_tier_has_stored_it() -> None:
    """A reader waiting for a block being downloaded gets it once it is downloaded, not once
    the SSD tier has written it. Meanwhile the block counts once in the RAM tier (held back
    for the store), which takes it in only once the store is done."""
    slow = SlowTier(64 * BLOCK)
    ram, blocks, data, generation = over_a_slower_tier(slow, 2)
    key = BlockKey("obj", generation, 1)
    got: list[bytes] = []

    async def fetcher() -> None:
        await blocks.get(key, len(data))

    async def reader() -> None:
        got.append(await blocks.get(key, len(data)))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(fetcher)
        await trio.testing.wait_all_tasks_blocked()
        nursery.start_soon(reader)
        await trio.testing.wait_all_tasks_blocked()
        assert slow.storing == 1  # the store has not finished...
        assert got == [data[BLOCK:]]  # ...and the reader has the block
        stats = ram.statistics()
        assert (stats["used_bytes"], stats["reserved_bytes"]) == (0, BLOCK)
        slow.gate.set()
    assert ram.statistics()["reserved_bytes"] == 0
    assert await ram.get(key) == data[BLOCK:]
    assert await slow.get(key) == data[BLOCK:]


class SealingTier(SlowTier):
    """A persistent tier like the SSD tier: a put of a block it is storing is skipped, and
    a seal records whether every block of the object was stored by then."""

    persistent = True

    def __init__(self, max_bytes: int) -> None:
        super().__init__(max_bytes)
        self.busy: set[BlockKey] = set()
        self.seals: list[bool] = []

    async def put(self, key: BlockKey, data: bytes) -> None:
        if key in self.busy:
            return
        self.busy.add(key)
        await super().put(key, data)
        self.busy.discard(key)

    async def seal(self, name: str, generation: int, size: int) -> bool:
        whole = all(self.holds(BlockKey(name, generation, i)) for i in range(size // BLOCK))
        self.seals.append(whole)
        return whole


async def test_a_fill_seals_only_once_a_readers_fetch_has_stored_its_block() -> None:
    """A reader fetched block 0 and has it, its SSD write still under way; the fill of
    the object gets block 0 from that fetch and must wait for the write before sealing
    (the put it would make itself is skipped as a duplicate)."""
    ssd = SealingTier(64 * BLOCK)
    _, blocks, data, generation = over_a_slower_tier(ssd, 2)

    await RamTier.put(ssd, BlockKey("obj", generation, 1), data[BLOCK:])  # stored before
    async with trio.open_nursery() as nursery:
        nursery.start_soon(blocks.get, BlockKey("obj", generation, 0), len(data))
        await trio.testing.wait_all_tasks_blocked()  # block 0 downloaded, its store waits
        nursery.start_soon(blocks.fill, "obj", generation, len(data), None)
        await trio.testing.wait_all_tasks_blocked()
        assert ssd.seals == []  # the fill waits for block 0's store
        ssd.gate.set()
    assert ssd.seals == [True]


async def test_files_left_open_after_one_read_keep_at_most_a_few_blocks() -> None:
    """A data loader reads each shard's header and keeps the files open: each kept the
    block it read for as long as it stayed open, beyond the RAM tier once the tier evicted
    it (64 files: 56 MiB past an 8 MiB tier, in 1 MiB blocks). At most `LAST_KEPT` do."""
    bucket = MemoryBucket("b")
    ram = RamTier(8 * BLOCK)
    blocks = Blocks(bucket, [ram], block_size=BLOCK, downloads=trio.CapacityLimiter(4), memory=ram)
    readers = []
    for i in range(64):
        data = os.urandom(2 * BLOCK)
        generation = bucket.put(f"f{i}", data).generation
        reader = BlockReader(
            blocks, f"f{i}", generation, len(data), spawn=None, max_ahead_bytes=BLOCK
        )
        assert bytes(await reader.read(0, 4096)) == data[:4096]
        readers.append((reader, data))
    kept = [reader for reader, _ in readers if reader._last is not None]
    assert len(kept) == LAST_KEPT
    for reader, data in readers:  # each reads on as before, its block from the tiers or GCS
        assert bytes(await reader.read(4096, 8192)) == data[4096:12288]
        reader.close()
    assert len(blocks.kept_last) == 0


async def test_an_interrupted_reader_leaves_its_download_which_keeps_its_memory_until_done(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A reader interrupted mid-download (FUSE INTERRUPT: the process was killed) cancelled
    the download in its own task: the RAM tier's room for it was given back at once, while
    the abandoned GCS thread went on filling its buffer (16 such at the defaults: 256 MiB
    outside the budget). The fetch is a task of its own: the reader leaves, the download
    ends, its room is held until then, and the block lands in the tier."""
    from tierfs.core.background import Background

    bucket = MemoryBucket("b", latency_s=2.0)
    data = os.urandom(BLOCK)
    key = BlockKey("obj", bucket.put("obj", data).generation, 0)
    ram = RamTier(16 * BLOCK)
    blocks = Blocks(bucket, [ram], block_size=BLOCK, downloads=trio.CapacityLimiter(4), memory=ram)
    async with trio.open_nursery() as nursery:
        blocks.spawner = Background(nursery).spawner
        with trio.move_on_after(1) as interrupted:
            await blocks.get(key, len(data))
        assert interrupted.cancelled_caught
        assert ram.statistics()["reserved_bytes"] == DOWNLOAD_COPIES * BLOCK  # still held
        await trio.sleep(2)
        assert ram.statistics()["reserved_bytes"] == 0
        assert bytes(await ram.get(key) or b"") == data  # and it landed
        assert await blocks.get(key, len(data)) == data
        assert bucket.statistics()["media_reads"] == 1


async def test_a_reader_has_its_block_before_the_slower_tiers_and_unmount_waits_for_them(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """The fetch being a task of its own, its reader has the block once it is downloaded,
    not after the slower tiers (SSD, shared) stored it; at unmount `fetches_settled` waits
    for them, so a restore after the remount finds every block on disk."""
    from tierfs.core.background import Background

    class SlowTier(RamTier):
        name = "slow"

        async def put(self, key: BlockKey, data: bytes) -> None:  # type: ignore[override]
            await trio.sleep(5)
            await super().put(key, data)

    bucket = MemoryBucket("b")
    data = os.urandom(BLOCK)
    key = BlockKey("obj", bucket.put("obj", data).generation, 0)
    ram, slow = RamTier(16 * BLOCK), SlowTier(16 * BLOCK)
    blocks = Blocks(
        bucket, [ram, slow], block_size=BLOCK, downloads=trio.CapacityLimiter(4), memory=ram
    )
    async with trio.open_nursery() as nursery:
        blocks.spawner = Background(nursery).spawner
        start = trio.current_time()
        assert await blocks.get(key, len(data)) == data
        assert trio.current_time() - start < 1 and not slow.holds(key)
        await blocks.fetches_settled()
        assert slow.holds(key) and trio.current_time() - start >= 5
