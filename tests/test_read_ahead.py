"""Sequential read-ahead (`tierfs.core.blockreader`): a first read at offset 0 starts it at
once, other first reads do not (also through a mount at the defaults); with parallel
downloads off, one stream at a time."""

from __future__ import annotations

import concurrent.futures
import mmap
import os
from pathlib import Path

import pytest
import trio
import trio.testing
from google.cloud import storage

from tests.mounting import Mount, stats, wait_until
from tests.test_cache_tiers import open_ssd
from tierfs.cache import BlockKey, Tier
from tierfs.cache.ram import RamTier
from tierfs.core.background import Background
from tierfs.core.blockreader import AHEAD_IDLE_S, FIRST_AHEAD, BlockReader
from tierfs.core.blocks import Blocks
from tierfs.storage import Into, Progress
from tierfs.storage.memory import MemoryBucket

BLOCK = 4096
MiB = 1 << 20


class LoggedReads:
    """A bucket whose media reads take 10 ms (a link's latency; no real wait under the
    autojump clock), logged as (virtual time started, block index), with the most in
    flight at once."""

    def __init__(self, bucket: MemoryBucket) -> None:
        self.bucket = bucket
        self.started: list[tuple[float, int]] = []
        self.now = 0
        self.peak = 0

    def __getattr__(self, name: str) -> object:
        return getattr(self.bucket, name)

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
        self.started.append((trio.current_time(), offset // BLOCK))
        self.now += 1
        self.peak = max(self.peak, self.now)
        try:
            await trio.sleep(0.01)
            return await self.bucket.read(
                name,
                generation=generation,
                offset=offset,
                length=length,
                into=into,
                progress=progress,
            )
        finally:
            self.now -= 1


def reader_of(
    data: bytes, tiers: list[Tier], nursery: trio.Nursery, *, per_file: int = 1, fill: bool = False
) -> tuple[BlockReader, LoggedReads, Blocks]:
    """A reader of ``data`` (object "obj") through ``tiers``, 16 blocks of read-ahead at
    most, its background work in ``nursery``."""
    memory = MemoryBucket()
    info = memory.put("obj", data)
    bucket = LoggedReads(memory)
    blocks = Blocks(
        bucket,  # type: ignore[arg-type]
        tiers,
        block_size=BLOCK,
        downloads=trio.CapacityLimiter(16),
        per_file=per_file,
    )
    reader = BlockReader(
        blocks,
        "obj",
        info.generation,
        len(data),
        spawn=Background(nursery).spawn,
        max_ahead_bytes=16 * BLOCK,
        fill=fill,
    )
    return reader, bucket, blocks


async def first_read(offset: int) -> tuple[LoggedReads, Blocks, float]:
    """One 1,000-byte read at ``offset`` of a 40-block object, every background download
    done, then the file closed: the bucket's log, the blocks, when the read began."""
    data = os.urandom(40 * BLOCK)
    async with trio.open_nursery() as nursery:
        reader, bucket, blocks = reader_of(data, [RamTier(MiB)], nursery)
        began = trio.current_time()
        assert await reader.read(offset, 1000) == data[offset : offset + 1000]
    reader.close()
    return bucket, blocks, began


async def test_a_first_read_at_offset_0_reads_ahead_at_once(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """The read of block 0 and of the next `FIRST_AHEAD` blocks start together: the read-ahead
    does not wait for a second read, which a reader sends only once block 0 has come."""
    bucket, blocks, began = await first_read(0)
    assert sorted(index for _, index in bucket.started) == list(range(FIRST_AHEAD + 1))
    assert {at for at, _ in bucket.started} == {began}
    # Closed after its first read: what was read ahead was for nothing, and is counted.
    stats = blocks.statistics()
    assert (stats["read_ahead_blocks"], stats["read_ahead_unread"]) == (FIRST_AHEAD, FIRST_AHEAD)


async def test_a_first_read_elsewhere_reads_nothing_ahead(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A first read past offset 0 (a footer, an index, a random reader) fetches its block
    only: no reader has shown it reads on."""
    bucket, blocks, _ = await first_read(20 * BLOCK + 5)
    assert [index for _, index in bucket.started] == [20]
    assert blocks.statistics()["read_ahead_blocks"] == 0


async def test_a_reader_to_the_end_leaves_nothing_read_ahead_unread(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Read in order to the end, every block read ahead is read: none counted unread. Read
    ahead and then left (a jump back to the start, then close), the blocks passed over
    are."""
    data = os.urandom(40 * BLOCK + 7)
    async with trio.open_nursery() as nursery:
        reader, _, blocks = reader_of(data, [RamTier(MiB)], nursery)
        got = bytearray()
        while len(got) < len(data):
            got += await reader.read(len(got), 1000)
        reader.close()
        assert bytes(got) == data
        stats = blocks.statistics()
        assert stats["read_ahead_blocks"] == 40 and stats["read_ahead_unread"] == 0
        again, _, blocks = reader_of(data, [RamTier(MiB)], nursery)
        for offset in range(0, 3 * BLOCK, 1024):  # blocks 0-2 in order, read ahead past them
            await again.read(offset, 1024)
        await again.read(0, 1000)  # back to the start
    again.close()
    stats = blocks.statistics()
    assert stats["read_ahead_unread"] == stats["read_ahead_blocks"] - 2 > 0


@pytest.mark.parametrize(("per_file", "peak"), [(1, 1), (4, 4)])
async def test_parallel_downloads_off_reads_one_stream(
    tmp_path: Path, autojump_clock: trio.testing.MockClock, per_file: int, peak: int
) -> None:
    """gcsfuse without parallel downloads fills the cache with one stream; the reader's own
    read-ahead must not add a second one. With parallel downloads, up to per_file at once."""
    data = os.urandom(40 * BLOCK + 7)
    ssd = await open_ssd(tmp_path, max_bytes=MiB, block_size=BLOCK)
    got = bytearray()
    async with trio.open_nursery() as nursery:
        reader, bucket, blocks = reader_of(
            data, [RamTier(MiB), ssd], nursery, per_file=per_file, fill=True
        )
        while len(got) < len(data):
            got += await reader.read(len(got), 1000)
    assert bytes(got) == data
    assert bucket.peak == peak
    assert blocks.gcs_blocks == 41


def test_reading_a_files_head_fetches_the_blocks_ahead_through_a_mount(
    mount: Mount, gcs_client: storage.Client
) -> None:
    """At the defaults (8 MiB blocks), one 4 KiB read at the start of a 64 MiB file makes
    the daemon fetch block 0 and the `FIRST_AHEAD` blocks after it, and no more. (The read
    is ``O_DIRECT``, so that the kernel's own read-ahead sends no second read.)"""
    data = os.urandom(64 * MiB)
    gcs_client.bucket(mount.bucket).blob("big").upload_from_string(data)
    fd = os.open(mount.path / "big", os.O_RDONLY | os.O_DIRECT)
    try:
        with mmap.mmap(-1, 4096) as buffer:  # page-aligned, as O_DIRECT wants
            assert os.preadv(fd, [buffer], 0) == 4096
            assert buffer[:] == data[:4096]
        wait_until(
            lambda: stats(mount)["gcs"]["media_reads"] >= 1 + FIRST_AHEAD,
            "the blocks read ahead",
            timeout_s=30,
        )
        assert stats(mount)["gcs"]["media_reads"] == 1 + FIRST_AHEAD
    finally:
        os.close(fd)
    data_stats = stats(mount)["data"]  # closed: the blocks read ahead were for nothing
    assert (data_stats["read_ahead_blocks"], data_stats["read_ahead_unread"]) == (FIRST_AHEAD,) * 2


SHARED_SIZE = 24 * BLOCK  # each file of the shared-depth tests


def sharing(
    bucket: object, memory: MemoryBucket, names: list[str], nursery: trio.Nursery
) -> tuple[dict[str, bytes], RamTier, Blocks, dict[str, BlockReader]]:
    """Files of `SHARED_SIZE` put in ``memory`` and read through ``bucket`` (it or a
    wrapper of it) and a RAM tier of 16 blocks, each file allowed 8 blocks ahead: their
    bytes, the tier, the blocks and a reader for each."""
    files = {name: os.urandom(SHARED_SIZE) for name in names}
    infos = {name: memory.put(name, data) for name, data in files.items()}
    ram = RamTier(16 * BLOCK)
    blocks = Blocks(
        bucket,  # type: ignore[arg-type]
        [ram],
        block_size=BLOCK,
        downloads=trio.CapacityLimiter(16),
        memory=ram,
    )
    readers = {
        name: BlockReader(
            blocks,
            name,
            infos[name].generation,
            SHARED_SIZE,
            spawn=Background(nursery).spawn,
            max_ahead_bytes=8 * BLOCK,
        )
        for name in files
    }
    return files, ram, blocks, readers


def furthest_ahead(ram: RamTier, reader: BlockReader) -> int:
    """The last block of ``reader``'s file the RAM tier holds."""
    held = SHARED_SIZE // BLOCK
    return max(i for i in range(held) if ram.holds(BlockKey(reader.name, reader.generation, i)))


async def test_files_reading_ahead_at_once_share_the_depth(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Four files read in turn, block by block, each allowed 8 blocks ahead, through a RAM
    tier of 16 blocks: at their own depth, 32 blocks ahead evicted blocks before they were
    read, and they were fetched again (4 readers of 256 MiB at the defaults: 1.4-1.75x
    the bytes from GCS). Sharing the depth, every byte is fetched once."""
    memory = MemoryBucket()
    bucket = LoggedReads(memory)
    async with trio.open_nursery() as nursery:
        names = [f"f{i}" for i in range(4)]
        files, _, blocks, readers = sharing(bucket, memory, names, nursery)
        for offset in range(0, SHARED_SIZE, BLOCK):
            for name, reader in readers.items():
                got = await reader.read(offset, BLOCK)
                assert bytes(got) == files[name][offset : offset + BLOCK]
            await trio.sleep(0.05)  # (the readers are slower than the link)
        for reader in readers.values():
            reader.close()
    assert blocks.gcs_bytes == 4 * SHARED_SIZE
    assert len(blocks.reading_ahead) == 0


async def test_a_file_left_open_leaves_its_share_of_the_depth(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A file that read a little and was left open (a shard a data loader comes back to)
    takes no share of the read-ahead depth once it has not read for `AHEAD_IDLE_S`: the
    file still reading goes as far ahead as it would alone."""
    memory = MemoryBucket()
    async with trio.open_nursery() as nursery:
        files, ram, blocks, readers = sharing(memory, memory, ["idle", "busy"], nursery)
        for offset in range(0, 2 * BLOCK, BLOCK):  # both read, then one stops
            for name, reader in readers.items():
                assert (
                    bytes(await reader.read(offset, BLOCK)) == files[name][offset : offset + BLOCK]
                )
        await trio.sleep(AHEAD_IDLE_S)
        busy = readers["busy"]
        for offset in range(2 * BLOCK, 12 * BLOCK, BLOCK):
            assert bytes(await busy.read(offset, BLOCK)) == files["busy"][offset : offset + BLOCK]
            await trio.sleep(0.05)
        await trio.testing.wait_all_tasks_blocked()
        assert furthest_ahead(ram, busy) == 11 + 8  # the whole depth, not half of it
        for reader in readers.values():
            reader.close()
    assert len(blocks.reading_ahead) == 0


def test_files_read_at_once_through_a_mount_are_fetched_once(
    mount: Mount, gcs_client: storage.Client
) -> None:
    """At the defaults (no cache dir, a 256 MiB RAM tier, read-ahead up to half of it), four
    96 MiB files read at once: each at its own depth, 384 MiB read ahead through a tier of
    256 evicted blocks before they were read, and GCS served 1.4-1.8x the bytes. Sharing
    the depth, each byte comes from GCS once."""
    files = {f"shard-{i}": os.urandom(96 * MiB) for i in range(4)}
    for name, data in files.items():
        gcs_client.bucket(mount.bucket).blob(name).upload_from_string(data)

    def read(name: str) -> bool:
        with open(mount.path / name, "rb", buffering=0) as handle:
            got = bytearray()
            while chunk := handle.read(MiB):
                got += chunk
        return got == files[name]

    with concurrent.futures.ThreadPoolExecutor(len(files)) as pool:
        assert all(pool.map(read, files))
    # Exact in 5 runs of 5; a block or two of slack for a reader thread held off the CPU
    # for a second (it then takes no share for a moment). Not sharing: +120-128 MiB.
    assert stats(mount)["gcs"]["bytes_read"] <= 4 * 96 * MiB + 16 * MiB


@pytest.mark.parametrize("answered_meanwhile", [False, True])
async def test_a_file_waiting_long_for_its_block_keeps_its_share(
    autojump_clock: trio.testing.MockClock, answered_meanwhile: bool
) -> None:
    """A file whose read waits longer than `AHEAD_IDLE_S` for its block (a slow link) is
    still reading, also when another read of it (the kernel sends several at once) was
    answered meanwhile: the other file keeps to half the depth."""

    class SlowFor(LoggedReads):
        async def read(self, name: str, **kwargs: object) -> bytes | memoryview:  # type: ignore[override]
            if name == "slow" and (kwargs["offset"] == BLOCK or not answered_meanwhile):
                await trio.sleep(10 * AHEAD_IDLE_S)
            return await self.bucket.read(name, **kwargs)  # type: ignore[arg-type]

    memory = MemoryBucket()
    async with trio.open_nursery() as nursery:
        files, ram, _, readers = sharing(SlowFor(memory), memory, ["slow", "busy"], nursery)
        slow = readers["slow"]

        async def slow_read(offset: int) -> None:
            got = await slow.read(offset, BLOCK)
            assert bytes(got) == files["slow"][offset : offset + BLOCK]

        if answered_meanwhile:  # block 1 waits, block 2 (read ahead) is answered at once
            await slow_read(0)
            nursery.start_soon(slow_read, BLOCK)
            await trio.testing.wait_all_tasks_blocked()
            with trio.fail_after(AHEAD_IDLE_S / 2):
                await slow_read(2 * BLOCK)
        else:
            nursery.start_soon(slow_read, 0)
        await trio.sleep(2 * AHEAD_IDLE_S)  # the slow file's read still waits
        busy = readers["busy"]
        for offset in range(0, 12 * BLOCK, BLOCK):
            assert bytes(await busy.read(offset, BLOCK)) == files["busy"][offset : offset + BLOCK]
        await trio.testing.wait_all_tasks_blocked()
        assert furthest_ahead(ram, busy) == 11 + 4  # half: the slow file is still reading
        await trio.sleep(20 * AHEAD_IDLE_S)
        for reader in readers.values():
            reader.close()
