"""A reader of a block that is still downloading has the bytes it asked for as soon as
they have come (`Blocks.get_part`), not when the whole block has: the first read of a
file waited for all 8 MiB of its first block (42 of 64 ms to the first byte on a link of
200 MB/s per connection). Core tests with a bucket that fills its buffer in halves; the
GCS client's side (`_receive_into` telling each MiB) is tested on the emulator."""

from __future__ import annotations

import gc
import os
import threading

import pytest
import trio
import trio.testing
from google.cloud import storage

from tests.conftest import MountFactory
from tests.faults import MEDIA, Action, FaultProxy, Rule
from tests.mounting import stats
from tierfs.cache import BlockKey, Data
from tierfs.cache.ram import RamTier
from tierfs.core.background import Background
from tierfs.core.blockreader import BlockReader
from tierfs.core.blocks import Blocks
from tierfs.errors import BackendError
from tierfs.storage import Into, Progress
from tierfs.storage.memory import MemoryBucket

BLOCK = 1 << 20
HALF = BLOCK // 2


class Halves(MemoryBucket):
    """Fills the caller's buffer half a block at a time, the second half once ``gate`` is
    set, telling ``progress`` after each (as the GCS client does per MiB); ``fail``: the
    first attempt fails after its first half (the caller's retry fills a new buffer)."""

    def __init__(self, *, fail: bool = False, held_from: int = 0) -> None:
        super().__init__("b")
        self.gate = trio.Event()
        self.fail = fail
        self.held_from = held_from  # reads from here on wait at the gate; before, not

    async def read(
        self,
        name: str,
        *,
        generation: int,
        offset: int,
        length: int,
        into: Into | None = None,
        progress: Progress | None = None,
    ) -> bytes | memoryview:
        data = bytes(await super().read(name, generation=generation, offset=offset, length=length))
        view = into(len(data)) if into is not None else None
        if view is None or progress is None:
            await self.gate.wait()
            return data
        view[:HALF] = data[:HALF]
        progress(view, HALF)
        if self.fail:
            self.fail = False
            await trio.sleep(0)
            del view  # (as the GCS client drops a failed attempt's frames: `_drop_frames`)
            raise BackendError("the connection broke half-way")
        if offset >= self.held_from:
            await self.gate.wait()
        view[HALF:] = data[HALF:]
        progress(view, len(data))
        return view


def blocks_of(bucket: MemoryBucket, nursery: trio.Nursery) -> tuple[Blocks, RamTier]:
    ram = RamTier(16 * BLOCK)
    blocks = Blocks(bucket, [ram], block_size=BLOCK, downloads=trio.CapacityLimiter(4), memory=ram)
    blocks.spawner = Background(nursery).spawner
    return blocks, ram


async def test_a_read_of_a_blocks_start_is_answered_before_the_block_has_come(
    autojump_clock: trio.testing.MockClock,
) -> None:
    bucket = Halves()
    data = os.urandom(2 * BLOCK)
    generation = bucket.put("obj", data).generation
    async with trio.open_nursery() as nursery:
        blocks, ram = blocks_of(bucket, nursery)
        reader = BlockReader(
            blocks, "obj", generation, len(data), spawn=None, max_ahead_bytes=BLOCK
        )
        with trio.fail_after(5):  # the gate is shut: only the first half came
            first = await reader.read(0, 4096)
        assert bytes(first) == data[:4096]
        assert await ram.get(BlockKey("obj", generation, 0)) is None  # not whole yet
        with trio.move_on_after(1) as waited:  # the second half has not come
            await reader.read(HALF, 4096)
        assert waited.cancelled_caught
        bucket.gate.set()
        assert bytes(await reader.read(HALF, 4096)) == data[HALF : HALF + 4096]
        assert bytes(await reader.read(4096, BLOCK)) == data[4096 : BLOCK + 4096]
        assert bucket.statistics()["media_reads"] == 2  # one per block, parts or not
        assert blocks.statistics()["reads_before_block_whole"] == 1
        reader.close()


@pytest.mark.parametrize("whole_first", [False, True])
async def test_readers_of_a_block_under_way_share_its_one_download(whole_first: bool) -> None:
    """Readers of its start, of its end and of all of it: one download, each its bytes."""
    bucket = Halves()
    data = os.urandom(BLOCK)
    key = BlockKey("obj", bucket.put("obj", data).generation, 0)
    got: dict[str, bytes] = {}
    async with trio.open_nursery() as nursery:
        blocks, _ = blocks_of(bucket, nursery)

        async def part(lo: int, hi: int) -> None:
            piece, whole, _ = await blocks.get_part(key, len(data), lo, hi)
            got[f"{lo}-{hi}"] = bytes(memoryview(piece)[lo:hi] if whole else piece)

        async def block() -> None:
            got["all"] = bytes(await blocks.get(key, len(data)))

        async with trio.open_nursery() as readers:
            if whole_first:
                readers.start_soon(block)
            readers.start_soon(part, 0, 4096)
            readers.start_soon(part, BLOCK - 4096, BLOCK)
            if not whole_first:
                readers.start_soon(block)
            await trio.testing.wait_all_tasks_blocked()
            assert list(got) == ["0-4096"]  # the start came, the end has not
            bucket.gate.set()
        assert blocks.statistics()["shared_waits"] == 2  # two joined the one download
    assert got == {
        "0-4096": data[:4096],
        f"{BLOCK - 4096}-{BLOCK}": data[-4096:],
        "all": data,
    }
    assert bucket.statistics()["media_reads"] == 1


async def test_a_retried_download_serves_its_new_buffer_and_the_bytes_are_right() -> None:
    """A first attempt that broke half-way told of its first half; a reader of that half
    had it (the same bytes: one generation), and the retry's buffer answers the rest."""
    bucket = Halves(fail=True)
    data = os.urandom(BLOCK)
    key = BlockKey("obj", bucket.put("obj", data).generation, 0)
    async with trio.open_nursery() as nursery:
        blocks, ram = blocks_of(bucket, nursery)
        bucket.gate.set()
        with pytest.raises(BackendError):  # (the double does not retry: the caller sees it)
            await blocks.get_part(key, len(data), HALF, BLOCK)
        piece, whole, _ = await blocks.get_part(key, len(data), HALF, BLOCK)
        assert bytes(memoryview(piece)[HALF:] if whole else piece) == data[HALF:]
        assert bytes(await ram.get(key) or b"") == data


async def test_a_reader_answered_early_lets_go_of_the_block_it_went_past() -> None:
    """Its last block (kept for the next reads) is the one before: the RAM tier evicts it
    first, so kept on, its 8 MiB stayed mapped outside the tier's budget."""
    bucket = Halves(held_from=BLOCK)  # block 0 comes whole, block 1 half
    data = os.urandom(2 * BLOCK)
    generation = bucket.put("obj", data).generation
    async with trio.open_nursery() as nursery:
        blocks, _ = blocks_of(bucket, nursery)
        reader = BlockReader(
            blocks, "obj", generation, len(data), spawn=None, max_ahead_bytes=BLOCK
        )
        assert bytes(await reader.read(0, BLOCK)) == data[:BLOCK]
        assert len(blocks.kept_last) == 1  # block 0 kept
        assert bytes(await reader.read(BLOCK, 4096)) == data[BLOCK : BLOCK + 4096]
        assert reader._last is None  # not block 0 any more: the download of block 1 instead
        assert reader._coming is not None and reader._coming[0] == 1
        bucket.gate.set()
        await trio.testing.wait_all_tasks_blocked()  # block 1 has come
        got = await reader.read(BLOCK + 4096, 4096)  # where the last read ended
        assert bytes(got) == data[BLOCK + 4096 : BLOCK + 8192]
        assert len(blocks.kept_last) == 1  # block 1, whole
        reader.close()


async def test_a_failed_download_does_not_hold_its_buffer() -> None:
    """A download that told of its first half, then failed: its buffer goes back to the
    pool at once (held by the failed fetch's frames, only a full collection freed it)."""
    bucket = Halves(fail=True)
    bucket.gate.set()
    data = os.urandom(BLOCK)
    key = BlockKey("obj", bucket.put("obj", data).generation, 0)
    async with trio.open_nursery() as nursery:
        blocks, _ = blocks_of(bucket, nursery)
        gc.disable()
        try:
            with pytest.raises(BackendError):
                await blocks.get_part(key, len(data), HALF, BLOCK)
            made = blocks.buffers.made
            blocks.buffers.take(BLOCK)
            assert blocks.buffers.made == made  # the failed download's buffer, reused
        finally:
            gc.enable()


async def test_without_a_spawner_a_part_is_the_whole_block() -> None:
    """In a reader's own task (no mount's spawner) the fetch is its own: it returns the
    whole block, which the caller slices."""
    bucket = Halves()
    bucket.gate.set()
    data = os.urandom(BLOCK)
    key = BlockKey("obj", bucket.put("obj", data).generation, 0)
    ram = RamTier(16 * BLOCK)
    blocks = Blocks(bucket, [ram], block_size=BLOCK, downloads=trio.CapacityLimiter(4), memory=ram)
    piece, whole, _ = await blocks.get_part(key, len(data), 0, 4096)
    assert whole and bytes(piece) == data


@pytest.mark.mount
@pytest.mark.parametrize(
    "extra",
    [
        (),
        # (a stall bound past the test's own: the held GET is never cut and retried while
        # the test looks; at the defaults it is after 20 s, which brings the block whole
        # and fails the test's `gcs_blocks == 0` all the same)
        ("--read-stall-initial-req-timeout=600s",),
    ],
    ids=["defaults", "no-stall-cut"],
)
def test_a_files_first_bytes_are_read_before_its_first_block_has_come(
    mount_factory: MountFactory,
    fault_proxy: FaultProxy,
    gcs_client: storage.Client,
    bucket_name: str,
    extra: tuple[str, ...],
) -> None:
    """Through a mount at the defaults (8 MiB blocks): the proxy passes on the first 3 MiB
    of the block's download and holds the rest. The first 4 KiB of the file are read all
    the same, while no block has come whole; then the rest, every byte right."""
    data = os.urandom(8 << 20)
    gcs_client.bucket(bucket_name).blob("one.bin").upload_from_string(data)
    mount = mount_factory(fault_proxy.option, *extra)
    release = threading.Event()
    held = Action(hold_after=3 << 20, release=release)
    rule = fault_proxy.faults.add(Rule(held, method="GET", target=MEDIA, times=1))
    got: dict[str, bytes] = {}

    def first() -> None:
        with open(mount.path / "one.bin", "rb", buffering=0) as stream:
            got["head"] = stream.read(4096)

    try:
        reader = threading.Thread(target=first, daemon=True)
        reader.start()
        reader.join(60)
        assert not reader.is_alive(), "the first 4 KiB waited for the whole block"
        assert got["head"] == data[:4096]
        now = stats(mount)["data"]
        assert now["gcs_blocks"] == 0 and now["reads_before_block_whole"] >= 1  # still coming
    finally:
        release.set()
    assert (mount.path / "one.bin").read_bytes() == data
    assert rule.fired == 1 and stats(mount)["data"]["gcs_blocks"] == 1


async def test_the_rest_of_a_block_read_in_parts_comes_from_its_one_download() -> None:
    """A reader answered early asks the rest of the block of the same download, even once
    it has ended: a RAM tier with no room left for it kept no copy, and the reader
    downloaded the block a second time (a prefetch into a 20 MiB tier read 32 MiB for
    16)."""

    class Full(RamTier):
        async def put(self, key: BlockKey, data: Data) -> None:  # no room: kept nowhere
            return None

    bucket = Halves()
    data = os.urandom(BLOCK)
    generation = bucket.put("obj", data).generation
    async with trio.open_nursery() as nursery:
        ram = Full(4 * BLOCK)
        blocks = Blocks(
            bucket, [ram], block_size=BLOCK, downloads=trio.CapacityLimiter(4), memory=ram
        )
        blocks.spawner = Background(nursery).spawner
        reader = BlockReader(blocks, "obj", generation, len(data), spawn=None, max_ahead_bytes=0)
        with trio.fail_after(5):
            assert bytes(await reader.read(0, HALF)) == data[:HALF]  # early: the first half
            bucket.gate.set()
            await trio.testing.wait_all_tasks_blocked()  # the download has ended
            assert await ram.get(BlockKey("obj", generation, 0)) is None  # no copy kept
            assert bytes(await reader.read(HALF, HALF)) == data[HALF:]
        assert bucket.statistics()["media_reads"] == 1
        reader.close()
