"""Open files and directories: the ``fh`` numbers handed to the kernel.

A file handle holds its inode and, for reads of a clean object, its own
`BlockReader` (with its own sequential read-ahead); staged data belongs to the inode,
shared by every handle of it. A directory handle holds a snapshot of the
listing taken at the first readdir, so that offsets stay stable while the
kernel pages through it (entries added meanwhile may or may not show, none
is skipped or repeated: the FUSE readdir contract).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Generic, TypeVar

from tierfs.core.blockreader import BlockReader
from tierfs.core.inodes import Inode


@dataclass(eq=False)
class FileHandle:
    fh: int
    inode: Inode
    writable: bool
    direct_io: bool = False
    reader: BlockReader | None = None
    backing_id: int = 0  # FUSE passthrough: the kernel reads the cache file, not us
    # errno of a local write whose changes were dropped (`_abandon`): later writes through
    # this handle fail with it, rather than land on a fresh copy of the object as if the
    # dropped ones had never been made
    failed: int = 0


@dataclass(eq=False)
class DirHandle:
    fh: int
    inode: Inode
    entries: list[tuple[str, Inode]] | None = None
    prefill: bool = False  # the daemon's own read through the mount (`tierfs.core.prefill`)


H = TypeVar("H", FileHandle, DirHandle)


class HandleTable(Generic[H]):
    """Handle numbers to handles; numbers are never reused within a mount."""

    def __init__(self) -> None:
        self._numbers = itertools.count(1)
        self._handles: dict[int, H] = {}

    def next_number(self) -> int:
        return next(self._numbers)

    def add(self, handle: H) -> H:
        self._handles[handle.fh] = handle
        return handle

    def __getitem__(self, fh: int) -> H:
        return self._handles[fh]

    def get(self, fh: int) -> H | None:
        return self._handles.get(fh)

    def pop(self, fh: int) -> H | None:
        return self._handles.pop(fh, None)

    def values(self) -> list[H]:
        return list(self._handles.values())

    def __len__(self) -> int:
        return len(self._handles)
