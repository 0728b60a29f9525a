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

    from tierfs.core.blocks import Memory
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
# A random read of a slower tier at most this large (in whole pieces) is kept in RAM
# (`_promotes`); a larger one is a reader that would evict more than it gains.
PROMOTE_BYTES = 4 * PIECE_BYTES
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
        promote = self._promotes(offset, length, size)
        looked = False
        for tier in self.tiers:
            if tier.persistent and not looked:
                # Pieces kept in RAM before a slower tier's disk: answered without an
                # await (a second touch: 61-63 -> 53-56 us of daemon CPU per read).
                looked = True
                kept = self._kept(key.name, key.generation, offset, length, size)
                if kept is not None:
                    return kept
            try:
                if not tier.persistent:
                    part = self._fast_part(tier, key, within, length, promote)
                elif promote:
                    part = await self._promoted(tier, key, offset, length, size)
                else:
                    part = await tier.read_part(key, within, length)
            except Exception as err:  # a failing tier is a miss, never the user's error
                self._tier_failed(tier, key, err)
                continue
            if part is not None:
                return part
        kept = None if looked else self._kept(key.name, key.generation, offset, length, size)
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
        (the RAM tier's block, the SSD tier's page cache), else from kept pieces; None:
        await `read_random`."""
        within = offset - key.index * self.block_size
        promote = self._promotes(offset, length, size)
        looked = False
        for tier in self.tiers:
            if tier.persistent and not looked:
                looked = True
                kept = self._kept(key.name, key.generation, offset, length, size)
                if kept is not None:
                    self.random_reads += 1
                    return kept
            try:
                if not tier.persistent:
                    part = self._fast_part(tier, key, within, length, promote)
                elif promote:
                    part = self._promoted_now(tier, key, offset, length, size)
                else:
                    part = tier.read_part_now(key, within, length)
            except Exception as err:  # as in `read_random`: a miss, never the user's error
                self._tier_failed(tier, key, err)
                continue
            if part is not None:
                self.random_reads += 1
                return part
        kept = None if looked else self._kept(key.name, key.generation, offset, length, size)
        if kept is not None:
            self.random_reads += 1
        return kept

    # -- small reads from a slower tier, kept in RAM -----------------------------------------

    def _promotes(self, offset: int, length: int, size: int) -> bool:
        """Whether a random read a slower tier (SSD, shared) answers is read in whole
        pieces and kept in RAM: a small one (`PROMOTE_BYTES`), with a RAM tier to keep it.
        Why: a second touch of a region served from the SSD tier paid a disk read each
        time the kernel had dropped the cache file's pages (the same fixed 5,400 random
        4 KiB regions of a cached 1 GiB object: 8,300-8,600 reads a second from the SSD
        tier, 13,000-13,800 from pieces in RAM), and the RAM tier held whole 8 MiB blocks
        of the fill instead, of which a random reader uses 4 KiB."""
        memory = self.memory
        if memory is None or memory.max_bytes <= 0 or self.block_size % self.piece_bytes:
            return False
        first, last = self._piece_span(offset, length, size)
        return last - first <= PROMOTE_BYTES and any(tier.persistent for tier in self.tiers)

    def _fast_part(
        self, tier: Tier, key: BlockKey, within: int, length: int, promote: bool
    ) -> Data | None:
        """A part of a block a tier in memory holds. Where small reads are kept as pieces
        (``promote``), the block's recency is left as it was: blocks a random reader only
        dips into age out while the pieces it reads stay (with the RAM tier's recency
        refreshed by each such read, 5,400 random regions thrashed: 200 of 256 MiB were
        fill blocks kept fresh by a fifth of the reads, the pieces of the rest cycled
        through the 56 MiB left, 583 piece hits for 16,269 pieces kept)."""
        memory: Memory | None = self.memory
        if promote and memory is not None and id(memory) == id(tier):  # (`is` narrows to Tier)
            return memory.peek_part(key, within, length)
        return tier.read_part_now(key, within, length)

    def _admits(self, key: BlockKey, first: int, last: int) -> bool:
        """Whether the RAM tier takes the pieces ``first:last`` of a slower tier's block
        (`tierfs.cache.ram.RamTier.admits`)."""
        memory = self.memory
        assert memory is not None  # (`_promotes`)
        return memory.admits(PieceKey(key.name, key.generation, first), last - first)

    def _piece_span(self, offset: int, length: int, size: int) -> tuple[int, int]:
        """The whole pieces (offsets in the object) a read of ``length`` at ``offset`` spans."""
        piece = self.piece_bytes
        end = min(offset + length, size)
        return offset - offset % piece, min(end + (-end) % piece, size)

    async def _promoted(
        self, tier: Tier, key: BlockKey, offset: int, length: int, size: int
    ) -> Data | None:
        first, last = self._piece_span(offset, length, size)
        start = key.index * self.block_size
        if not self._admits(key, first, last):
            return await tier.read_part(key, offset - start, length)
        part = await tier.read_part(key, first - start, last - first)
        if part is None:
            return None
        return self._keep_pieces(key.name, key.generation, first, part, offset, length, size)

    def _promoted_now(
        self, tier: Tier, key: BlockKey, offset: int, length: int, size: int
    ) -> Data | None:
        first, last = self._piece_span(offset, length, size)
        start = key.index * self.block_size
        if not self._admits(key, first, last):
            return tier.read_part_now(key, offset - start, length)
        part = tier.read_part_now(key, first - start, last - first)
        if part is None:
            return None
        return self._keep_pieces(key.name, key.generation, first, part, offset, length, size)

    def _keep_pieces(
        self,
        name: str,
        generation: int,
        first: int,
        data: Data,
        offset: int,
        length: int,
        size: int,
    ) -> Data:
        """Keep the whole pieces of ``data`` (the object's bytes from ``first``) in the tiers
        that keep pieces (RAM); the bytes asked for."""
        piece = self.piece_bytes
        for start in range(first, first + len(data), piece):
            part = bytes(data[start - first : start - first + piece])  # (kept: a copy)
            if len(part) == min(piece, size - start):  # never keep a short answer
                for tier in self.tiers:
                    tier.put_piece(PieceKey(name, generation, start), part)
        end = min(offset + length, size)
        return data[offset - first : end - first]

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
        answer = self._keep_pieces(name, generation, first, data, offset, length, object_size)
        self.buffers.trim()  # (the RAM tier took other memory: see `BlockBuffers.trim`)
        return answer

    def _piece(self, key: PieceKey) -> bytes | None:
        for tier in self.tiers:
            data = tier.get_piece(key)
            if data is not None:
                return data
        return None
