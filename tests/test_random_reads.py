"""Random reads that remember (issue 18): a random read fetches the pieces (256 KiB) it
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
from tierfs.cache.ram import RamTier
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
    for offset in (start, start + 8192, start + P - 4096):  # the same piece, anywhere in it
        assert await read(reader, offset, 4096) == data[offset : offset + 4096]
    assert blocks.gcs_ranges == 1
    assert blocks.tiers[0].statistics()["piece_hits"] == 3 and blocks.gcs_blocks == 0


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


def test_random_reads_through_a_mount_remember_what_they_fetched(
    mount_factory: MountFactory, gcs_client: storage.Client, bucket_name: str
) -> None:
    """Random 4 KiB reads of a 64 MiB object at the defaults, then the same reads again
    after the kernel's page cache is dropped: the second pass makes no GCS media read, and
    every read returns the object's bytes."""
    data = os.urandom(64 * MiB)
    gcs_client.bucket(bucket_name).blob("blob").upload_from_string(data)
    mount = mount_factory()
    rng = random.Random(3)
    offsets = [rng.randrange(0, len(data) // 4096) * 4096 for _ in range(200)]
    passes = []
    for _ in range(2):
        Path("/proc/sys/vm/drop_caches").write_text("1")  # the kernel's copies of the pages
        fd = os.open(mount.path / "blob", os.O_RDONLY)
        try:
            for offset in offsets:
                assert os.pread(fd, 4096, offset) == data[offset : offset + 4096]
        finally:
            os.close(fd)
        passes.append(stats(mount)["gcs"]["media_reads"])
    assert 0 < passes[0] <= len(offsets) and passes[1] == passes[0], passes
