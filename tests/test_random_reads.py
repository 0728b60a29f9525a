"""Random reads that remember (issue 18): a random read fetches the pieces (16 KiB) it
spans, the RAM tier keeps them, and the next touch of those regions asks GCS nothing."""

from __future__ import annotations

import os
import random
from pathlib import Path

import pytest
import trio
from google.cloud import storage
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.conftest import MountFactory
from tests.mounting import stats
from tests.test_mount_option_effects import free_port, scrape
from tests.test_options_forms import CHECKPOINT_LINE
from tierfs.cache import BlockKey
from tierfs.cache.ram import RamTier
from tierfs.cache.ssd import SsdTier
from tierfs.cache.ssd_parts import INLINE_BYTES
from tierfs.core.blockreader import BlockReader
from tierfs.core.blocks import PIECE_BYTES, Blocks
from tierfs.storage.memory import MemoryBucket

MiB = 1 << 20
BLOCK = 8 * MiB  # the default block: random reads never fetch a whole one
SIZE = 5 * MiB + 12345  # the last piece is short
P = PIECE_BYTES


def setup(ram_bytes: int = 64 * MiB) -> tuple[Blocks, BlockReader, bytes]:
    bucket = MemoryBucket("b")
    data = random.Random(7).randbytes(SIZE)
    generation = bucket.put("obj", data).generation
    tiers = [RamTier(ram_bytes)] if ram_bytes else []
    blocks = Blocks(bucket, tiers, block_size=BLOCK, downloads=trio.CapacityLimiter(4))
    reader = BlockReader(blocks, "obj", generation, SIZE, spawn=None, max_ahead_bytes=BLOCK)
    return blocks, reader, data


async def read(reader: BlockReader, offset: int, length: int) -> bytes:
    return bytes(await reader.read(offset, length))


async def test_a_second_touch_of_a_piece_asks_gcs_nothing() -> None:
    blocks, reader, data = setup()
    start = 6 * P  # in the second MiB, not at a block's start
    assert await read(reader, start + P // 2, 4096) == data[start + P // 2 :][:4096]
    assert (blocks.gcs_ranges, blocks.gcs_bytes) == (1, P)  # one piece, one request
    for offset in (start, start + P - 4096, start + 4096):  # the same piece, anywhere in it
        assert await read(reader, offset, 4096) == data[offset : offset + 4096]
    assert blocks.gcs_ranges == 1
    assert blocks.tiers[0].statistics()["piece_hits"] == 3 and blocks.gcs_blocks == 0


async def test_a_read_is_answered_at_once_only_from_what_memory_holds() -> None:
    """`read_now` answers from kept pieces and the block last used, never asks GCS, and
    leaves to `read` a first read (it may start a fill) and a region not fetched yet."""
    blocks, reader, data = setup()
    assert reader.read_now(P, 4096) is None  # the first read
    await read(reader, 6 * P, 4096)
    assert reader.read_now(6 * P + 4096, 4096) is None  # sequential, block not in RAM
    reader._next = -1
    assert reader.read_now(9 * P, 4096) is None  # random, not fetched
    now = reader.read_now(6 * P + 100, 4096)  # random, in the piece kept
    assert now is not None and bytes(now) == data[6 * P + 100 :][:4096]
    assert reader._next == 6 * P + 100 + 4096  # the bookkeeping of `read`
    assert (blocks.gcs_ranges, blocks.gcs_blocks) == (1, 0)


class FailingNow(RamTier):
    """A RAM tier whose answer at once fails (a defect, or a tier closed under us)."""

    def read_part_now(self, key: BlockKey, offset: int, length: int) -> bytes | None:
        raise RuntimeError("broken")


async def test_a_tier_failing_to_answer_at_once_is_a_miss_not_an_error() -> None:
    bucket = MemoryBucket("b")
    data = random.Random(7).randbytes(SIZE)
    generation = bucket.put("obj", data).generation
    blocks = Blocks(
        bucket, [FailingNow(64 * MiB)], block_size=BLOCK, downloads=trio.CapacityLimiter(4)
    )
    reader = BlockReader(blocks, "obj", generation, SIZE, spawn=None, max_ahead_bytes=BLOCK)
    await read(reader, 6 * P, 4096)  # fetched, and its piece kept
    reader._next = -1
    errors = blocks.tier_errors
    now = reader.read_now(6 * P + 100, 4096)  # the tier fails; the kept piece answers
    assert now is not None and bytes(now) == data[6 * P + 100 :][:4096]
    assert blocks.tier_errors == errors + 1


async def test_a_read_across_pieces_fetches_them_in_one_request() -> None:
    blocks, reader, data = setup()
    offset = 3 * P - 100
    assert await read(reader, offset, 4096) == data[offset : offset + 4096]
    assert (blocks.gcs_ranges, blocks.gcs_bytes) == (1, 2 * P)
    assert await read(reader, 2 * P + 5, P // 2) == data[2 * P + 5 :][: P // 2]
    assert await read(reader, 4 * P - 9, 9) == data[4 * P - 9 : 4 * P]
    assert blocks.gcs_ranges == 1


async def test_the_short_last_piece_is_kept_and_read_again() -> None:
    blocks, reader, data = setup()
    last = SIZE - SIZE % P
    assert await read(reader, SIZE - 5000, 8192) == data[SIZE - 5000 :]
    assert await read(reader, last, 100) == data[last : last + 100]
    assert (blocks.gcs_ranges, blocks.gcs_bytes) == (1, SIZE - last)


async def test_without_a_ram_tier_nothing_is_kept() -> None:
    blocks, reader, data = setup(ram_bytes=0)
    for _ in range(2):
        assert await read(reader, 2 * MiB, 4096) == data[2 * MiB : 2 * MiB + 4096]
    assert blocks.gcs_ranges == 2


async def test_pieces_share_the_ram_tiers_budget_and_go_with_their_object() -> None:
    blocks, reader, _data = setup(ram_bytes=2 * P)
    for piece in range(4):  # four pieces through a two-piece tier: the oldest go
        await read(reader, piece * P + 7, 10)
    ram = blocks.tiers[0]
    assert ram.statistics()["used_bytes"] <= 2 * P and ram.statistics()["evictions"] == 2
    await read(reader, 3 * P + 70, 10)  # the newest is still there
    assert blocks.gcs_ranges == 4
    await ram.discard("obj")
    assert ram.statistics()["used_bytes"] == 0


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.integers(0, SIZE - 1), st.integers(1, 300_000)), max_size=12))
def test_random_reads_match_the_object_and_a_second_pass_is_free(
    reads: list[tuple[int, int]],
) -> None:
    """Any random reads return the object's bytes; the same reads again (pieces kept in a
    RAM tier large enough for the object) make no GCS request."""

    async def main() -> None:
        blocks, reader, data = setup()
        for _pass in range(2):
            for offset, length in reads:
                reader._next = -1  # every read random, as after a seek
                if _pass == 1:  # all kept: answered at once, no wait (one block: 5 of 8 MiB)
                    now = reader.read_now(offset, length)
                    assert now is not None and bytes(now) == data[offset : offset + length]
                else:
                    assert await read(reader, offset, length) == data[offset : offset + length]
            if _pass == 0:
                first = blocks.gcs_ranges
        assert blocks.gcs_ranges == first

    trio.run(main)


@pytest.mark.parametrize("seed", [1, 2])
async def test_a_changed_object_is_never_served_from_old_pieces(seed: int) -> None:
    """Pieces are keyed by generation: a new generation reads its own bytes."""
    blocks, reader, data = setup()
    await read(reader, MiB, 4096)
    new = os.urandom(SIZE) if seed == 1 else data[::-1]
    generation = blocks.bucket.put("obj", new).generation  # type: ignore[attr-defined]
    fresh = BlockReader(blocks, "obj", generation, SIZE, spawn=None, max_ahead_bytes=BLOCK)
    assert await read(fresh, MiB, 4096) == new[MiB : MiB + 4096]


async def test_a_ram_tier_remembers_many_more_regions_than_it_could_hold_blocks_of() -> None:
    """200 random 4 KiB reads over 64 MiB, each in a 256 KiB region of its own, with an
    8 MiB RAM tier: read again, every one is answered from RAM (small pieces: 200 of them
    fit in 8 MiB; 200 regions of 256 KiB would be 50 MiB, and most would be gone)."""
    bucket = MemoryBucket("b")
    size = 64 * MiB
    data = random.Random(13).randbytes(size)
    generation = bucket.put("obj", data).generation
    blocks = Blocks(bucket, [RamTier(8 * MiB)], block_size=BLOCK, downloads=trio.CapacityLimiter(4))
    offsets = [region * 256 * 1024 + 8192 for region in random.Random(2).sample(range(256), 200)]
    asked = []
    for _ in range(2):
        reader = BlockReader(blocks, "obj", generation, size, spawn=None, max_ahead_bytes=BLOCK)
        await read(reader, 12345, 1)  # (not where a first read would start: random from here)
        for offset in offsets:
            assert await read(reader, offset, 4096) == data[offset : offset + 4096]
        asked.append(blocks.gcs_ranges)
    assert asked[0] >= len(offsets) and asked[1] == asked[0], asked  # none the second time


async def ssd_setup(root: Path) -> tuple[Blocks, BlockReader, bytes, SsdTier]:
    """An object in the bucket and an SSD tier (no RAM tier) holding its first block."""
    bucket = MemoryBucket("b")
    data = random.Random(11).randbytes(SIZE)
    generation = bucket.put("obj", data).generation
    ssd = await SsdTier.create(root, "b", 64 * MiB, block_size=BLOCK)
    blocks = Blocks(bucket, [ssd], block_size=BLOCK, downloads=trio.CapacityLimiter(4))
    reader = BlockReader(blocks, "obj", generation, SIZE, spawn=None, max_ahead_bytes=BLOCK)
    assert bytes(await reader.read(0, 4096)) == data[:4096]  # sequential: the whole block
    assert blocks.gcs_blocks == 1 and ssd.holds(BlockKey("obj", generation, 0))
    return blocks, reader, data, ssd


async def test_a_random_read_of_a_block_on_the_ssd_tier_reads_only_its_bytes(
    tmp_path: Path,
) -> None:
    """A random 4 KiB read of a block the SSD tier holds (written by this mount) reads 4 KiB
    of the tier's file, not the 8 MiB block and its checksum; GCS is not asked."""
    blocks, reader, data, ssd = await ssd_setup(tmp_path / "cache")
    generation = (await blocks.bucket.stat("obj")).generation
    reader = BlockReader(blocks, "obj", generation, SIZE, spawn=None, max_ahead_bytes=BLOCK)
    before = ssd.statistics()["bytes_read"]
    offsets = [MiB + 4096 * 7, 3 * MiB + 5, 2 * MiB, 5 * MiB + 12345 - 4096]
    for offset in offsets:
        assert await read(reader, offset, 4096) == data[offset : offset + 4096]
    assert ssd.statistics()["bytes_read"] - before == 4096 * len(offsets)
    assert (blocks.gcs_blocks, blocks.gcs_ranges) == (1, 0)
    for offset in offsets:  # again: answered at once, read on the trio thread
        reader._next = -1
        now = reader.read_now(offset, 4096)
        assert now is not None and bytes(now) == data[offset : offset + 4096]
    assert ssd.statistics()["bytes_read"] - before == 2 * 4096 * len(offsets)
    reader._next = -1  # a part larger than INLINE_BYTES is left to `read` (a thread, maybe)
    assert reader.read_now(MiB, INLINE_BYTES + 4096) is None
    assert await read(reader, MiB, INLINE_BYTES + 4096) == data[MiB : MiB + INLINE_BYTES + 4096]


async def test_a_block_from_an_earlier_mount_is_checked_whole_before_parts_of_it_are_read(
    tmp_path: Path,
) -> None:
    """A block found on disk at mount is not trusted for partial reads until it has been
    read whole and its CRC32C checked: bytes damaged on disk are never served, the block
    is fetched from GCS again."""
    blocks, _, data, ssd = await ssd_setup(tmp_path / "cache")
    generation = (await blocks.bucket.stat("obj")).generation
    data_file = ssd.data_path_of("obj", generation)
    with open(data_file, "r+b") as stream:  # rot, after the mount wrote it
        stream.seek(2 * MiB)
        stream.write(b"\xff" * 4096)
    again = await SsdTier.create(tmp_path / "cache", "b", 64 * MiB, block_size=BLOCK)
    blocks = Blocks(blocks.bucket, [again], block_size=BLOCK, downloads=trio.CapacityLimiter(4))
    reader = BlockReader(blocks, "obj", generation, SIZE, spawn=None, max_ahead_bytes=BLOCK)
    assert await read(reader, 2 * MiB, 4096) == data[2 * MiB : 2 * MiB + 4096]
    assert again.statistics()["corrupt"] == 1
    assert blocks.gcs_blocks + blocks.gcs_ranges == 1  # the damaged block came from GCS
    assert await read(reader, 2 * MiB + 8192, 4096) == data[2 * MiB + 8192 :][:4096]


def test_random_reads_through_a_mount_remember_what_they_fetched(
    mount_factory: MountFactory, gcs_client: storage.Client, bucket_name: str
) -> None:
    """Random 4 KiB reads of a 64 MiB object at the defaults, then the same reads again
    after the kernel's page cache is dropped: the second pass makes no GCS media read,
    every read returns the object's bytes, and each is counted in the metrics (answered
    at once from RAM, `read_now`, it still goes through the handler's accounting)."""
    data = os.urandom(64 * MiB)
    gcs_client.bucket(bucket_name).blob("blob").upload_from_string(data)
    port = free_port()
    mount = mount_factory(f"--prometheus-port={port}")
    reads = 'fs_ops_count_total{fs_op="read"}'
    rng = random.Random(3)
    offsets = [rng.randrange(0, len(data) // 4096) * 4096 for _ in range(200)]
    passes = []
    counted = []
    for _ in range(2):
        Path("/proc/sys/vm/drop_caches").write_text("1")  # the kernel's copies of the pages
        before = scrape(port).get(reads, 0)
        fd = os.open(mount.path / "blob", os.O_RDONLY)
        try:
            for offset in offsets:
                assert os.pread(fd, 4096, offset) == data[offset : offset + 4096]
        finally:
            os.close(fd)
        passes.append(stats(mount)["gcs"]["media_reads"])
        counted.append(scrape(port)[reads] - before)
    assert 0 < passes[0] <= len(offsets) and passes[1] == passes[0], passes
    assert counted[1] == counted[0] > 0, counted  # the same reads reached the daemon


def test_random_reads_of_an_object_in_the_ssd_tier_read_only_their_bytes(
    mount_factory: MountFactory, gcs_client: storage.Client, bucket_name: str, tmp_path: Path
) -> None:
    """The GKE checkpointing line with a cache dir, an object larger than the RAM tier (16
    MiB here standing for the default 256 against a checkpoint of GBs): once the object is
    in the SSD tier, random 4 KiB reads (page cache dropped, through an open that is not
    passthrough, as when another handle is open) return its bytes, ask GCS nothing, and
    take a few KiB each from the SSD tier, not their 8 MiB block."""
    data = os.urandom(64 * MiB)
    gcs_client.bucket(bucket_name).blob("blob").upload_from_string(data)
    mount = mount_factory(
        "-o", CHECKPOINT_LINE, f"--cache-dir={tmp_path / 'cache'}", "--ram-cache-max-size-mb=16"
    )
    path = mount.path / "blob"
    holder = os.open(path, os.O_RDONLY)  # later opens then go through the daemon
    try:
        assert (mount.path / "blob").read_bytes() == data  # into the SSD tier
        before = stats(mount)
        Path("/proc/sys/vm/drop_caches").write_text("1")
        rng = random.Random(5)
        offsets = [rng.randrange(0, len(data) // 4096) * 4096 for _ in range(100)]
        fd = os.open(path, os.O_RDONLY)
        try:
            for offset in offsets:
                assert os.pread(fd, 4096, offset) == data[offset : offset + 4096]
        finally:
            os.close(fd)
    finally:
        os.close(holder)
    after = stats(mount)
    assert after["gcs"]["media_reads"] == before["gcs"]["media_reads"]
    ssd_read = after["data"]["tiers"]["ssd"]["bytes_read"]
    ssd_read -= before["data"]["tiers"]["ssd"]["bytes_read"]
    assert 0 < ssd_read <= len(offsets) * MiB, ssd_read


async def test_a_read_across_two_blocks_fetches_and_holds_only_its_bytes() -> None:
    """A read across a block boundary joined the two whole blocks (a 1 MiB read held
    16 MiB and copied it), and a random one downloaded both blocks whole: one random
    1 MiB read in eight crosses a boundary of 8 MiB blocks."""
    bucket = MemoryBucket("b")
    data = random.Random(9).randbytes(20 * MiB)
    generation = bucket.put("obj", data).generation
    blocks = Blocks(
        bucket, [RamTier(64 * MiB)], block_size=BLOCK, downloads=trio.CapacityLimiter(4)
    )
    reader = BlockReader(blocks, "obj", generation, len(data), spawn=None, max_ahead_bytes=BLOCK)
    offset = BLOCK - MiB // 2
    got = await reader.read(offset, MiB)  # a random reader's first read
    assert bytes(got) == data[offset : offset + MiB]
    assert (blocks.gcs_blocks, blocks.gcs_bytes) == (0, MiB)  # pieces, not two blocks
    held = got.obj if isinstance(got, memoryview) else got
    assert len(held) == MiB
    offset = 2 * BLOCK - 4096  # a sequential reader crossing the next boundary
    sequential = BlockReader(blocks, "obj", generation, len(data), spawn=None, max_ahead_bytes=0)
    await sequential.read(0, 4096)
    for start in range(4096, offset, 4 * MiB):
        await sequential.read(start, 4 * MiB)
    got = await sequential.read(offset, 8192)
    assert bytes(got) == data[offset : offset + 8192]
    held = got.obj if isinstance(got, memoryview) else got
    assert len(held) == 8192
