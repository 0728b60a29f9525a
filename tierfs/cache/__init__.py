"""Data tiers: the caches between the kernel's page cache and GCS.

Every tier stores fixed-size *blocks* of object data under a `BlockKey`
(object name, generation, block index). The generation is part of the key,
so a new generation is simply a new key and nothing is ever invalidated: old
blocks age out (DESIGN decision 2). All blocks of one chain have the same
size (``ram-cache:block-size-mb``); the last block of an object is shorter.

The chain is RAM (`ram.RamTier`), then SSD (`ssd.SsdTier`), then, on a directory
several nodes share, `shared.SharedTier`; the reader asks
them in order, copies a hit up to the faster tiers, and fetches a miss from
GCS itself: tiers never call GCS. A tier that fails is logged and counted as
a miss, never an error to the user.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from tierfs.cache.ssd import Passthrough


# Keys hash once, when made: the RAM tier hashes a key about 15 times to keep a piece
# and evict another (its cache, recency order and by-name index), and the generated
# ``__hash__`` built a tuple each time: 0.30 of 1.19 s keeping 51,200 pieces (cProfile),
# about a fifth of the bookkeeping of a random 1 MiB read that fetched 64 pieces.


@dataclass(frozen=True, order=True, slots=True)
class BlockKey:
    """One block of one generation of one object."""

    name: str
    generation: int
    index: int
    _hash: int = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_hash", hash((self.name, self.generation, self.index)))

    def __hash__(self) -> int:
        return self._hash


@dataclass(frozen=True, order=True, slots=True)
class PieceKey:
    """A piece of one generation of one object, at ``offset`` (a multiple of the piece
    size): what a random read fetched, kept so that the next touch of that region needs
    no GCS request. Only a tier that keeps pieces (RAM) holds them."""

    name: str
    generation: int
    offset: int
    _hash: int = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_hash", hash((self.name, self.generation, self.offset)))

    def __hash__(self) -> int:
        return self._hash


Data = bytes | memoryview
"""A block's bytes: a bytes object, or a view of a block buffer (`tierfs.cache.buffers`),
which no one writes into."""


class Tier(Protocol):
    """One cache level. Safe to call from many trio tasks.

    A *persistent* tier (the SSD tier) also keeps whole objects across remounts: it
    takes the copy of a just-uploaded file, seals a complete object, and may hand a
    sealed object's file to the kernel (FUSE passthrough). A tier that does not
    answers those with False / None, so callers never ask a tier what it is."""

    name: str
    persistent: bool

    async def get(self, key: BlockKey) -> Data | None:
        """The block's bytes, or None on a miss (also when the stored copy is damaged)."""
        ...

    def holds(self, key: BlockKey) -> bool:
        """Whether the tier has the block, from its index alone (no I/O, no recency change):
        a whole-object fill skips what is already cached instead of reading it."""
        ...

    async def put(self, key: BlockKey, data: Data) -> None:
        """Store one block (may evict others; never raises for lack of space)."""
        ...

    async def discard(self, name: str, generation: int | None = None) -> None:
        """Drop the blocks (and pieces) of an object (one generation, or all)."""
        ...

    async def read_part(self, key: BlockKey, offset: int, length: int) -> Data | None:
        """``length`` bytes at ``offset`` within a block the tier holds, without reading
        the whole block, for a random read; None: ask `get` (a block the tier cannot
        vouch for without checking it whole, or none)."""
        ...

    def read_part_now(self, key: BlockKey, offset: int, length: int) -> Data | None:
        """`read_part`'s answer when the tier can give it without waiting (memory); None
        otherwise: then the caller awaits `read_part`."""
        ...

    def get_piece(self, key: PieceKey) -> bytes | None:
        """A piece a random read fetched, or None (a tier that keeps no pieces: always)."""
        ...

    def put_piece(self, key: PieceKey, data: bytes) -> None:
        """Keep a piece (a tier that keeps no pieces ignores it)."""
        ...

    async def seal(self, name: str, generation: int, size: int) -> bool:
        """Mark a whole object complete (a persistent tier); whether it is sealed now."""
        ...

    async def passthrough(self, name: str, generation: int, size: int) -> Passthrough | None:
        """A pinned file of a sealed whole object the kernel may read directly, or None."""
        ...

    def takes_files_from(self, directory: Path) -> bool:
        """Whether `adopt` can take files from ``directory`` (same file system) rather
        than have them copied in; False for a tier that keeps no whole objects."""
        ...

    async def adopt(self, source: Path, name: str, generation: int, size: int) -> bool:
        """Take the local file ``source`` (exactly that object generation's bytes) as the
        object, renamed into the tier, not copied: whether it did (else ``source`` may
        still be there, the caller's to delete)."""
        ...

    async def fetching(self, key: BlockKey) -> bytes | None:
        """A block download from GCS is about to start: a tier other nodes share may claim
        it (so they wait instead of fetching it too), or wait for another node's claim and
        answer the block. None: go ahead, and call `fetched` after (stored or not)."""
        ...

    async def fetched(self, key: BlockKey) -> None:
        """The download `fetching` let go ahead is over; drop its claim."""
        ...

    def unpin(self, pinned: Passthrough) -> None:
        """Release what `passthrough` pinned (a no-op for a tier that pins nothing)."""
        ...

    def statistics(self) -> dict[str, int]:
        """``hits``, ``misses``, ``bytes_read``, ``bytes_written``, ``evictions``,
        ``used_bytes``, ``capacity_bytes``, ``errors``..."""
        ...
