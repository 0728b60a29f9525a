"""The last block each open file keeps, bounded across files.

A `tierfs.core.blockreader.BlockReader` keeps the block it used last: the kernel's reads
(128 KiB to 1 MiB) fall within one block many times in a row, and each then needs no
look-up. But a file opened and left open after one read (a data loader reads each shard's
header and keeps the files open) kept its block for as long as it stayed open, outside
the RAM tier's budget once the tier had evicted it: 64 such files held 56 MiB beyond an
8 MiB tier (1 MiB blocks); at the defaults, 8 MiB a file. So at most `LAST_KEPT` readers
keep theirs; the one that used its block longest ago lets go of it, and its next read
asks the tiers again.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Protocol

LAST_KEPT = 8  # open files keeping their last block (at 8 MiB blocks: 64 MiB at most)


class KeepsLast(Protocol):
    def let_go_of_last(self) -> None:
        """Drop the block kept (the next read asks the tiers)."""


class KeptLast:
    """Which readers keep a last block, least recently used first."""

    def __init__(self, most: int = LAST_KEPT) -> None:
        self._most = most
        self._readers: OrderedDict[int, KeepsLast] = OrderedDict()

    def __len__(self) -> int:
        return len(self._readers)

    def keeps(self, reader: KeepsLast) -> None:
        """``reader`` keeps a (new) last block: the longest unused beyond `LAST_KEPT` let go."""
        key = id(reader)
        self._readers[key] = reader
        self._readers.move_to_end(key)
        while len(self._readers) > self._most:
            _, oldest = self._readers.popitem(last=False)
            oldest.let_go_of_last()

    def gone(self, reader: KeepsLast) -> None:
        """``reader`` keeps nothing now (closed)."""
        self._readers.pop(id(reader), None)
