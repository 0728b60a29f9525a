"""Block buffers: page-aligned mappings that downloaded blocks land in, reused once nothing
holds them.

Why not a new ``bytes`` object per block, as before: two costs came with it.
- The SSD tier writes a block with ``O_DIRECT``, which needs its memory aligned (512
  bytes on the bench VM's disk); a ``bytes`` object's payload never is, so every block
  was copied into an aligned buffer first: 0.18 CPU-s per GiB of a cold read with a
  cache dir, on the reader's CPU budget (2 vCPUs: the emulator, the reader and the
  daemon share them).
- 8 MiB blocks made and freed by the thousand in the malloc heap left holes that small
  allocations split, so the next block needed fresh memory: 22-33 MiB of a 296 MiB heap
  free but held in random reads with a cache dir (glibc's ``malloc_stats``), the RSS
  over its goal.

A mapping is taken for a download (`BlockBuffers.take`) and handed on as a memoryview: to
the readers, the RAM tier, the slower tiers. It is reused only when no memoryview of it
is left anywhere (its reference count is back to the pool's own): a view that lives on
(a reader's last block, the RAM tier's copy, a write in a worker thread) keeps it out of
the pool, so a mapping is never refilled under anyone. Holders must not write into a
view they are given; none does (a block's bytes never change once downloaded).

Idle mappings are kept for reuse (each faulted in once, on huge pages where the kernel
offers them) while the pool holds at most ``keep`` mappings in all: as many blocks as
the RAM tier has room for beside the other memory it holds (and `SPARE` more). Beyond
that, idle ones are unmapped, so the resident size follows what the RAM tier may hold,
not the most ever held. (With only a few idle ones kept, a RAM tier evicting several
blocks at once for a fill's downloads unmapped 68 of 98 mappings in a cold read of 1
GiB, each made again and faulted in; with the RAM tier's whole size kept whatever it
held, the daemon reached 390 MiB in random reads with a cache dir, idle mappings beside
a RAM tier full of pieces.)
"""

from __future__ import annotations

import ctypes
import mmap
import sys
import threading
from collections.abc import Callable
from typing import Any

# Idle mappings kept beyond the RAM tier's room: none. Each idle one is memory beside a
# RAM tier full of other things (random reads without a cache dir, daemon VmHWM: 4 kept,
# 354-386 MiB; 1 kept, 354-360; none, 350); a cold read still maps no more than the
# RAM tier's blocks (30 mappings for 128 blocks, none made twice).
SPARE = 0


class _BlockMap(mmap.mmap):
    """A mapping of `BlockBuffers` (so a view of one can be told from any other buffer)."""


def _refs(maps: list[_BlockMap], index: int) -> int:
    return sys.getrefcount(maps[index])


def _idle_refs() -> int:
    """The reference count `_refs` sees for a mapping only the pool holds (measured, not
    assumed: it depends on the interpreter)."""
    probe: list[Any] = [object()]
    return _refs(probe, 0)


class BlockBuffers:
    """Aligned block-sized mappings, each reused once no view of it is left."""

    def __init__(self, block_size: int, keep: int | Callable[[], int] = SPARE) -> None:
        self.block_size = block_size
        self._keep = keep
        self._maps: list[_BlockMap] = []
        self._idle = _idle_refs()
        self._lock = threading.Lock()  # downloads take buffers in worker threads
        self.made = 0  # mappings made
        self.reused = 0  # takes answered with a mapping made before
        self.unmapped = 0  # idle mappings beyond ``keep``, given back to the kernel
        self.refused = 0  # `take_within` calls answered None (no room)

    def __len__(self) -> int:
        return len(self._maps)

    def take(self, length: int) -> memoryview:
        """A writable view of ``length`` bytes (at most a block) at the start of a mapping
        nothing else holds. The caller fills it and hands it on; it is not reused while
        any view of it lives."""
        view = self._take(length, within=False)
        assert view is not None
        return view

    def take_within(self, length: int) -> memoryview | None:
        """`take`, or None once ``keep`` mappings are in use and none is idle: the caller
        then reads into a new bytes object. A RAM tier full of pieces (heap memory) has
        no room for buffers, and a block downloaded there goes to the heap the pieces it
        evicts free, as before buffers (into a new buffer, the heap kept their memory:
        tierfs's random reads, 346-362 against 337-344 MiB)."""
        return self._take(length, within=True)

    def _take(self, length: int, *, within: bool) -> memoryview | None:
        """`take` and `take_within` in one scan of the mappings, under one hold of the lock
        (downloads call it from their worker threads at once)."""
        if not 0 < length <= self.block_size:
            raise ValueError(f"a block buffer holds 1 to {self.block_size} bytes, not {length}")
        with self._lock:
            found = self._reusable()
            if found is not None:
                self.reused += 1
            elif within and len(self._maps) >= self.keep:
                self.refused += 1
                return None
            else:
                found = _BlockMap(-1, self.block_size, flags=mmap.MAP_PRIVATE)  # (shared: no THP)
                if hasattr(mmap, "MADV_HUGEPAGE"):
                    found.madvise(mmap.MADV_HUGEPAGE)
                self._maps.append(found)
                self.made += 1
            return memoryview(found)[:length]  # (made under the lock: held from here)

    def statistics(self) -> dict[str, int]:
        return {
            "mapped": len(self._maps),
            "made": self.made,
            "reused": self.reused,
            "unmapped": self.unmapped,
            "refused": self.refused,
        }

    def in_use(self) -> int:
        """How many mappings something holds a view of now (a tier, a reader, a download)."""
        with self._lock:
            return sum(
                1 for index in range(len(self._maps)) if _refs(self._maps, index) != self._idle
            )

    @property
    def keep(self) -> int:
        """How many mappings, in use or idle, the pool keeps at most (asked each time
        where ``keep`` is a function: the RAM tier's room changes)."""
        return self._keep() if callable(self._keep) else self._keep

    def trim(self) -> int:
        """Unmap idle mappings beyond ``keep``; how many are left in use or idle. Called
        when the RAM tier takes memory that is not a block buffer (a piece, a block read
        from a slower tier), which leaves less room for buffers: idle ones would
        otherwise stay mapped beside it until the next download."""
        with self._lock:
            self._reusable(answer=False)
            return len(self._maps)

    def _reusable(self, *, answer: bool = True) -> _BlockMap | None:
        """An idle mapping (the most recently made), after unmapping the oldest idle ones
        while more than ``keep`` are mapped (with ``answer``, one is kept to answer)."""
        maps, idle = self._maps, self._idle
        spare = [i for i in range(len(maps)) if _refs(maps, i) == idle]
        extra = min(len(spare) - int(answer), len(maps) - self.keep)
        for index in reversed(spare[: max(0, extra)]):
            maps.pop(index).close()
            self.unmapped += 1
        if not answer:
            return None
        for index in range(len(maps) - 1, -1, -1):
            if _refs(maps, index) == idle:
                return maps[index]
        return None


def pooled(data: object) -> bool:
    """Whether ``data`` is a view of a block buffer: kept as it is, not copied, by a tier
    that must own what it keeps (any other buffer may change under it)."""
    return isinstance(data, memoryview) and isinstance(data.obj, _BlockMap)


def address_aligned(data: memoryview, align: int) -> bool:
    """Whether ``data`` starts at a multiple of ``align`` in memory (False for read-only
    buffers such as ``bytes``, whose address cannot be asked for: theirs is not aligned
    anyway)."""
    try:
        start = ctypes.c_char.from_buffer(data)
    except (TypeError, ValueError):
        return False
    try:
        return ctypes.addressof(start) % align == 0
    finally:
        del start


def give_back_heap() -> bool:
    """Hand the malloc heap's free pages back to the kernel (glibc's ``malloc_trim(0)``;
    elsewhere nothing): for memory the RAM tier held outside block buffers (pieces, blocks
    read from slower tiers) and gave up for buffers, which the heap would keep otherwise.
    Whether it gave any back."""
    trim = _malloc_trim()
    return bool(trim is not None and trim(0))


def _malloc_trim() -> Any:
    global _TRIM
    if _TRIM is False:
        try:
            _TRIM = ctypes.CDLL(None).malloc_trim
            _TRIM.argtypes = [ctypes.c_size_t]
        except (OSError, AttributeError):
            _TRIM = None
    return _TRIM


_TRIM: Any = False  # glibc's malloc_trim, once looked up (None: there is none)
