"""The filesystem core: POSIX operations on inodes, over one `Bucket`.

Everything a FUSE handler does, minus FUSE: `operations.py` translates the
kernel's requests into calls here and the results back. Tests drive this
class directly over `MemoryBucket` (model tests) and through a real mount.

Semantics are gcsfuse's (``docs/semantics.md`` lists them with the tests that
check them): close-to-open consistency; writes staged locally and uploaded on
flush/fsync/close with a generation precondition (a lost race is ESTALE) or,
with ``write:write-back``, committed to a local journal on close and uploaded
in the background (`tierfs.core.writeback`; fsync and ``tierfs sync`` still wait);
placeholder and implicit directories; directory rename by copy + delete up to
``rename-dir-limit`` objects (EMFILE beyond; with write-back, unbounded and
journaled: `tierfs.core.dirmove`).

Concurrency: trio runs handlers as tasks on one thread. The inode table and
handle tables are changed only between checkpoints; a per-inode lock
serializes the slow, awaited parts that must not interleave (staging,
uploading, renaming one inode).
"""

from __future__ import annotations

import contextlib
import logging
import os
import stat
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

import trio
from cachetools import LRUCache

from tierfs.core.attributes import Attributes
from tierfs.core.background import Background
from tierfs.core.blockreader import BlockReader
from tierfs.core.blocks import Blocks
from tierfs.core.deletes import PendingDeletes
from tierfs.core.directories import Directories
from tierfs.core.dirmove import PendingMoves
from tierfs.core.entries import Entries
from tierfs.core.filerename import FileRenames
from tierfs.core.handles import DirHandle, FileHandle, HandleTable
from tierfs.core.inodes import ROOT_INO, Inode, InodeTable, Kind
from tierfs.core.kernel import Kernel, NoKernel
from tierfs.core.lifecycle import Lifecycle
from tierfs.core.listahead import ListedAhead, Walks
from tierfs.core.lookups import ListingUnderWay, Lookups
from tierfs.core.metacache import MetadataCache
from tierfs.core.namespace import (
    DirListing,
    Namespace,
    check_new_name,
)
from tierfs.core.owned import OwnedDirs
from tierfs.core.passthrough import Backings
from tierfs.core.prefill import DirPrefill
from tierfs.core.renames import Renames
from tierfs.core.slots import Slots
from tierfs.core.uploader import Uploader
from tierfs.core.uploads import LARGE_UPLOADS, CacheCopies, Uploads
from tierfs.core.writeback import Journal
from tierfs.core.writepath import WritePath
from tierfs.errors import (
    IsADirectory,
    NotADirectory,
    NotFound,
    PreconditionFailed,
    ReadOnly,
    root_cause,
)
from tierfs.storage import Bucket, ObjectInfo

log = logging.getLogger("tierfs.fs")
NEVER_S = 10.0 * 365 * 24 * 3600  # "-1 = never expires" as a kernel timeout


@dataclass(frozen=True)
class Settings:
    """What the core needs from the configuration, with units in the names."""

    file_mode: int = 0o644
    dir_mode: int = 0o755
    uid: int = 0
    gid: int = 0
    attr_timeout_s: float = 60.0
    entry_timeout_s: float = 0.0
    temp_dir: str = ""
    rename_dir_limit: int = 0
    implicit_dirs: bool = False
    only_dir: str = ""
    read_only: bool = False
    standard_symlinks: bool = True
    create_empty_file: bool = False
    metadata_ttl_s: float = 60.0
    negative_ttl_s: float = 5.0
    stat_cache_max_bytes: float = 34 << 20
    type_cache_max_bytes: float = 4 << 20
    list_ttl_s: float = 0.0
    read_ahead_bytes: int = 32 << 20  # sequential prefetch depth (bounded by the RAM tier)
    metadata_prefetch: bool = True  # list a directory in the background on its first lookup
    metadata_prefetch_workers: int = 10
    metadata_prefetch_entries: int = 5000
    file_cache: bool = False  # whole objects into the SSD tier on first read
    cache_for_range_read: bool = False
    passthrough: bool = True  # the kernel may read sealed SSD-tier files directly
    write_back_delay_s: float = 0.0  # with write-back: how long a closed file waits to upload
    fsync_to_gcs: bool = False  # with write-back: fsync waits for GCS, not only the local tier
    write_passthrough: bool = True  # with write-back: the kernel writes new files directly
    max_streams: float = 0  # new files uploaded while written (streaming writes) at a time
    stream_chunk_bytes: int = 32 << 20
    slow_request_s: float = 30.0  # a request waiting this long is logged (tierfs.fuse.watchdog)
    ignore_interrupts: bool = True  # gcsfuse's: a signal does not cancel (a death does)
    consistent_open: bool = False  # strong-consistency-on-open: each open asks GCS first
    direct_io: bool = False  # experimental-o-direct: no page cache for any file's data


_SYMLINK_MODE = stat.S_IFLNK | 0o777
LISTED_DIRS = 1024


class Attr(NamedTuple):
    """The attributes of one inode, as the kernel sees them. (A NamedTuple: readdir builds
    one per entry, and a frozen dataclass's __init__ cost 9 % of a warm ``ls -lR``.)"""

    ino: int
    mode: int
    nlink: int
    uid: int
    gid: int
    size: int
    mtime_ns: int
    blocks: int
    entry_timeout_s: float
    attr_timeout_s: float


@dataclass(frozen=True)
class StatFs:
    block_size: int = 1 << 17
    blocks: int = 1 << 33
    free_blocks: int = 1 << 33
    files: int = 1 << 50
    free_files: int = 1 << 50
    name_max: int = 255


class Filesystem(
    Lookups,
    Attributes,
    Entries,
    Lifecycle,
    Directories,
    WritePath,
    Uploads,
    Renames,
    FileRenames,
):
    """POSIX operations over a bucket; the state of one mount. Its directories, its
    write path and its renames are in mixins of their own modules (`tierfs.core.directories`,
    `tierfs.core.writepath`, `tierfs.core.renames`); this one holds the state, lookups, attributes,
    open/read/write, unlink and symlinks, statistics and shutdown."""

    def __init__(
        self,
        bucket: Bucket,
        settings: Settings,
        *,
        clock_ns: Callable[[], int] = time.time_ns,
        monotonic_s: Callable[[], float] = time.monotonic,
        blocks: Blocks | None = None,
        background: Background | None = None,
        kernel: Kernel | None = None,
        journal: Journal | None = None,
    ) -> None:
        # Collaborators from the composition root (tierfs/mount.py): where background tasks
        # run once the mount's nursery exists, and what the core asks of the kernel (names
        # to forget, backing files for passthrough). Tests leave them out.
        self.background = background or Background()
        self.kernel = kernel or NoKernel()
        self.bucket = bucket
        self.journal = journal  # write-back on: close() commits here, uploads run later
        # Files open for writing: a save in progress, which uploads yield to. (With
        # passthrough its writes never reach the daemon, so request times cannot say.)
        self._writers = 0
        self.uploads = Uploader(
            self._upload_in_background, self._committed_again, writing=lambda: self._writers > 0
        )
        self._large_uploads = trio.CapacityLimiter(LARGE_UPLOADS)
        self.pending_moves = PendingMoves()  # directory renames moving objects in the background
        # With write-back: unlinks whose GCS delete runs in the background (`tierfs.core.deletes`).
        self.pending_deletes = PendingDeletes()
        self.deletes = Uploader(
            self._delete_in_background, lambda delete: False, writing=lambda: self._writers > 0
        )
        self.delete_errors = 0
        self._delete_count = 0
        # Implied directories this mount emptied (`_removed`): kept for their rmdir.
        self._emptied: LRUCache[str, float] = LRUCache(maxsize=4096)  # path -> until
        self._remote_readers: dict[str, Inode] = {}  # old object name -> inode reading it
        self._streams = 0
        self._spares_coming: bool = False  # a thread is making spare journal files
        self._failed: dict[int, str] = {}  # ino -> last upload error, until it succeeds
        self.writeback_counts = {
            "committed": 0,
            "uploaded": 0,
            "failed": 0,
            "conflicts": 0,
            "move_errors": 0,  # failed attempts of background directory renames
        }
        self.owned = OwnedDirs()  # with write-back: directories made here, answered locally
        self.staging_errors = 0  # local files for writes that could not be made
        self.write_requests = 0  # WRITEs the daemon served (none for passthrough files)
        self.flushes_held = 0  # FLUSHes that were not a last close, so uploaded nothing
        self.settings = settings
        self._file_mode = stat.S_IFREG | settings.file_mode
        self._dir_mode = stat.S_IFDIR | settings.dir_mode
        self.clock_ns = clock_ns
        self.blocks = blocks or Blocks(
            bucket, [], block_size=8 << 20, downloads=trio.CapacityLimiter(16)
        )
        self.blocks.spawner = lambda: self.background.spawner()  # (tests attach theirs later)
        self._copies = CacheCopies()  # uploads kept in the SSD tier, in the background
        self._monotonic_s = monotonic_s
        self._prefetched_dirs: dict[str, float] = {}
        self._listing_in_flight: dict[str, ListingUnderWay] = {}  # lookups wait for it
        self._ahead = ListedAhead(settings.metadata_ttl_s)  # answers for a walker's readdirs
        self._walks = Walks()  # which to list ahead of a warm walker
        keeps_names = settings.entry_timeout_s > 0  # (the kernel caches names it learns)
        self.prefill = DirPrefill(self.kernel, self.background, keeps_names)
        self._prefetch_slots = Slots(settings.metadata_prefetch_workers)  # (lookups urge theirs)
        self.metadata = MetadataCache(
            ttl_s=settings.metadata_ttl_s,
            negative_ttl_s=settings.negative_ttl_s,
            max_bytes=settings.stat_cache_max_bytes,
            type_max_bytes=settings.type_cache_max_bytes,
            clock=monotonic_s,
        )
        self.names = Namespace(
            bucket,
            only_dir=settings.only_dir,
            implicit_dirs=settings.implicit_dirs,
            cache=self.metadata,
            list_ttl_s=settings.list_ttl_s,
            clock=monotonic_s,
        )
        self.inodes = InodeTable(root_mtime_ns=clock_ns())
        self.files: HandleTable[FileHandle] = HandleTable()
        self.dirs: HandleTable[DirHandle] = HandleTable()
        self.dir_counts = {"opens": 0, "kept": 0, "listings_served": 0}
        # FUSE passthrough, where the kernel agreed to it at INIT (``kernel.passthrough``).
        self.backings = Backings(self.blocks, self.kernel)
        # Per directory, the entries last built from a kept listing (see _reuse_listed), and
        # so the listing the kernel was last given (see kernel_may_keep_listing).
        self._listed: LRUCache[str, tuple[DirListing, list[tuple[str, Inode]], list[str]]] = (
            LRUCache(maxsize=LISTED_DIRS)
        )

    # -- attributes -----------------------------------------------------------------------

    def attr(self, inode: Inode) -> Attr:
        # Called for every entry of every readdir: positional fields, modes precomputed.
        s = self.settings
        staged = inode.staged
        if staged is not None and staged.direct:
            self._observe(inode)
        size = inode.size if staged is None else staged.size
        kind = inode.kind
        if kind is Kind.FILE:
            mode, nlink, entry_s = self._file_mode, 1, s.entry_timeout_s
        elif kind is Kind.DIR:
            # 1, as gcsfuse's: "subdirectories not counted". 2 told find (whose leaf
            # optimisation trusts nlink - 2 subdirectories) that none was below.
            mode, nlink = self._dir_mode, 1
            entry_s = s.entry_timeout_s if self._confirmed(inode) else 0.0
        else:
            mode, nlink, entry_s = _SYMLINK_MODE, 1, s.entry_timeout_s
        if inode.unlinked:
            nlink = 0
        return Attr(
            inode.ino,
            mode,
            nlink,
            s.uid,
            s.gid,
            size,
            inode.mtime_ns,
            (size + 511) // 512,
            entry_s,
            s.attr_timeout_s,
        )

    def _confirmed(self, inode: Inode) -> bool:
        """A listed prefix is a directory only with a placeholder or implicit-dirs: until a
        lookup confirms it, the kernel must not keep the name (it would skip that lookup)."""
        return (
            inode.kind is not Kind.DIR
            or inode.placeholder
            or self.settings.implicit_dirs
            or inode.ino == ROOT_INO
        )

    def getattr(self, ino: int) -> Attr:
        return self.attr(self._inode(ino))

    def statfs(self) -> StatFs:
        return StatFs()

    # -- lookup and lookup counts ------------------------------------------------------------

    async def open(self, ino: int, flags: int) -> FileHandle:
        inode = self._inode(ino)
        if inode.kind is Kind.DIR:
            raise IsADirectory(inode.path)
        if self.inodes.current(inode.path) is not inode:
            # The kernel's name still leads to a generation we have since replaced (another
            # writer won, or a newer lookup): ESTALE makes it look the name up again, once.
            raise PreconditionFailed(inode.path)
        writable = (flags & os.O_ACCMODE) != os.O_RDONLY
        if writable:
            self._writable()
        if self.settings.consistent_open:
            await self._still_current(inode)
        eligible = (
            self.settings.passthrough
            and not self.settings.direct_io
            and not writable
            and not flags & os.O_TRUNC
            and inode.staged is None
            and inode.generation != 0
        )
        if writable:
            await self._settle(inode.path)
            await self._after_upload(inode)
        object_name = self._read_object(inode)
        backing_id = await self.backings.open(inode, object_name, eligible=eligible)
        handle = self._open_handle(inode, writable=writable, flags=flags)
        handle.backing_id = backing_id
        try:
            if writable and flags & os.O_TRUNC:
                await self._truncate(inode, 0)
        except BaseException:
            self._close_handle(handle)
            raise
        return handle

    async def _still_current(self, inode: Inode) -> None:
        """``strong-consistency-on-open``, as gcsfuse's: an open asks GCS for the object's
        generation, past every cache; another client's since (or none) is ESTALE, and the
        kernel looks the name up again, once, and opens what is there now. (A file written
        here and not uploaded yet, or moving under a background rename, is this mount's.)"""
        if not inode.generation or inode.staged is not None or inode.remote is not None:
            return
        try:
            info = await self.bucket.stat(self.names.file_object(inode.path))
        except NotFound:
            info = None
        if info is None or info.generation != inode.generation:
            self.names.forget(inode.path)
            raise PreconditionFailed(inode.path)

    def _open_handle(self, inode: Inode, *, writable: bool, flags: int) -> FileHandle:
        direct = bool(flags & getattr(os, "O_DIRECT", 0)) or self.settings.direct_io
        handle = FileHandle(self.files.next_number(), inode, writable, direct_io=direct)
        inode.open_handles += 1
        self._writers += writable
        return self.files.add(handle)

    def read_now(self, fh: int, offset: int, length: int) -> bytes | memoryview | None:
        """`read`'s answer when it needs no wait (`BlockReader.read_now`); None: await `read`."""
        handle = self.files.get(fh)
        if handle is None or handle.reader is None:
            return None
        inode = handle.inode
        if inode.staged is not None or handle.reader.generation != inode.generation:
            return None
        return handle.reader.read_now(offset, length)

    async def read(self, fh: int, offset: int, length: int) -> bytes | memoryview:
        handle = self.files[fh]
        inode = handle.inode
        for _ in range(2):  # twice: a background rename may move the object meanwhile
            if inode.staged is not None:
                return inode.staged.pread(offset, length)
            if inode.generation == 0:
                return b""
            if handle.reader is None or handle.reader.generation != inode.generation:
                if handle.reader is not None:
                    handle.reader.close()
                handle.reader = BlockReader(
                    self.blocks,
                    self._read_object(inode),
                    inode.generation,
                    inode.size,
                    spawn=self.background.spawner(),
                    max_ahead_bytes=self.settings.read_ahead_bytes,
                    fill=self.settings.file_cache,
                    fill_on_range_read=self.settings.cache_for_range_read,
                    crc32c=inode.crc32c,
                )
            reader = handle.reader
            try:
                return await reader.read(offset, length)
            except Exception as err:  # a read of several blocks fails as an exception group
                if not isinstance(root_cause(err), NotFound):
                    raise
                if inode.remote is not None:  # moved before this inode knew: ask the new name
                    with contextlib.suppress(NotFound):
                        found = await self.bucket.stat(self.names.file_object(inode.path))
                        if _same_bytes(found, inode):  # (not another client's object)
                            self._moved_to(inode, found)
                if reader.generation == inode.generation:
                    break  # not moved: the generation this inode stands for is gone
        # Changed or deleted elsewhere.
        raise PreconditionFailed(inode.path)

    async def write(self, fh: int, offset: int, data: bytes) -> int:
        self.write_requests += 1
        handle = self.files[fh]
        self._check_writes(handle)
        inode = handle.inode
        if inode.lock.locked():  # another handle's close uploads it: that ends first
            await self._after_upload(inode)
        if inode.staged is None:
            await self._stage(inode, inode.size)
        assert inode.staged is not None
        written = inode.staged.pwrite(offset, data)
        inode.mtime_ns = self.clock_ns()
        if inode.stream is not None and not await inode.stream.write(offset, data[:written]):
            self._end_stream(inode)  # out of order: a staged write from here on
        return written

    # -- streaming writes ----------------------------------------------------------------------

    # -- write-back --------------------------------------------------------------------------

    # -- attributes that change ----------------------------------------------------------------

    def _removed(self, path: str, *, below: bool = True, is_dir: bool = False) -> None:
        """``path`` is gone: forget it, and the directories that existed only through it.

        Implied directories (no placeholder) may vanish with their last object; the
        kernel would keep their names for the TTL, so they are dropped there too."""
        self.names.removed(path, below=below, is_dir=is_dir)
        parent = self.inodes.current(path.rsplit("/", 1)[0] if "/" in path else "")
        while parent is not None and parent.ino != ROOT_INO and not parent.placeholder:
            grand = self.inodes.current(parent.parent_path)
            if grand is None:
                break
            self.kernel.forget(grand.ino, parent.name)
            self._emptied[parent.path] = self._monotonic_s() + self.settings.metadata_ttl_s
            parent = grand

    def _new_path(self, parent_ino: int, name: str) -> str:
        """The path a create-like operation will make (writable mount, a name GCS accepts)."""
        self._writable()
        check_new_name(name)
        return self.names.child_path(self._dir(parent_ino).path, name)

    async def _existing(self, parent_ino: int, name: str) -> tuple[str, Inode]:
        """The path and inode a remove-like operation acts on (ENOENT if there is none)."""
        self._writable()
        path = self.names.child_path(self._dir(parent_ino).path, name)
        inode = await self._resolve(path)
        if inode is None:
            raise NotFound(path)
        return path, inode

    def _inode(self, ino: int) -> Inode:
        inode = self.inodes.get(ino)
        if inode is None:
            raise NotFound(f"inode {ino}")
        return inode

    def _dir(self, ino: int) -> Inode:
        inode = self._inode(ino)
        if inode.kind is not Kind.DIR:
            raise NotADirectory(inode.path)
        return inode

    def _writable(self) -> None:
        if self.settings.read_only:
            raise ReadOnly("mounted read-only")

    @staticmethod
    def _lock(inode: Inode) -> trio.Lock:
        return inode.lock


def _same_bytes(found: ObjectInfo, inode: Inode) -> bool:
    """Whether ``found`` (a copy made by a rename) holds what ``inode`` stands for: its size,
    and its CRC32C where both are known."""
    if found.size != inode.size:
        return False
    return not (found.crc32c and inode.crc32c) or found.crc32c == inode.crc32c
