"""`RamTier`: the RAM tier, whole blocks in recency order (and of the pieces random reads
fetched), bounded in bytes.

It sits between the kernel page cache and the SSD tier (DESIGN decisions 2, 3, 7).
Blocks are immutable ``bytes`` keyed by `BlockKey` (name, generation, index), so a
new generation of an object is simply a new key: nothing is ever invalidated, old
blocks age out.

Invariants:

- ``used_bytes <= capacity_bytes`` at every checkpoint: the store is a
  ``cachetools.Cache`` whose ``maxsize`` is the capacity in bytes and whose
  ``getsizeof`` is ``len``; it evicts least recently used blocks before inserting
  (blocks a sequential reader has gone past first: `demote`).
- A block larger than the whole capacity is not stored (and evicts nothing); nor is an
  empty one (it would cost nothing in bytes, so an unbounded number could pile up).
- A put of a key already present only refreshes its recency (same key, same bytes).
- ``max_bytes == 0`` disables the tier: every get misses, every put stores nothing.
- Everything is synchronous and happens between two checkpoints, so each method is
  atomic for trio tasks (decision 7). The methods are ``async`` only to fit the
  `Tier` protocol; they never await, and memory use is the capacity plus the index
  (one small entry per block, and per object name for `discard`).
"""

from __future__ import annotations

from collections import OrderedDict
from pathlib import Path

import trio
import trio.lowlevel
from cachetools import Cache

from tierfs.cache import BlockKey, Data, PieceKey
from tierfs.cache.buffers import give_back_heap, pooled

Key = BlockKey | PieceKey

__all__ = ["RamTier"]


HEAP_GIVE_BACK_BYTES = 32 << 20  # heap memory evicted for buffers before it is given back


class _Blocks(Cache[Key, Data]):
    """A cache of blocks in recency order (least recent evicted first) that keeps a
    by-name index and counts its evictions. Blocks and the pieces random reads fetched
    share it, so both count against one budget.

    Unlike `cachetools.LRUCache` it can *demote* a block to the eviction end: a block a
    sequential reader has gone past is the cheapest to lose, cheaper than one a fill
    brought in ahead of its reader. (With plain LRU, 4 restores at once on one machine
    evicted the blocks their fills had brought ahead, read them back from the SSD tier,
    and each copy back into RAM evicted the next one ahead: 1.3-1.7x the checkpoint
    read back from the SSD tier.)"""

    def __init__(self, maxsize: int) -> None:
        super().__init__(maxsize=maxsize, getsizeof=len)
        self.by_name: dict[str, set[Key]] = {}
        self.evictions = 0
        self.pooled_bytes = 0  # of block buffers (`tierfs.cache.buffers`); the rest: bytes
        self._order: OrderedDict[Key, None] = OrderedDict()

    def __getitem__(self, key: Key) -> Data:
        value = super().__getitem__(key)
        self._order.move_to_end(key)
        return value

    def __setitem__(self, key: Key, value: Data) -> None:
        if key in self:
            self._forget_size(key)
        super().__setitem__(key, value)
        if pooled(value):
            self.pooled_bytes += len(value)
        self._order[key] = None
        self._order.move_to_end(key)
        self.by_name.setdefault(key.name, set()).add(key)

    def _forget_size(self, key: Key) -> None:
        value = Cache.__getitem__(self, key)  # (no recency change: ours is `_order`)
        if pooled(value):
            self.pooled_bytes -= len(value)

    def __delitem__(self, key: Key) -> None:
        self._forget_size(key)
        super().__delitem__(key)
        del self._order[key]
        keys = self.by_name.get(key.name)
        if keys is not None:
            keys.discard(key)
            if not keys:
                del self.by_name[key.name]

    def demote(self, key: Key) -> None:
        """Make ``key`` the next to be evicted (if held)."""
        if key in self._order:
            self._order.move_to_end(key, last=False)

    def popitem(self) -> tuple[Key, Data]:
        if not self._order:
            raise KeyError("no blocks to evict")
        key = next(iter(self._order))
        value = self.pop(key)
        self.evictions += 1
        return key, value


class RamTier:
    """Blocks in memory, least recently used evicted first; at most ``max_bytes``."""

    name = "ram"
    persistent = False  # gone with the process: no whole objects, no passthrough

    def __init__(self, max_bytes: int) -> None:
        if max_bytes < 0:
            raise ValueError(f"RAM tier size must be >= 0 bytes, not {max_bytes}")
        self._max_bytes = max_bytes
        self._blocks = _Blocks(max(max_bytes, 1))
        self._counts = dict.fromkeys(("hits", "misses", "piece_hits", "piece_misses"), 0)
        self._bytes_read = 0
        self._bytes_written = 0
        self._errors = 0
        self._pieces_stored = 0
        # Bytes held back for downloads under way (`reserve`): they are in memory too.
        self._reserved = 0
        self._reserved_peak = 0
        self._room = trio.lowlevel.ParkingLot()
        self._heap_freed = 0  # heap memory evicted for block buffers (`_give_back_heap`)

    async def get(self, key: BlockKey) -> Data | None:
        return self._lookup(key, "")

    def _lookup(self, key: Key, kind: str) -> Data | None:
        """A block or (``kind`` "piece_") a piece, counted as a hit or a miss of its kind."""
        data = self._blocks.get(key)
        if data is None:
            self._counts[kind + "misses"] += 1
            return None
        self._counts[kind + "hits"] += 1
        self._bytes_read += len(data)
        return data

    def holds(self, key: BlockKey) -> bool:
        return key in self._blocks

    async def put(self, key: BlockKey, data: Data) -> None:
        if not data or len(data) > self._max_bytes:
            return
        if key in self._blocks:
            self._blocks[key]  # the same key holds the same bytes: only refresh its recency
            return
        in_buffer = pooled(data)
        self._make_room(len(data), for_buffers=in_buffer)
        # A block buffer's view is kept as it is (no one writes it, and it is not reused
        # while this view lives); any other buffer is copied, as it may change.
        self._blocks[key] = data if in_buffer else bytes(data)
        self._bytes_written += len(data)
        if in_buffer:
            await self._give_back_heap()

    # -- memory held by downloads ---------------------------------------------------------

    @property
    def max_bytes(self) -> int:
        return self._max_bytes

    def buffer_room(self, block_size: int) -> int:
        """How many block buffers (`tierfs.cache.buffers`) the tier's budget leaves room
        for: all of it but what the tier holds in other memory (pieces, blocks read from
        the slower tiers). Idle buffers beyond that are unmapped, so that they and what
        the tier holds stay within its size (kept all the same, they took the daemon to
        390 MiB in random reads with a cache dir, the tier full of pieces)."""
        other = int(self._blocks.currsize) - self._blocks.pooled_bytes
        return max(0, self._max_bytes - other) // block_size

    async def reserve(self, nbytes: int) -> None:
        """Hold back ``nbytes`` of the tier for a download under way (its bytes,
        `tierfs.core.blocks.DOWNLOAD_COPIES` times), evicting blocks for them, so that the
        daemon's memory is the tier's size however many downloads run. Waits while other
        downloads' reservations fill the tier (one always goes ahead). Pair with
        `release`."""
        while self._reserved and self._reserved + nbytes > self._max_bytes:
            await self._room.park()
        self._reserved += nbytes
        self._reserved_peak = max(self._reserved_peak, self._reserved)
        self._make_room(0, for_buffers=True)  # (downloads land in block buffers)
        await self._give_back_heap()

    def demote(self, key: BlockKey) -> None:
        """A sequential reader has gone past this block: evict it before the others."""
        self._blocks.demote(key)

    def release(self, nbytes: int) -> None:
        self._reserved -= nbytes
        self._room.unpark_all()

    def _make_room(self, nbytes: int, *, for_buffers: bool = False) -> None:
        """Evict until the blocks, the reservations and ``nbytes`` fit. ``for_buffers``:
        the room is for block buffers, so what it evicts of other memory (pieces, blocks
        read from slower tiers: the malloc heap's) counts towards `_give_back_heap`."""
        blocks = self._blocks
        other = int(blocks.currsize) - blocks.pooled_bytes
        while blocks and blocks.currsize + self._reserved + nbytes > self._max_bytes:
            blocks.popitem()
        if for_buffers:
            self._heap_freed += other - (int(blocks.currsize) - blocks.pooled_bytes)

    async def _give_back_heap(self) -> None:
        """Once `HEAP_GIVE_BACK_BYTES` of heap memory were evicted to make room for block
        buffers, hand the heap's free pages back to the kernel (`give_back_heap`, in a
        worker thread: 2-9 ms). Without it the heap keeps what pieces took at their peak
        while the buffers that replaced them are mapped beside it: random reads without
        a cache dir peaked at 354-386 MiB (heap 269 MiB for 200 MiB of pieces, 56 MiB
        of buffers), against 338 with every block in the heap."""
        if self._heap_freed < HEAP_GIVE_BACK_BYTES:
            return
        self._heap_freed = 0
        # Shielded: `reserve` has taken its room by now, and a cancel here would leave
        # that reservation to no one (its caller releases only once `reserve` returns).
        with trio.CancelScope(shield=True):
            await trio.to_thread.run_sync(give_back_heap)

    async def discard(self, name: str, generation: int | None = None) -> None:
        keys = self._blocks.by_name.get(name, ())
        for key in [k for k in keys if generation is None or k.generation == generation]:
            del self._blocks[key]

    async def read_part(self, key: BlockKey, offset: int, length: int) -> Data | None:
        return self.read_part_now(key, offset, length)

    def read_part_now(self, key: BlockKey, offset: int, length: int) -> Data | None:
        data = self._blocks.get(key)
        if data is None:
            return None  # (not a miss yet: the caller looks further)
        self._counts["hits"] += 1
        self._bytes_read += length
        return data[offset : offset + length]

    def get_piece(self, key: PieceKey) -> bytes | None:
        data = self._lookup(key, "piece_")
        return None if data is None else bytes(data)  # (a piece is bytes: no copy made)

    def put_piece(self, key: PieceKey, data: bytes) -> None:
        if not data or len(data) > self._max_bytes or key in self._blocks:
            return
        self._make_room(len(data))
        self._blocks[key] = bytes(data)
        self._bytes_written += len(data)
        self._pieces_stored += 1

    async def seal(self, name: str, generation: int, size: int) -> bool:
        return False

    async def passthrough(self, name: str, generation: int, size: int) -> None:
        return None

    def takes_files_from(self, directory: Path) -> bool:
        return False  # keeps no whole objects

    async def adopt(self, source: Path, name: str, generation: int, size: int) -> bool:
        return False

    async def fetching(self, key: BlockKey) -> None:
        return None  # no other node shares this tier

    async def fetched(self, key: BlockKey) -> None:
        pass

    def unpin(self, pinned: object) -> None:
        pass

    def statistics(self) -> dict[str, int]:
        return {
            "hits": self._counts["hits"],
            "misses": self._counts["misses"],
            "bytes_read": self._bytes_read,
            "bytes_written": self._bytes_written,
            "evictions": self._blocks.evictions,
            "used_bytes": int(self._blocks.currsize),
            "pooled_bytes": self._blocks.pooled_bytes,
            "capacity_bytes": self._max_bytes,
            "entries": len(self._blocks),
            "errors": self._errors,
            "piece_hits": self._counts["piece_hits"],
            "piece_misses": self._counts["piece_misses"],
            "pieces_stored": self._pieces_stored,
            "reserved_bytes": self._reserved,
            "reserved_peak_bytes": self._reserved_peak,
        }
