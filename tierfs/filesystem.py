"""The filesystem core: POSIX operations on inodes, over one `Bucket`.

Everything a FUSE handler does, minus FUSE: `operations.py` translates the
kernel's requests into calls here and the results back. Tests drive this
class directly over `MemoryBucket` (model tests) and through a real mount.

Semantics are gcsfuse's (``docs/semantics.md`` lists them with the tests that
check them): close-to-open consistency; writes staged locally and uploaded on
flush/fsync/close with a generation precondition (a lost race is ESTALE) or,
with ``write:write-back``, committed to a local journal on close and uploaded
in the background (`tierfs.writeback`; fsync and ``tierfs sync`` still wait);
placeholder and implicit directories; directory rename by copy + delete up to
``rename-dir-limit`` objects (EMFILE beyond; with write-back, unbounded and
journaled: `tierfs.dirmove`).

Concurrency: trio runs handlers as tasks on one thread. The inode table and
handle tables are changed only between checkpoints; a per-inode lock
serializes the slow, awaited parts that must not interleave (staging,
uploading, renaming one inode).
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import stat
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

import trio
from cachetools import LRUCache

from tierfs.blocks import BlockReader, Blocks, Spawn
from tierfs.deletes import Delete, PendingDeletes, delete_one
from tierfs.directories import Directories
from tierfs.dirmove import PendingMoves
from tierfs.errors import (
    AlreadyExists,
    IsADirectory,
    NotADirectory,
    NotFound,
    PreconditionFailed,
    ReadOnly,
    Unsupported,
    root_cause,
)
from tierfs.handles import DirHandle, FileHandle, HandleTable
from tierfs.inodes import ROOT_INO, Inode, InodeTable, Kind
from tierfs.interrupts import Interrupts
from tierfs.metacache import MetadataCache
from tierfs.namespace import (
    SYMLINK_FLAG_KEY,
    SYMLINK_TARGET_KEY,
    DirListing,
    Found,
    Namespace,
    check_new_name,
    is_symlink,
)
from tierfs.owned import OwnedDirs
from tierfs.passthrough import Backings
from tierfs.renames import Renames
from tierfs.storage import Bucket, ObjectInfo
from tierfs.uploader import Uploader
from tierfs.watchdog import InFlight
from tierfs.writeback import Journal
from tierfs.writepath import LARGE_UPLOAD_BYTES, LARGE_UPLOADS, WritePath
from tierfs.writer import MTIME_KEY, Staged, format_mtime, parse_mtime

log = logging.getLogger("tierfs.fs")
NEVER_S = 10.0 * 365 * 24 * 3600  # "-1 = never expires" as a kernel timeout
MOVES_AT_UNMOUNT_S = 300.0  # unmount waits this long for background renames (journaled)
SYNC_UPLOADS = 16  # uploads at a time for `tierfs sync`, unmount and SIGTERM


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
    slow_request_s: float = 30.0  # a request waiting this long is logged (tierfs.watchdog)
    ignore_interrupts: bool = True  # gcsfuse's: a signal does not cancel (a death does)


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


class Filesystem(Directories, WritePath, Renames):
    """POSIX operations over a bucket; the state of one mount. Its directories, its
    write path and its renames are in mixins of their own modules (`tierfs.directories`,
    `tierfs.writepath`, `tierfs.renames`); this one holds the state, lookups, attributes,
    open/read/write, unlink and symlinks, statistics and shutdown."""

    def __init__(
        self,
        bucket: Bucket,
        settings: Settings,
        *,
        clock_ns: Callable[[], int] = time.time_ns,
        monotonic_s: Callable[[], float] = time.monotonic,
        blocks: Blocks | None = None,
        spawn: Spawn | None = None,
        journal: Journal | None = None,
    ) -> None:
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
        # With write-back: unlinks whose GCS delete runs in the background (`tierfs.deletes`).
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
        self.background_errors = 0  # background tasks that failed unexpectedly (see spawner)
        self.write_requests = 0  # WRITEs the daemon served (none for passthrough files)
        self.flushes_held = 0  # FLUSHes that were not a last close, so uploaded nothing
        self.settings = settings
        self._file_mode = stat.S_IFREG | settings.file_mode
        self._dir_mode = stat.S_IFDIR | settings.dir_mode
        self.clock_ns = clock_ns
        self.blocks = blocks or Blocks(
            bucket, [], block_size=8 << 20, downloads=trio.CapacityLimiter(16)
        )
        self.spawn = spawn
        # Background copies of uploads into the SSD tier (`_cache_upload`): unmount waits
        # for them (`finish`), so that a restore after the remount finds whole files.
        self._copying = 0
        self._copies_idle = trio.Event()
        self._copies_idle.set()
        self._monotonic_s = monotonic_s
        self._prefetched_dirs: dict[str, float] = {}
        self._listing_in_flight: dict[str, trio.Event] = {}  # lookups there wait for it
        self._prefetch_limiter = trio.CapacityLimiter(max(1, settings.metadata_prefetch_workers))
        # Tell the kernel to drop a cached name (set by the FUSE layer; a no-op in core tests).
        self.kernel_forget: Callable[[int, str], None] = lambda parent_ino, name: None
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
        # The FUSE requests being served, and warnings about slow ones (its run() is
        # started beside the request loop).
        self.inflight = InFlight(settings.slow_request_s, lambda: bucket.last_error)
        self.interrupts = Interrupts(ignore=settings.ignore_interrupts)  # FUSE INTERRUPT
        self.files: HandleTable[FileHandle] = HandleTable()
        self.dirs: HandleTable[DirHandle] = HandleTable()
        self.dir_counts = {"opens": 0, "kept": 0, "listings_served": 0}
        # FUSE passthrough; the FUSE layer sets ``backings.files`` when the kernel agreed.
        self.backings = Backings(self.blocks)
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
            mode, nlink = self._dir_mode, 2
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

    async def lookup(self, parent_ino: int, name: str) -> Inode:
        """The inode of ``name`` in a directory; the caller hands it to the kernel (+1 lookup)."""
        parent = self._dir(parent_ino)
        path = self.names.child_path(parent.path, name)
        if not self.owned.owns(parent.path):  # (an owned one holds only what we made)
            self._prefetch_listing(parent.path)
        listing = self._listing_in_flight.get(parent.path)
        if listing is not None and self.inodes.current(path) is None:
            await listing.wait()  # one listing answers this and its siblings: no own requests
        inode = await self._resolve(path)
        if inode is None:
            raise NotFound(path)
        self.inodes.remember(inode)
        return inode

    def _prefetch_listing(self, dir_path: str) -> None:
        """gcsfuse's metadata prefetch: the first lookup in a directory lists it in the
        background, so the stats of its siblings (``ls -l``, a data loader opening every
        file) come from the metadata cache instead of one or two requests each."""
        s = self.settings
        if self.spawn is None or not s.metadata_prefetch or s.metadata_ttl_s <= 0:
            return
        if dir_path in self._listing_in_flight:
            return
        now = self._monotonic_s()
        last = self._prefetched_dirs.get(dir_path)
        if last is not None and now - last < s.metadata_ttl_s:
            return
        if len(self._prefetched_dirs) > 100_000:
            self._prefetched_dirs.clear()
        self._prefetched_dirs[dir_path] = now
        self._listing_in_flight[dir_path] = trio.Event()
        self.spawn(self._list_in_background, dir_path)

    async def _list_in_background(self, dir_path: str) -> None:
        try:
            async with self._prefetch_limiter:
                await self.names.prefetch(dir_path, self.settings.metadata_prefetch_entries)
        except Exception as err:  # a failed prefetch only means lookups ask GCS themselves
            log.debug("metadata prefetch of %r failed: %s", dir_path, err)
        finally:
            self._listing_in_flight.pop(dir_path).set()

    def remember(self, inode: Inode) -> None:
        """The kernel accepted ``inode`` in a readdir reply."""
        self.inodes.by_ino.setdefault(inode.ino, inode)
        self.inodes.remember(inode)

    def forget(self, ino: int, count: int) -> None:
        self.inodes.forget(ino, count)

    async def _resolve(self, path: str) -> Inode | None:
        current = self.inodes.current(path)
        if current is not None and (current.local_only or current.staged is not None):
            return current  # local state is newer than anything GCS can say
        if current is None and self.owned.absent(path):
            return None  # in a directory this mount made, and never made here
        if self.pending_deletes and self.pending_deletes.hides(path):
            return None  # removed here; GCS still has it until its delete runs
        if self.pending_moves:
            if self.pending_moves.hides(path):
                return None  # renamed away; its objects may still be there, being moved
            source = self.pending_moves.source_of(path)
            if source is not None:
                return current if current is not None else await self._resolve_moving(path, source)
        found = await self.names.lookup(path)
        current = self.inodes.current(path)  # may have changed while we awaited
        if current is not None and (current.local_only or current.staged is not None):
            return current
        if found is None:
            if self._monotonic_s() < self._emptied.get(path, 0.0):
                # An implied directory whose last object this mount removed: still there,
                # empty, for the metadata TTL (gcsfuse's type cache), so that the rmdir
                # `rm -rf` makes of it next succeeds (the kernel may have forgotten it).
                if current is not None and current.kind is Kind.DIR:
                    return current
                return self.inodes.make(Kind.DIR, path, mtime_ns=self.inodes[ROOT_INO].mtime_ns)
            if current is not None:
                self.inodes.detach(current)
            return None
        if found.is_dir:
            if current is not None and current.kind is Kind.DIR:
                current.placeholder = found.placeholder
                return current
            return self.inodes.make(
                Kind.DIR, path, mtime_ns=self._dir_mtime(found.info), placeholder=found.placeholder
            )
        assert found.info is not None
        return await self._file_inode(path, found.info)

    async def _settle(self, *paths: str, deletes: bool = True) -> None:
        """Before a change to ``paths``: wait for the background renames covering them and,
        with ``deletes``, for the background deletes at or below them."""
        if self.pending_moves:
            await self.pending_moves.settled(*paths)
        if deletes and self.pending_deletes:
            await self.pending_deletes.settled(*paths)

    async def _file_inode(self, path: str, info: ObjectInfo) -> Inode:
        """The inode for one generation of a file or symlink object (reused if unchanged)."""
        current = self.inodes.current(path)
        if (
            current is not None
            and current.kind is not Kind.DIR
            and current.generation == info.generation
        ):
            current.metageneration = info.metageneration
            current.mtime_ns = parse_mtime(info.metadata, info.updated_s)
            current.crc32c = info.crc32c
            return current
        kind = Kind.SYMLINK if is_symlink(info) else Kind.FILE
        target = await self.names.symlink_target(info) if kind is Kind.SYMLINK else ""
        current = self.inodes.current(path)
        if current is not None and (current.local_only or current.staged is not None):
            return current
        return self.inodes.make(
            kind,
            path,
            size=len(target.encode()) if kind is Kind.SYMLINK else info.size,
            generation=info.generation,
            metageneration=info.metageneration,
            mtime_ns=parse_mtime(info.metadata, info.updated_s),
            target=target,
            metadata=dict(info.metadata),
            crc32c=info.crc32c,
        )

    def _dir_mtime(self, info: ObjectInfo | None) -> int:
        if info is None:
            return self.inodes[ROOT_INO].mtime_ns
        return parse_mtime(info.metadata, info.updated_s)

    # -- directories ---------------------------------------------------------------------------

    # -- files: create, open, read, write --------------------------------------------------------

    async def create(self, parent_ino: int, name: str, flags: int) -> tuple[FileHandle, Inode]:
        self.uploads.busy()
        path = self._new_path(parent_ino, name)
        await self._settle(path)
        object_name = self.names.file_object(path)
        existing = self.inodes.current(path)
        if existing is not None and not existing.unlinked and existing.kind is not Kind.FILE:
            raise AlreadyExists(path)
        inode = self.inodes.make(Kind.FILE, path, mtime_ns=self.clock_ns())
        self.owned.added(path)
        self._entries_changed(path)
        with self._staging():
            inode.staged = Staged.new(self.settings.temp_dir, journal=self.journal)
        self._make_spares()
        if self.settings.create_empty_file:
            await self._upload(inode, object_name)
        elif self.spawn is not None and self._streams < self.settings.max_streams:
            await self._start_stream(inode, object_name)
        self.inodes.remember(inode)
        handle = self._open_handle(inode, writable=True, flags=flags)
        staged = inode.staged
        if (
            self.journal is not None
            and self.settings.write_passthrough
            and staged.record_id is not None
            and inode.stream is None
        ):
            handle.backing_id = self.backings.open_staged(inode, staged.fd)
            staged.direct = bool(handle.backing_id)
        return handle, inode

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
        eligible = (
            self.settings.passthrough
            and not writable
            and not flags & os.O_TRUNC
            and inode.staged is None
            and inode.generation != 0
        )
        if writable:
            await self._settle(inode.path)
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

    def _open_handle(self, inode: Inode, *, writable: bool, flags: int) -> FileHandle:
        direct = bool(flags & getattr(os, "O_DIRECT", 0))
        handle = FileHandle(self.files.next_number(), inode, writable, direct_io=direct)
        inode.open_handles += 1
        self._writers += writable
        return self.files.add(handle)

    async def read(self, fh: int, offset: int, length: int) -> bytes | memoryview:
        handle = self.files[fh]
        inode = handle.inode
        for _ in range(2):  # twice: a background rename may move the object meanwhile
            if inode.staged is not None:
                return inode.staged.pread(offset, length)
            if inode.generation == 0:
                return b""
            if handle.reader is None or handle.reader.generation != inode.generation:
                handle.reader = BlockReader(
                    self.blocks,
                    self._read_object(inode),
                    inode.generation,
                    inode.size,
                    spawn=self.spawn,
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
                        self._moved_to(
                            inode, await self.bucket.stat(self.names.file_object(inode.path))
                        )
                if reader.generation == inode.generation:
                    break  # not moved: the generation this inode stands for is gone
        # Changed or deleted elsewhere.
        raise PreconditionFailed(inode.path)

    async def write(self, fh: int, offset: int, data: bytes) -> int:
        self.write_requests += 1
        handle = self.files[fh]
        if not handle.writable:
            raise Unsupported("file not open for writing", errno.EBADF)
        inode = handle.inode
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

    async def setattr(
        self, ino: int, *, size: int | None = None, mtime_ns: int | None = None
    ) -> Attr:
        inode = self._inode(ino)
        await self._settle(inode.path)
        if size is not None:
            if inode.kind is Kind.DIR:
                raise IsADirectory(inode.path)
            self._writable()
            await self._truncate(inode, size)
        if mtime_ns is not None:
            self._writable()
            if inode.kind is Kind.FILE:
                await self._set_mtime(inode, mtime_ns)
            elif inode.kind is Kind.DIR:
                await self._set_dir_mtime(inode, mtime_ns)
            else:  # a symlink: its object was written at symlink()
                inode.mtime_ns = mtime_ns
                await self._patch_mtime(inode, self.names.file_object(inode.path), mtime_ns)
        if inode.open_handles == 0 and inode.staged is not None:
            # Path-based truncate (no open file): nothing else will upload it.
            await self._persist(inode)
            self._retire(inode)
        return self.attr(inode)

    async def _truncate(self, inode: Inode, size: int) -> None:
        self._observe(inode)
        old_size = inode.staged.size if inode.staged is not None else inode.size
        if inode.staged is None:
            await self._stage(inode, size)
        assert inode.staged is not None
        if inode.stream is not None and size != inode.stream.offset:
            self._end_stream(inode)
        if size != old_size or inode.generation == 0:
            inode.staged.truncate(size)
            inode.mtime_ns = self.clock_ns()

    def background_failed(self, error: BaseException) -> None:
        """A background task died of an error nobody expected (logged by the spawner)."""
        self.background_errors += 1

    def _entries_changed(self, *paths: str) -> None:
        """An entry was added or removed at each of ``paths``: their directories' mtime (and
        so ctime) is now, as on a local file system. Kept in memory: a placeholder object
        is not rewritten for every file created in its directory (gcsfuse does not either)."""
        now = self.clock_ns()
        for path in paths:
            parent = self.inodes.current(path.rsplit("/", 1)[0] if "/" in path else "")
            if parent is not None and parent.kind is Kind.DIR:
                parent.mtime_ns = now

    async def _set_dir_mtime(self, inode: Inode, mtime_ns: int) -> None:
        """A directory's mtime lives in its placeholder's metadata (gcsfuse_mtime), written
        now, or with the placeholder if it is still a write-back record. A directory with no
        placeholder (implied by the objects below it, or the mount root) keeps it for this
        mount only: nothing in GCS can carry it (docs/semantics.md)."""
        inode.mtime_ns = mtime_ns
        if not inode.placeholder or inode.ino == ROOT_INO:
            return
        async with self._lock(inode):  # (its placeholder may be uploading)
            if inode.staged is not None:  # still a write-back record: goes up with it
                inode.metadata = {**inode.metadata, MTIME_KEY: format_mtime(mtime_ns)}
                inode.staged.touch()
                return
            found = await self.names.lookup(inode.path)
            if found is None or not found.placeholder or found.info is None:
                return  # the placeholder went away meanwhile: implied, this mount only
            info = await self.bucket.update_metadata(
                self.names.dir_object(inode.path),
                {MTIME_KEY: format_mtime(mtime_ns)},
                generation=found.info.generation,
            )
            self.names.learned(inode.path, Found(True, info, placeholder=True))

    async def _patch_mtime(self, inode: Inode, object_name: str, mtime_ns: int) -> None:
        """Set gcsfuse_mtime on the inode's uploaded object (a file or a symlink) without
        rewriting its bytes."""
        async with self._lock(inode):
            info = await self.bucket.update_metadata(
                object_name, {MTIME_KEY: format_mtime(mtime_ns)}, generation=inode.generation
            )
            inode.metageneration = info.metageneration
            inode.metadata = dict(info.metadata)
            self.names.learned(inode.path, Found(False, info))

    async def _set_mtime(self, inode: Inode, mtime_ns: int) -> None:
        inode.mtime_ns = mtime_ns
        self._end_stream(inode)  # the mtime goes in the object's metadata, set at upload
        if inode.staged is not None or inode.generation == 0:
            if inode.staged is not None:
                inode.staged.touch()
            return
        await self._patch_mtime(inode, self.names.file_object(inode.path), mtime_ns)

    # -- unlink, symlink, rename -----------------------------------------------------------------

    async def unlink(self, parent_ino: int, name: str) -> None:
        await self._settle(self.names.child_path(self._dir(parent_ino).path, name))
        path, inode = await self._existing(parent_ino, name)
        if inode.kind is Kind.DIR:
            raise IsADirectory(path)
        async with self._lock(inode):
            if inode.generation:
                if inode.open_handles and inode.staged is None and inode.kind is Kind.FILE:
                    await self._stage_unlocked(inode)
                if self.journal is not None:
                    await self._delete_later(path, inode.generation)
                else:
                    try:
                        await self.bucket.delete(self.names.file_object(path))
                    except NotFound:
                        pass  # already gone: the name is gone either way
            inode.unlinked = True
            self._end_stream(inode)
            self._removed(path, below=False)
            self.owned.removed(path)
            self._entries_changed(path)
            self.inodes.detach(inode)
            if inode.open_handles == 0:
                self._drop_staged(inode)  # a write-back file not uploaded yet: never will be
                self.inodes.release(inode)

    async def _stage_unlocked(self, inode: Inode) -> None:
        """Keep an unlinked file readable by its open handles: copy it locally first."""
        info = ObjectInfo(
            self.names.file_object(inode.path), inode.size, inode.generation, inode.metageneration
        )
        try:
            with self._staging():
                inode.staged = await Staged.from_object(
                    self.bucket, info, self.settings.temp_dir, inode.size
                )
        except NotFound:
            return
        inode.staged.uploaded_version = inode.staged.version

    async def _delete_later(self, path: str, generation: int) -> None:
        """Write-back: journal the delete of ``path``'s object and hide it; a background
        worker deletes it from GCS (`tierfs.deletes`)."""
        assert self.journal is not None
        self.deletes.busy()  # the deletes wait for the `rm -rf` to pause: it is what waits
        self._delete_count += 1
        delete = Delete(
            f"{time.time_ns():020d}-{self._delete_count}",
            path,
            self.names.file_object(path),
            generation,
        )
        try:
            await trio.to_thread.run_sync(self.journal.deletes.begin, delete)
        except OSError as err:  # a full journal disk: delete now, as without write-back
            log.debug("write-back journal: cannot record a delete (%s): deleting now", err)
            try:
                await self.bucket.delete(delete.object)
            except NotFound:
                pass
            return
        self.pending_deletes.add(delete)
        self.deletes.queue(self._delete_count, delete)

    async def _delete_in_background(self, delete: Delete) -> bool:
        """One queued delete; False: try again later (it stays hidden meanwhile)."""
        try:
            await delete_one(self.bucket, delete)
        except Exception as err:
            self.delete_errors += 1
            level = logging.WARNING if self.delete_errors == 1 else logging.DEBUG
            log.log(
                level, "write-back: delete of gs://%s failed, will retry: %s", delete.object, err
            )
            return False
        try:
            await trio.to_thread.run_sync(self.journal.deletes.end, delete)  # type: ignore[union-attr]
        except OSError as err:  # the next mount deletes it again: NotFound, harmless
            log.warning("write-back journal: cannot drop a delete record: %s", err)
        self.pending_deletes.finished(delete)
        self.names.deleted(delete.path)
        return True

    async def symlink(self, parent_ino: int, name: str, target: str) -> Inode:
        path = self._new_path(parent_ino, name)
        await self._settle(path)
        metadata = {SYMLINK_TARGET_KEY: target}
        body = b""
        if self.settings.standard_symlinks:
            metadata[SYMLINK_FLAG_KEY] = "true"
            body = target.encode("utf-8")
        metadata[MTIME_KEY] = format_mtime(self.clock_ns())
        try:
            info = await self.bucket.write_bytes(
                self.names.file_object(path), body, if_generation_match=0, metadata=metadata
            )
        except PreconditionFailed:
            self.names.forget(path)
            raise AlreadyExists(path) from None
        self.names.learned(path, Found(False, info))
        inode = self.inodes.make(
            Kind.SYMLINK,
            path,
            size=len(target.encode()),
            generation=info.generation,
            metageneration=info.metageneration,
            mtime_ns=parse_mtime(info.metadata, info.updated_s),
            target=target,
            metadata=dict(info.metadata),
        )
        self.inodes.remember(inode)
        self.owned.added(path)
        self._entries_changed(path)
        return inode

    def readlink(self, ino: int) -> str:
        inode = self._inode(ino)
        if inode.kind is not Kind.SYMLINK:
            raise Unsupported("not a symlink", errno.EINVAL)
        return inode.target

    def statistics(self) -> dict[str, object]:
        """Everything `tierfs stats` shows: GCS requests and bytes, tiers, metadata cache."""
        return {
            "gcs": self.bucket.statistics(),
            "data": self.blocks.statistics(),
            "metadata_cache": self.metadata.statistics(),
            "directories": dict(self.dir_counts),
            "hidden_names": self.names.hidden_names,
            "passthrough": self.backings.statistics(),
            "inodes": len(self.inodes),
            "open_files": len(self.files),
            "staging_errors": self.staging_errors,
            "background_errors": self.background_errors,
            "write_requests": self.write_requests,
            "flushes_held": self.flushes_held,
            "requests": {
                "in_flight": len(self.inflight),
                "interrupted": self.interrupts.cancelled,
                "longest_wait_s": round(self.inflight.longest_wait_s(), 3),
                "slow_warnings": self.inflight.warnings,
            },
            "writeback": {
                "enabled": self.journal is not None,
                "pending": self.pending_uploads(),
                "failing": len(self._failed),
                "moving": sum(1 for _ in self.pending_moves),
                "deleting": len(self.pending_deletes),
                "delete_errors": self.delete_errors,
                **self.writeback_counts,
            },
        }

    def pending_uploads(self) -> int:
        """Files closed (committed) but not in GCS yet."""
        return sum(
            1
            for inode in self.inodes.by_ino.values()
            if inode.staged is not None and inode.staged.committed and inode.staged.dirty
        )

    # -- shutdown ---------------------------------------------------------------------------------

    async def sync_all(
        self, path: str = "", *, moves: bool = True, stop_at_failure: bool = False
    ) -> None:
        """Upload every dirty file now (``tierfs sync``, unmount, SIGTERM), write-back ones
        included; only ``path`` and what is below it, if given; SYNC_UPLOADS at a time (a
        save of small files is request latency, one by one it took 6 ms a file). Errors
        are raised after trying all: the first, with how many failed. ``stop_at_failure``:
        after the first upload that fails (its retries over), try no more (an unmount with
        write-back: the journal keeps the rest, and GCS is not answering)."""
        failures: list[Exception] = []
        limit = trio.CapacityLimiter(SYNC_UPLOADS)
        stop = trio.CancelScope()

        async def one(inode: Inode) -> None:
            staged = inode.staged
            large = staged is not None and staged.size > LARGE_UPLOAD_BYTES
            try:
                async with limit, self._large_uploads if large else contextlib.nullcontext():
                    await self._sync(inode)
            except Exception as err:  # keep going: upload what can be uploaded
                failures.append(err)
                if stop_at_failure:
                    stop.cancel()
            else:
                if inode.open_handles == 0:
                    self._retire(inode)

        with stop:
            async with trio.open_nursery() as nursery:
                for inode in list(self.inodes.by_ino.values()):
                    if path and inode.path != path and not inode.path.startswith(path + "/"):
                        continue
                    if inode.staged is not None and inode.staged.dirty and not inode.unlinked:
                        nursery.start_soon(one, inode)
        if stop.cancelled_caught:
            log.warning(
                "GCS fails (%s): %d file(s) stay in the write-back journal; the next mount "
                "uploads them",
                failures[0],
                self.pending_uploads(),
            )
            return
        if len(failures) > 1:
            log.error("%d files could not be uploaded; the first: %s", len(failures), failures[0])
        if failures:
            raise failures[0]
        for moving in self.pending_moves.covering(path) if moves else []:
            await moving.wait()  # durable means moved too
        if moves:
            await self.pending_deletes.settled(path)  # and deleted

    async def finish(self) -> None:
        """At unmount, while background tasks still run: upload every dirty file, let the
        SSD-tier copies of uploads finish, and seal what is whole, so that the next mount
        reads those files from local disk, directly. An upload error is logged, not raised:
        the daemon is going away either way (a write-back journal keeps the file)."""
        try:
            # Without write-back nothing else has these files: try them all. With it, the
            # journal has them: one upload that fails its retries ends the attempt.
            await self.sync_all(moves=False, stop_at_failure=self.journal is not None)
        except Exception as err:
            log.error("pending writes could not be uploaded: %s", err)
        with trio.move_on_after(MOVES_AT_UNMOUNT_S):  # these are journaled: bounded
            for moving in self.pending_moves:
                await moving.done.wait()
            if self.deletes.running:  # (not when the loop failed: nothing deletes then)
                await self.pending_deletes.settled("")
        if self.pending_deletes:
            log.warning(
                "unmount: %d deletes not done in GCS yet; the next mount does them from the "
                "journal",
                len(self.pending_deletes),
            )
        if self.pending_moves:
            log.warning(
                "unmount: %d directory rename(s) still moving objects; the next mount "
                "finishes them from the journal",
                sum(1 for _ in self.pending_moves),
            )
        if self._copying:
            log.info("unmount: finishing the SSD-tier copies of %d uploads", self._copying)
        while self._copying:
            await self._copies_idle.wait()
        await self.blocks.seal_pending()

    def close(self) -> None:
        if self.journal is not None:
            self.journal.drop_spares()
        for inode in self.inodes.by_ino.values():
            if inode.staged is not None:
                inode.staged.close()
                inode.staged = None

    # -- helpers --------------------------------------------------------------------------------

    def _removed(self, path: str, *, below: bool = True) -> None:
        """``path`` is gone: forget it, and the directories that existed only through it.

        Implied directories (no placeholder) may vanish with their last object; the
        kernel would keep their names for the TTL, so they are dropped there too."""
        self.names.removed(path, below=below)
        parent = self.inodes.current(path.rsplit("/", 1)[0] if "/" in path else "")
        while parent is not None and parent.ino != ROOT_INO and not parent.placeholder:
            grand = self.inodes.current(parent.parent_path)
            if grand is None:
                break
            self.kernel_forget(grand.ino, parent.name)
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
