"""Random reads of `tierfs.core.blocks.Blocks`: only the bytes asked for, from a tier that
holds their block, else from *pieces* (`PIECE_BYTES`) a random read fetched and the RAM
tier keeps, else one ranged GCS read of the pieces they span.

Why not whole blocks: a block is the unit of sequential caching; fetching 8 MiB to
answer 4 KiB costs 2,000 times the bytes and the time, and across a large object evicts
what sequential readers need. `read_random_now` answers from memory alone, without an
await, so the FUSE handler can skip what a waiting request needs
(`tierfs.fuse.operations`). Part of `Blocks`, sharing its state.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from tierfs.cache import BlockKey, Data, PieceKey, Tier

if TYPE_CHECKING:  # a part of Blocks, sharing its state
    from typing import Any as _Base
else:
    _Base = object

log = logging.getLogger("tierfs.blocks")

# What a random read fetches and keeps, at least. Small, so that the RAM tier remembers
# many regions: 8 s of random 4 KiB reads over a 1 GiB object touch ~6,000 of them,
# which in 256 KiB pieces was 1.5 GiB, six times a 256 MiB RAM tier, and a second touch
# found ~25 % (742-822 IOPS); in 16 KiB pieces it is ~100 MiB, and a second touch ran at
# 6,229 IOPS with no GCS request (`benchmarks` rand, plain, same machine). A larger read
# still fetches all the pieces it spans in one request.
PIECE_BYTES = 16 << 10
RANGE_IN_BUFFER_BYTES = 256 << 10  # a random read's range at least this large: see `_fetch_range`


class _RandomReads(_Base):
    """read_random(_now) and the pieces of `Blocks`."""

    async def read_random(
        self, key: BlockKey, offset: int, length: int, size: int
    ) -> bytes | memoryview:
        """A random read of ``length`` bytes at ``offset`` of the object, within block
        ``key``: only these bytes from a tier that holds the block (a slice in RAM, one
        pread on the SSD tier), else the whole block if a tier must check it first or its
        download is under way, else pieces (`_kept`, `_fetch_range`). Only a block the SSD
        tier must check first (found on disk at mount) is read whole, once; otherwise no
        whole block is read or brought into RAM for a 4 KiB read: across a large object
        that evicted what sequential readers need and cost 8 MiB of reading per read."""
        self.random_reads += 1
        within = offset - key.index * self.block_size
        for tier in self.tiers:
            try:
                part = await tier.read_part(key, within, length)
            except Exception as err:  # a failing tier is a miss, never the user's error
                self._tier_failed(tier, key, err)
                continue
            if part is not None:
                return part
        # Pieces an earlier random read kept, before a block the tiers may hold: answered
        # without an await (a second touch: 61-63 -> 53-56 us of daemon CPU per read).
        kept = self._kept(key.name, key.generation, offset, length, size)
        if kept is not None:
            return kept
        data = await self.cached(key, size)
        if data is None:
            return await self._fetch_range(key.name, key.generation, offset, length, size)
        return memoryview(data)[within : within + length]

    def read_random_now(
        self, key: BlockKey, offset: int, length: int, size: int
    ) -> bytes | memoryview | None:
        """`read_random`'s answer when it needs no wait: from a tier that answers at once
        (the RAM tier's block), else from kept pieces; None: await `read_random`."""
        within = offset - key.index * self.block_size
        for tier in self.tiers:
            try:
                part = tier.read_part_now(key, within, length)
            except Exception as err:  # as in `read_random`: a miss, never the user's error
                self._tier_failed(tier, key, err)
                continue
            if part is not None:
                self.random_reads += 1
                return part
        kept = self._kept(key.name, key.generation, offset, length, size)
        if kept is not None:
            self.random_reads += 1
        return kept

    def _tier_failed(self, tier: Tier, key: BlockKey, err: Exception) -> None:
        self.tier_errors += 1
        log.warning("%s tier failed to read %s: %s", tier.name, key, err)

    def _kept(
        self, name: str, generation: int, offset: int, length: int, object_size: int
    ) -> bytes | None:
        """A random read's bytes if a tier keeps all the pieces they span (RAM), else None."""
        piece = self.piece_bytes
        first, end = offset - offset % piece, min(offset + length, object_size)
        parts = []
        for start in range(first, end, piece):
            part = self._piece(PieceKey(name, generation, start))
            if part is None:
                return None
            parts.append(part)
        joined = parts[0] if len(parts) == 1 else b"".join(parts)
        return joined[offset - first : end - first]

    async def _fetch_range(
        self, name: str, generation: int, offset: int, length: int, object_size: int
    ) -> Data:
        """A random read's bytes, in whole *pieces* (`PIECE_BYTES`, aligned), with one
        ranged GCS read of the pieces it spans, kept in the tiers that keep pieces (RAM),
        so that the next touch of the same region needs no request (`_kept`). (A block is
        the unit of sequential caching; fetching 8 MiB to answer 4 KiB would cost 2,000
        times the bytes and the time; a piece costs one request's latency plus its few
        KiB. Measured on the emulator: 1 MiB pieces cut first-touch 4 KiB reads from ~900
        to ~620 IOPS.)

        Not under the downloads limiter: a reader waiting on one small range must not
        queue behind a whole-object fill's block downloads (measured: QD1 random reads
        during a 1 GiB fill fell to 13/s). The bucket's own limiter still bounds it."""
        piece = self.piece_bytes
        first, end = offset - offset % piece, min(offset + length, object_size)
        starts = range(first, end, piece)
        last = min(starts[-1] + piece, object_size)
        # A large range lands in a block buffer (reused), not in a new bytes object that
        # is freed once its pieces are copied out: such transients, 1 MiB each between
        # the 16 KiB pieces that stay, left the heap fragmented (random 1 MiB reads).
        big = RANGE_IN_BUFFER_BYTES <= last - first <= self.block_size
        data = await self.bucket.read(
            name,
            generation=generation,
            offset=first,
            length=last - first,
            into=self.buffers.take_within if big else None,
        )
        self.gcs_ranges += 1
        self.gcs_bytes += len(data)
        for start in starts:
            part = bytes(data[start - first : start - first + piece])  # (kept: a copy)
            if len(part) == min(piece, object_size - start):  # never keep a short answer
                for tier in self.tiers:
                    tier.put_piece(PieceKey(name, generation, start), part)
        self.buffers.trim()  # (the RAM tier took other memory: see `BlockBuffers.trim`)
        return data[offset - first : end - first]

    def _piece(self, key: PieceKey) -> bytes | None:
        for tier in self.tiers:
            data = tier.get_piece(key)
            if data is not None:
                return data
        return None
