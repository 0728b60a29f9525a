"""A whole-object fill keeps the pace of the object's readers (`tierfs.core.pace`).

Downloaded further ahead of the readers than the RAM tier holds, blocks were evicted
before they were read and read back from the SSD tier: a cold 1 GiB restore of 8 files
read its SSD tier 1.2-1.45x over, at 212-331 MB/s; paced, 0.36x, at 513-559 MB/s. What
must hold: the fill goes no further than its lead ahead of the furthest block read; it
goes on as the readers move; a reader that stops for `PACE_WAIT_S` (a training step, a
random reader) or closes lets it go on unpaced; without readers it is never held."""

from __future__ import annotations

import os

import trio
import trio.testing

from tests.buckets import HookedReads
from tierfs.cache.ram import RamTier
from tierfs.core.blockreader import BlockReader
from tierfs.core.blocks import Blocks
from tierfs.core.pace import PACE_WAIT_S
from tierfs.core.wholeobjects import UNREAD_WORKERS
from tierfs.storage.memory import MemoryBucket

BLOCK = 4096
BLOCKS = 64
# One paced object in a RAM tier of 16 blocks, each block led by counted twice
# (`LEAD_WEIGHT`): 8 blocks at once, the reader's and 7 ahead.
LEAD = 7


def setup() -> tuple[Blocks, int, bytes]:
    bucket = MemoryBucket()
    data = os.urandom(BLOCKS * BLOCK)
    info = bucket.put("obj", data)
    ram = RamTier(16 * BLOCK)
    blocks = Blocks(bucket, [ram], block_size=BLOCK, downloads=trio.CapacityLimiter(4), memory=ram)
    return blocks, info.generation, data


async def paced_fill(nursery: trio.Nursery) -> tuple[Blocks, tuple[str, int]]:
    """A fill of "obj" started with one reader at block 0, once it has gone as far as the
    reader lets it."""
    blocks, generation, data = setup()
    job = ("obj", generation)
    blocks.paces.opened(job)
    blocks.paces.at(job, 0)
    blocks.paces.answered(job)
    nursery.start_soon(blocks.fill, "obj", generation, len(data), None)
    await trio.testing.wait_all_tasks_blocked()
    return blocks, job


async def test_a_fill_goes_no_further_than_its_lead_and_follows_its_reader(
    mock_clock: trio.testing.MockClock,
) -> None:
    async with trio.open_nursery() as nursery:
        blocks, job = await paced_fill(nursery)
        assert blocks.gcs_blocks == 1 + LEAD  # the reader's block and LEAD ahead
        blocks.paces.at(job, 20)
        await trio.testing.wait_all_tasks_blocked()
        assert blocks.gcs_blocks == 21 + LEAD
        blocks.paces.closed(job)  # gone: the rest at once
    assert blocks.gcs_blocks == BLOCKS
    assert blocks.paces.waits >= 2


async def test_a_reader_that_stops_lets_the_fill_go_on(
    mock_clock: trio.testing.MockClock,
) -> None:
    async with trio.open_nursery() as nursery:
        blocks, _ = await paced_fill(nursery)
        assert blocks.gcs_blocks == 1 + LEAD
        mock_clock.jump(PACE_WAIT_S / 2)
        await trio.testing.wait_all_tasks_blocked()
        assert blocks.gcs_blocks == 1 + LEAD  # not yet
        mock_clock.jump(PACE_WAIT_S)
    assert blocks.gcs_blocks == BLOCKS  # the reader still open, and stopped


async def test_a_fill_without_readers_is_never_held() -> None:
    blocks, generation, data = setup()
    with trio.fail_after(5):  # (the real clock: no wait at all is expected)
        await blocks.fill("obj", generation, len(data), None)
    assert blocks.gcs_blocks == BLOCKS and blocks.paces.waits == 0


async def test_a_reader_slower_than_a_block_a_second_still_paces_the_fill(
    mock_clock: trio.testing.MockClock,
) -> None:
    """Reads within one block keep the pace alive: the reader is slow, not stopped."""
    async with trio.open_nursery() as nursery:
        blocks, job = await paced_fill(nursery)
        for _ in range(5):
            await trio.testing.wait_all_tasks_blocked()
            assert blocks.gcs_blocks == 1 + LEAD
            mock_clock.jump(PACE_WAIT_S * 0.9)
            blocks.paces.at(job, 0)  # another read of the same block
            blocks.paces.answered(job)
        blocks.paces.closed(job)
    assert blocks.gcs_blocks == BLOCKS


async def test_a_reader_that_reads_again_after_a_stop_paces_the_fill_again(
    mock_clock: trio.testing.MockClock,
) -> None:
    """Stopped for `PACE_WAIT_S`, the readers let the fill go on; a read after that paces
    it again (readers starved of CPU for a second must not unpace it for good)."""
    blocks, generation, data = setup()
    job = ("obj", generation)
    blocks.paces.opened(job)
    blocks.paces.at(job, 0)
    pace = blocks.paces._paces[job]
    pace.stalled = True  # as after a stop
    blocks.paces.at(job, 0)  # a read again
    blocks.paces.answered(job)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(blocks.fill, "obj", generation, len(data), None)
        await trio.testing.wait_all_tasks_blocked()
        assert blocks.gcs_blocks == 1 + LEAD
        blocks.paces.closed(job)
    assert blocks.gcs_blocks == BLOCKS


class FirstBlockHeld(HookedReads):
    """The read of the object's first block waits at a gate (GCS slow to answer it)."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = trio.Event()

    async def before_read(self, offset: int) -> None:
        if offset == 0:
            await self.gate.wait()


async def test_a_reader_waiting_for_its_block_keeps_the_fill_paced(
    mock_clock: trio.testing.MockClock,
) -> None:
    """A reader whose read is under way has not stopped, however long its block takes
    (4 restores at once on 2 cores: blocks took over `PACE_WAIT_S`, every fill went on
    unpaced, and the blocks it brought ahead were evicted and read back from the SSD
    tier, 1.2-1.5x the checkpoint; counting reads under way, 0.09-0.23x)."""
    bucket = FirstBlockHeld()
    data = os.urandom(BLOCKS * BLOCK)
    generation = bucket.put("obj", data).generation
    ram = RamTier(16 * BLOCK)
    blocks = Blocks(bucket, [ram], block_size=BLOCK, downloads=trio.CapacityLimiter(4), memory=ram)
    got: list[bytes] = []
    async with trio.open_nursery() as nursery:
        reader = BlockReader(
            blocks, "obj", generation, len(data), spawn=nursery.start_soon,
            max_ahead_bytes=BLOCK, fill=True,
        )  # fmt: skip

        async def read() -> None:
            got.append(bytes(await reader.read(0, BLOCK)))

        nursery.start_soon(read)
        await trio.testing.wait_all_tasks_blocked()
        assert blocks.gcs_blocks == LEAD  # those ahead; block 0 still coming
        mock_clock.jump(3 * PACE_WAIT_S)
        await trio.testing.wait_all_tasks_blocked()
        assert blocks.gcs_blocks == LEAD and blocks.paces.stops == 0  # still paced
        bucket.gate.set()
        await trio.testing.wait_all_tasks_blocked()
        assert got == [data[:BLOCK]]
        assert blocks.gcs_blocks == 1 + LEAD
        reader.close()
    assert blocks.gcs_blocks == BLOCKS


class Gated(HookedReads):
    """Every read waits at the gate open when it came; counts the reads waiting."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = trio.Event()
        self.waiting = 0

    def open_gate(self) -> None:
        self.gate.set()
        self.gate = trio.Event()

    async def before_read(self, offset: int) -> None:
        self.waiting += 1
        try:
            await self.gate.wait()
        finally:
            self.waiting -= 1


async def test_a_fill_nobody_reads_keeps_few_workers_until_a_reader_comes_back() -> None:
    """The daemon's CPU is shared: beside a fill of 16 streams nobody read, a reader of
    another file ran at 269-306 MB/s (601-878 alone); with `UNREAD_WORKERS`, 363-558.
    Readers back, the fill has all its workers again; and it always ends."""
    bucket = Gated()
    data = os.urandom(BLOCKS * BLOCK)
    generation = bucket.put("obj", data).generation
    blocks = Blocks(
        bucket, [RamTier(BLOCKS * BLOCK)], block_size=BLOCK, downloads=trio.CapacityLimiter(16)
    )
    job = ("obj", generation)
    blocks.paces.opened(job)
    with trio.fail_after(5):  # (the fill must end: no worker left waiting for a reader)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(blocks.fill, "obj", generation, len(data), None)
            await trio.testing.wait_all_tasks_blocked()
            assert bucket.waiting == 16  # read: every worker
            blocks.paces.closed(job)
            bucket.open_gate()
            await trio.testing.wait_all_tasks_blocked()
            assert bucket.waiting == UNREAD_WORKERS  # nobody reads it: a few go on
            blocks.paces.opened(job)
            await trio.testing.wait_all_tasks_blocked()
            assert bucket.waiting == 16  # a reader again: all of them
            blocks.paces.closed(job)
            while blocks.gcs_blocks < BLOCKS:
                bucket.open_gate()
                await trio.testing.wait_all_tasks_blocked()
                assert bucket.waiting <= UNREAD_WORKERS
    assert blocks.gcs_blocks == BLOCKS and not blocks.filling("obj", generation)
