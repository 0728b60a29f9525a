"""The inode table: inode numbers, what they stand for, and the kernel's lookup counts.

An inode is a directory (by path), a symlink or a file. A *clean* file
inode stands for one generation of one object: when another client writes a
new generation, the next lookup makes a new inode, so the kernel sees
"replaced" and never serves stale pages from its cache (gcsfuse does the
same; this is what makes ``keep_cache`` safe). A file being written keeps its
inode number across the uploads it causes.

Lookup counts follow the FUSE contract: every reply that hands the kernel an
inode (lookup, create, mkdir, symlink, readdir entries) adds one; ``forget``
subtracts. An inode is dropped when the kernel has forgotten it and nothing
local (an open handle, staged data) still needs it.

Invariants:
* ``by_path`` maps a live path to its current inode; an inode absent from it
  is either replaced (an older generation still held by the kernel) or unlinked.
* the root (ino 1) is never dropped.

This module is synchronous and does no I/O: between two trio checkpoints its
state changes atomically. Each inode carries the lock that serializes the slow
(awaited) work on it: staging, uploading, renaming.
"""

from __future__ import annotations

import enum
import itertools
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import trio

if TYPE_CHECKING:
    from tierfs.core.filerename import FileMove
    from tierfs.core.streaming import Stream
    from tierfs.core.writer import Staged

ROOT_INO = 1


class Kind(enum.Enum):
    FILE = "file"
    DIR = "dir"
    SYMLINK = "symlink"


@dataclass(eq=False)
class Inode:
    """One inode. ``path`` is relative to the mount root, without a trailing '/'."""

    ino: int
    kind: Kind
    path: str
    size: int = 0
    generation: int = 0  # 0: not (yet) in GCS
    metageneration: int = 0
    mtime_ns: int = 0
    target: str = ""  # symlinks
    lookups: int = 0
    open_handles: int = 0
    unlinked: bool = False
    staged: Staged | None = None
    stream: Stream | None = None  # a streaming upload of the staged file, while in order
    placeholder: bool = False  # directories: a 'dir/' object exists
    crc32c: str | None = None  # of the generation, as GCS reports it
    metadata: dict[str, str] = field(default_factory=dict)
    # A file whose directory was renamed while its object is still under the old name (a
    # background move, tierfs.core.dirmove): the object it reads until the move is done.
    remote: str | None = None
    # A file renamed while in GCS, whose object is still under its old name (``remote``):
    # the background move (tierfs.core.filerename). It keeps the inode in the table.
    file_move: FileMove | None = field(default=None, repr=False)
    _lock: trio.Lock | None = field(default=None, init=False, repr=False)
    # The FUSE layer's last reply for this inode (its Attr and the kernel struct built from
    # it), reused while the Attr is equal: readdir of a big directory sends every entry.
    kernel_entry: tuple[object, object] | None = field(default=None, repr=False)

    @property
    def lock(self) -> trio.Lock:
        """Held across a change that awaits (rename, its background move). Made at first
        use: a cold stat storm makes an inode per name, and a trio.Lock each was ~2 of
        the ~29 us a cold lookup took in the daemon (in-process, 10,000 names)."""
        if self._lock is None:
            self._lock = trio.Lock()
        return self._lock

    @property
    def name(self) -> str:
        return self.path.rsplit("/", 1)[-1]

    @property
    def parent_path(self) -> str:
        return self.path.rsplit("/", 1)[0] if "/" in self.path else ""

    @property
    def local_only(self) -> bool:
        """Created here and not uploaded yet: GCS does not know it (a file, or a directory
        whose placeholder is still a write-back journal record)."""
        return (
            self.generation == 0
            and not self.unlinked
            and (self.kind is Kind.FILE or (self.kind is Kind.DIR and self.staged is not None))
        )

    @property
    def busy(self) -> bool:
        return (
            self.lookups > 0
            or self.open_handles > 0
            or self.staged is not None
            or self.file_move is not None
        )


class InodeTable:
    """All inodes the kernel may still name, and the current one for each path."""

    def __init__(self, root_mtime_ns: int = 0) -> None:
        self._numbers = itertools.count(ROOT_INO + 1)
        root = Inode(ROOT_INO, Kind.DIR, "", mtime_ns=root_mtime_ns, lookups=1)
        self.by_ino: dict[int, Inode] = {ROOT_INO: root}
        self.by_path: dict[str, Inode] = {"": root}
        # by_path again, grouped by parent directory, so a listing finds its local
        # children without scanning every inode (``ls -lR`` of a big tree is O(n), not O(n^2)).
        self._by_parent: dict[str, dict[str, Inode]] = {}

    def __getitem__(self, ino: int) -> Inode:
        return self.by_ino[ino]

    def get(self, ino: int) -> Inode | None:
        return self.by_ino.get(ino)

    def current(self, path: str) -> Inode | None:
        return self.by_path.get(path)

    def make(self, kind: Kind, path: str, **attrs: object) -> Inode:
        """A new inode for ``path``, replacing whatever inode held it."""
        inode = Inode(next(self._numbers), kind, path, **attrs)  # type: ignore[arg-type]
        self.by_ino[inode.ino] = inode
        old = self.by_path.get(path)
        self._set(path, inode)
        if old is not None:
            self._maybe_drop(old)
        return inode

    def detach(self, inode: Inode) -> None:
        """``inode`` no longer stands for its path (unlinked, rmdir'd or replaced)."""
        if self.by_path.get(inode.path) is inode:
            self._unset(inode.path)
        self._maybe_drop(inode)

    def restore(self, inode: Inode) -> None:
        """Make ``inode`` its path's current inode again, if the path has none: one let go
        of because nothing held it, which a listing under way still has to show."""
        if inode.path not in self.by_path:
            self.by_ino[inode.ino] = inode
            self._set(inode.path, inode)

    def move(self, inode: Inode, new_path: str) -> None:
        """Rename: ``inode`` (and, for a directory, every inode below it) gets a new path."""
        old_path = inode.path
        moved = [inode]
        if inode.kind is Kind.DIR:
            prefix = old_path + "/" if old_path else ""
            moved += [i for p, i in self.by_path.items() if prefix and p.startswith(prefix)]
        for item in moved:
            if self.by_path.get(item.path) is item:
                self._unset(item.path)
        for item in moved:
            item.path = new_path + item.path[len(old_path) :]
            displaced = self.by_path.get(item.path)
            self._set(item.path, item)
            if displaced is not None and displaced is not item:
                self._maybe_drop(displaced)

    def remember(self, inode: Inode, count: int = 1) -> None:
        inode.lookups += count

    def forget(self, ino: int, count: int) -> None:
        inode = self.by_ino.get(ino)
        if inode is None or ino == ROOT_INO:
            return
        inode.lookups = max(0, inode.lookups - count)
        self._maybe_drop(inode)

    def release(self, inode: Inode) -> None:
        """Called when an inode's last open handle or staged data goes away."""
        self._maybe_drop(inode)

    def children(self, dir_path: str) -> list[Inode]:
        """Current inodes directly below ``dir_path``."""
        return list(self._by_parent.get(dir_path, {}).values())

    def below(self, dir_path: str) -> list[Inode]:
        prefix = dir_path + "/" if dir_path else ""
        return [i for p, i in self.by_path.items() if p and p.startswith(prefix)]

    def _maybe_drop(self, inode: Inode) -> None:
        if inode.ino == ROOT_INO or inode.busy:
            return
        if self.by_path.get(inode.path) is inode:
            # Still the current inode of its path: keep it only while it holds local state.
            if inode.local_only:
                return
            self._unset(inode.path)
        self.by_ino.pop(inode.ino, None)

    def _set(self, path: str, inode: Inode) -> None:
        self.by_path[path] = inode
        if path:
            parent, _, name = path.rpartition("/")
            self._by_parent.setdefault(parent, {})[name] = inode

    def _unset(self, path: str) -> None:
        del self.by_path[path]
        parent, _, name = path.rpartition("/")
        siblings = self._by_parent.get(parent)
        if siblings is not None:
            siblings.pop(name, None)
            if not siblings:
                del self._by_parent[parent]

    def __len__(self) -> int:
        return len(self.by_ino)
