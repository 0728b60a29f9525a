"""`RamTier`: the RAM tier, an LRU of whole blocks bounded in bytes.

It sits between the kernel page cache and the SSD tier (DESIGN decisions 2, 3, 7).
Blocks are immutable ``bytes`` keyed by `BlockKey` (name, generation, index), so a
new generation of an object is simply a new key: nothing is ever invalidated, old
blocks age out.

Invariants:

- ``used_bytes <= capacity_bytes`` at every checkpoint: the store is a
  ``cachetools.LRUCache`` whose ``maxsize`` is the capacity in bytes and whose
  ``getsizeof`` is ``len``; it evicts least recently used blocks before inserting.
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

from typing import Any

from cachetools import LRUCache

from tierfs.cache import BlockKey

__all__ = ["RamTier"]


class _Blocks(LRUCache[BlockKey, bytes]):
    """An LRUCache that keeps a by-name index and counts its evictions."""

    def __init__(self, maxsize: int) -> None:
        super().__init__(maxsize=maxsize, getsizeof=len)
        self.by_name: dict[str, set[BlockKey]] = {}
        self.evictions = 0

    def __setitem__(self, key: BlockKey, value: bytes, *args: Any) -> None:
        super().__setitem__(key, value)
        self.by_name.setdefault(key.name, set()).add(key)

    def __delitem__(self, key: BlockKey, *args: Any) -> None:
        super().__delitem__(key)
        keys = self.by_name.get(key.name)
        if keys is not None:
            keys.discard(key)
            if not keys:
                del self.by_name[key.name]

    def popitem(self) -> tuple[BlockKey, bytes]:
        item = super().popitem()
        self.evictions += 1
        return item


class RamTier:
    """Blocks in memory, least recently used evicted first; at most ``max_bytes``."""

    name = "ram"
    persistent = False  # gone with the process: no whole objects, no passthrough

    def __init__(self, max_bytes: int) -> None:
        if max_bytes < 0:
            raise ValueError(f"RAM tier size must be >= 0 bytes, not {max_bytes}")
        self._max_bytes = max_bytes
        self._blocks = _Blocks(max(max_bytes, 1))
        self._hits = 0
        self._misses = 0
        self._bytes_read = 0
        self._bytes_written = 0
        self._errors = 0

    async def get(self, key: BlockKey) -> bytes | None:
        data = self._blocks.get(key)
        if data is None:
            self._misses += 1
            return None
        self._hits += 1
        self._bytes_read += len(data)
        return data

    def holds(self, key: BlockKey) -> bool:
        return key in self._blocks

    async def put(self, key: BlockKey, data: bytes) -> None:
        if not data or len(data) > self._max_bytes:
            return
        if key in self._blocks:
            self._blocks[key]  # the same key holds the same bytes: only refresh its recency
            return
        self._blocks[key] = bytes(data)
        self._bytes_written += len(data)

    async def discard(self, name: str, generation: int | None = None) -> None:
        keys = self._blocks.by_name.get(name, ())
        for key in [k for k in keys if generation is None or k.generation == generation]:
            del self._blocks[key]

    async def seal(self, name: str, generation: int, size: int) -> bool:
        return False

    async def passthrough(self, name: str, generation: int, size: int) -> None:
        return None

    async def fetching(self, key: BlockKey) -> None:
        return None  # no other node shares this tier

    async def fetched(self, key: BlockKey) -> None:
        pass

    def unpin(self, pinned: object) -> None:
        pass

    def statistics(self) -> dict[str, int]:
        return {
            "hits": self._hits,
            "misses": self._misses,
            "bytes_read": self._bytes_read,
            "bytes_written": self._bytes_written,
            "evictions": self._blocks.evictions,
            "used_bytes": int(self._blocks.currsize),
            "capacity_bytes": self._max_bytes,
            "entries": len(self._blocks),
            "errors": self._errors,
        }
