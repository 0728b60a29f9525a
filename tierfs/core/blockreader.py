"""`BlockReader`: one open file's reads of one object generation, from `Blocks`.

It keeps the last block it used (kernel reads are 128 KiB to 1 MiB, blocks are larger),
detects sequential reading and then prefetches the next blocks in the background,
doubling how far ahead it goes up to ``sequential-read-size-mb``; a first read at offset
0 is a sequential reader's start and prefetches `FIRST_AHEAD` blocks at once. With the
file cache on and parallel downloads off, that read-ahead is one request at a time, in
order, as gcsfuse's single download stream. With the SSD file cache on, the first read at offset 0
(or any first read, with ``cache-file-for-range-read``) starts a background job that
brings the whole object into the cache with ``parallel-downloads-per-file`` workers
(`Blocks.fill`); readers wait only for the blocks they need.
"""

from __future__ import annotations

import logging

import trio

from tierfs.cache import BlockKey, Data
from tierfs.core.background import Spawn
from tierfs.core.blocks import Blocks, Flight
from tierfs.core.pace import PACE_WAIT_S

log = logging.getLogger("tierfs.blocks")

# Blocks fetched ahead at a first read at offset 0. Why not wait for a second read: a
# trace of the downloads showed the reader's next reads coming only once block 0 had, so
# each file began with one block's round trip alone (+20 ms and 200 MB/s per connection:
# 64 of 380 ms for a 256 MiB file). Why 4 of the 8 a reader ramps up to: a reader of a
# header only (file, safetensors) costs at most 32 MiB of downloads. Cold read, shaped
# link, 4 x 256 MiB (probe): none ahead 653-685 MB/s, 1 block 665-690, 4 blocks 775-808,
# 8 blocks 736-742.
FIRST_AHEAD = 4

# A file that has read nothing for this long (an open shard a data loader comes back to
# later) leaves its share of the read-ahead depth to the files still reading. As long
# as a fill's pace waits for a reader that stopped (`tierfs.core.pace.PACE_WAIT_S`).
AHEAD_IDLE_S = PACE_WAIT_S


class BlockReader:
    """One open file's reads of one object generation."""

    def __init__(
        self,
        blocks: Blocks,
        name: str,
        generation: int,
        size: int,
        *,
        spawn: Spawn | None,
        max_ahead_bytes: int,
        fill: bool = False,
        fill_on_range_read: bool = False,
        crc32c: str | None = None,
    ) -> None:
        self.blocks = blocks
        self.name = name
        self.generation = generation
        self.size = size
        self.spawn = spawn
        self.max_ahead = max(1, max_ahead_bytes // blocks.block_size)
        self.fill = fill
        self.fill_on_range_read = fill_on_range_read
        self.crc32c = crc32c
        self._ahead = 0
        self._next = -1
        self._prefetched_to = -1
        self._last: tuple[int, Data] | None = None
        self._at = -1  # the block read last (`_reached`), whole or not
        # The download the block read last is coming from, while it was read in parts.
        self._coming: tuple[int, Flight] | None = None
        self._first = True
        self._chaining = False  # serial read-ahead: its one task is running
        self._chain_stop = -1
        self._pacing = False  # a fill of this object keeps our pace (`tierfs.core.pace`)
        self.reads = 0  # reads under way (`read`): however long they wait, not idle
        self._unread: set[int] = set()  # blocks read ahead, not read yet (`Blocks.read_ahead`)

    async def read(self, offset: int, length: int) -> bytes | memoryview:
        if offset >= self.size or length <= 0:
            return b""
        end = min(offset + length, self.size)
        size = self.blocks.block_size
        first, last = offset // size, (end - 1) // size
        random = offset != self._next and not (self._first and offset == 0)
        job = self._announce(offset, last, end)
        self.reads += 1
        try:  # a reader waiting for its blocks has not stopped: the fill stays paced
            return await self._read(offset, end, first, last, random)
        finally:
            self.reads -= 1
            reading = self.blocks.reading_ahead
            if self in reading:  # (not once closed, or no longer reading ahead)
                reading[self] = trio.current_time()
            self.blocks.paces.answered(job)

    def _announce(self, offset: int, last: int, end: int) -> tuple[str, int]:
        """A read of [offset, end) is asked for: plan background work, and tell the fill's
        pace where the reader is, before its blocks arrive."""
        self._plan(offset, last)
        job = (self.name, self.generation)
        if not self._pacing:
            self._pacing = True
            self.blocks.paces.opened(job)
        self.blocks.paces.at(job, last)
        self._next = end
        return job

    def read_now(self, offset: int, length: int) -> bytes | memoryview | None:
        """`read`'s answer when it needs no wait: within the block last used, or a random
        read the RAM tier answers (its block, or kept pieces); None: await `read`.

        Why: a request that waits for nothing needs none of the machinery that lets a
        waiting one be interrupted (a cancel scope per request: 6 of 15 us in-process for
        a second touch of a random 4 KiB region). The bookkeeping is `read`'s."""
        if offset >= self.size or length <= 0 or self._first:
            return None  # (a first read may start a fill: `read` decides)
        end = min(offset + length, self.size)
        size = self.blocks.block_size
        first, last = offset // size, (end - 1) // size
        if first != last:
            return None
        data: bytes | memoryview | None
        if self._last is not None and self._last[0] == first:
            start = offset - first * size
            data = memoryview(self._last[1])[start : start + end - offset]
        elif offset != self._next:
            key = BlockKey(self.name, self.generation, first)
            data = self.blocks.read_random_now(key, offset, end - offset, self.size)
        else:
            return None
        if data is None:
            return None
        self._unread.discard(first)
        self.blocks.paces.answered(self._announce(offset, last, end))
        return data

    async def _read(
        self, offset: int, end: int, first: int, last: int, random: bool
    ) -> bytes | memoryview:
        size = self.blocks.block_size
        if random and first == last and (self._last is None or self._last[0] != first):
            self._unread.discard(first)
            key = BlockKey(self.name, self.generation, first)
            return await self.blocks.read_random(key, offset, end - offset, self.size)
        if first == last:
            start = offset - first * size
            return await self._part(first, start, start + end - offset)
        # Across blocks: each block's part, joined (not the whole blocks: a 1 MiB read
        # kept 16 MiB alive and copied 16 MiB), and a random read's parts as random reads
        # (it downloaded both 8 MiB blocks whole: one 1 MiB random read in eight).
        parts: list[Data] = [b""] * (last - first + 1)

        async def one(i: int) -> None:
            lo, hi = max(offset, i * size), min(end, (i + 1) * size)
            if random and (self._last is None or self._last[0] != i):
                self._unread.discard(i)
                key = BlockKey(self.name, self.generation, i)
                parts[i - first] = await self.blocks.read_random(key, lo, hi - lo, self.size)
            else:
                parts[i - first] = memoryview(await self._block(i))[lo - i * size : hi - i * size]

        async with trio.open_nursery() as nursery:
            for i in range(first, last + 1):
                nursery.start_soon(one, i)
        return b"".join(parts)

    async def _part(self, index: int, lo: int, hi: int) -> Data:
        """Bytes [lo, hi) of block ``index``: from the whole block once it is here, else as
        soon as they have come (`Blocks.get_part`)."""
        self._unread.discard(index)
        if self._last is not None and self._last[0] == index:
            return memoryview(self._last[1])[lo:hi]
        key = BlockKey(self.name, self.generation, index)
        coming = self._coming[1] if self._coming is not None and self._coming[0] == index else None
        self._coming = None
        data, whole, flight = await self.blocks.get_part(key, self.size, lo, hi, coming)
        self._reached(index)
        if not whole:
            # The rest of this block is asked of the same download (`Blocks.get_part`);
            # an older block kept, gone past, is let go (first to leave the RAM tier).
            self._last, self._coming = None, (index, flight) if flight is not None else None
            self.blocks.kept_last.keeps(self)
            return data
        self._keep(index, data)
        return memoryview(data)[lo:hi]

    async def _block(self, index: int) -> Data:
        self._unread.discard(index)
        if self._last is not None and self._last[0] == index:
            return self._last[1]
        data = await self.blocks.get(BlockKey(self.name, self.generation, index), self.size)
        self._reached(index)
        self._keep(index, data)
        return data

    def _reached(self, index: int) -> None:
        """The reader is at block ``index`` now: the block before, gone past in order, is
        the first to go from RAM."""
        if self._at == index - 1:
            self.blocks.went_past(BlockKey(self.name, self.generation, index - 1))
        self._at = index

    def _keep(self, index: int, data: Data) -> None:
        self._last, self._coming = (index, data), None
        self.blocks.kept_last.keeps(self)

    def let_go_of_last(self) -> None:
        self._last = self._coming = None

    def _plan(self, offset: int, last: int) -> None:
        """Start background work: a whole-object fill, or sequential read-ahead."""
        first_read, self._first = self._first, False
        # A first read at offset 0 starts a whole-file reader: read ahead at once
        # (`FIRST_AHEAD`), not after its first block has come.
        sequential = offset == self._next or (first_read and offset == 0)
        if self.spawn is None or not self.blocks.tiers:
            return  # nowhere to keep prefetched blocks
        if first_read and self.fill and (offset == 0 or self.fill_on_range_read):
            self.spawn(self.blocks.fill, self.name, self.generation, self.size, self.crc32c)
            return
        if not sequential:
            self._ahead = 0
            self.blocks.reading_ahead.pop(self, None)
            return
        if self.blocks.filling(self.name, self.generation):
            self.blocks.reading_ahead.pop(self, None)
            return  # the fill is this file's read-ahead, ``per_file`` downloads at a time
        serial = self.fill and self.blocks.per_file == 1
        first = FIRST_AHEAD if first_read else 1
        # Files reading ahead at once share the depth: each at its own, 4 readers of 256
        # MiB files (defaults, no cache dir) evicted blocks read ahead before they were
        # read and fetched them again, 1.4-1.75x the bytes from GCS. A file with no read
        # under way that has not read for `AHEAD_IDLE_S` (left open) takes no share.
        now = trio.current_time()
        reading = self.blocks.reading_ahead
        reading[self] = now
        sharing = sum(
            1
            for reader, when in reading.items()
            if now - when < AHEAD_IDLE_S or getattr(reader, "reads", 0) > 0
        )
        most = max(1, self.max_ahead // sharing)
        self._ahead = min(max(first, self._ahead * 2), most)
        start = max(last + 1, self._prefetched_to + 1)
        stop = min(last + self._ahead, self.blocks.blocks_of(self.size) - 1)
        if start <= stop:
            self._unread.update(range(start, stop + 1))
            self.blocks.read_ahead += stop + 1 - start
        if serial:
            # As gcsfuse without parallel downloads: one request at a time, in order.
            self._chain_stop = stop
            if not self._chaining and start <= stop:
                self._chaining = True
                self.spawn(self._chain, start)
        else:
            for index in range(start, stop + 1):
                self.spawn(self._prefetch, index)
        self._prefetched_to = max(self._prefetched_to, stop)

    async def _chain(self, index: int) -> None:
        try:
            while index <= self._chain_stop:
                await self._prefetch(index)
                index += 1
        finally:
            self._chaining = False

    async def _prefetch(self, index: int) -> None:
        try:
            await self.blocks.get(BlockKey(self.name, self.generation, index), self.size)
        except Exception as err:  # a failed prefetch only means the reader fetches later
            log.debug("prefetch of gs://%s block %d failed: %s", self.name, index, err)

    def close(self) -> None:
        self._last = self._coming = None
        self.blocks.reading_ahead.pop(self, None)
        self.blocks.kept_last.gone(self)
        self.blocks.read_ahead_unread += len(self._unread)  # what read-ahead cost for nothing
        self._unread.clear()
        if self._pacing:
            self._pacing = False
            self.blocks.paces.closed((self.name, self.generation))
