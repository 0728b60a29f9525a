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
import functools
import logging
import math
import mimetypes
import os
import stat
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import NamedTuple

import trio
from cachetools import LRUCache

from mount_options import Config
from mount_options.derive import file_cache_enabled
from tierfs.blocks import BlockReader, Blocks, Spawn
from tierfs.dirmove import (
    MAX_MOVE_RETRY_S,
    MOVE_RETRY_S,
    Move,
    Moving,
    PendingMoves,
    move_objects,
)
from tierfs.errors import (
    AlreadyExists,
    IsADirectory,
    NotADirectory,
    NotEmpty,
    NotFound,
    PreconditionFailed,
    ReadOnly,
    TooManyObjects,
    Unsupported,
    root_cause,
)
from tierfs.handles import DirHandle, FileHandle, HandleTable
from tierfs.inodes import ROOT_INO, Inode, InodeTable, Kind
from tierfs.metacache import MetadataCache, size_limit, ttl_s
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
from tierfs.storage import Bucket, ObjectInfo
from tierfs.streaming import Stream
from tierfs.uploader import Uploader
from tierfs.writeback import SPARE_FILES, Journal, Record
from tierfs.writer import MTIME_KEY, Staged, format_mtime, parse_mtime

log = logging.getLogger("tierfs.fs")
NEVER_S = 10.0 * 365 * 24 * 3600  # "-1 = never expires" as a kernel timeout
# Writes (FUSE sends at most 1 MiB each) queued per streaming file while its upload
# sends a chunk: enough to keep the upload busy, small beside the chunk it buffers.
STREAM_QUEUE_WRITES = 8
# Write-back uploads of files over this size (the client's single-request limit; larger
# ones are resumable, and it holds a chunk of each in memory) run at most LARGE_UPLOADS at
# a time, so many uploaders serve small files without a save of big ones costing memory.
LARGE_UPLOAD_BYTES = 8 << 20
LARGE_UPLOADS = 4
MOVES_AT_UNMOUNT_S = 300.0  # unmount waits this long for background renames (journaled)
SYNC_UPLOADS = 16  # uploads at a time for `tierfs sync`, unmount and SIGTERM
BLOCK_SIZE = 4096
RENAME_NOREPLACE = 1
RENAME_EXCHANGE = 2


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

    @classmethod
    def from_config(cls, config: Config, uid: int, gid: int) -> Settings:
        ttl = config["metadata-cache:ttl-secs"]
        attr_timeout = NEVER_S if ttl < 0 else float(ttl)
        return cls(
            file_mode=config["file-system:file-mode"],
            dir_mode=config["file-system:dir-mode"],
            uid=uid if config["file-system:uid"] < 0 else config["file-system:uid"],
            gid=gid if config["file-system:gid"] < 0 else config["file-system:gid"],
            attr_timeout_s=attr_timeout,
            # The kernel keeps names as long as we keep their metadata (gcsfuse keeps 0
            # unless experimental-enable-dentry-cache; our own changes update the kernel's
            # entries as they happen, so the TTL is the only staleness either way).
            entry_timeout_s=attr_timeout,
            temp_dir=config["file-system:temp-dir"],
            rename_dir_limit=config["file-system:rename-dir-limit"],
            implicit_dirs=config["implicit-dirs"],
            only_dir=config["only-dir"],
            read_only="ro" in config.fuse_options,
            standard_symlinks=config["enable-standard-symlinks"],
            create_empty_file=config["write:create-empty-file"],
            metadata_ttl_s=ttl_s(ttl),
            negative_ttl_s=ttl_s(config["metadata-cache:negative-ttl-secs"]),
            stat_cache_max_bytes=size_limit(config["metadata-cache:stat-cache-max-size-mb"]),
            read_ahead_bytes=read_ahead_bytes(config),
            list_ttl_s=ttl_s(config["file-system:kernel-list-cache-ttl-secs"]),
            metadata_prefetch=config["metadata-cache:enable-metadata-prefetch"],
            metadata_prefetch_workers=config["metadata-cache:metadata-prefetch-max-workers"],
            metadata_prefetch_entries=config["metadata-cache:metadata-prefetch-entries-limit"],
            write_back_delay_s=float(config["write:write-back-delay-secs"]),
            fsync_to_gcs=config["write:fsync-to-gcs"],
            write_passthrough=config["write:passthrough"],
            max_streams=max_streams(config),
            stream_chunk_bytes=max(1, int(config["write:block-size-mb"] * 4)) << 18,  # 256 KiB
            file_cache=file_cache_enabled(config.settings),
            cache_for_range_read=config["file-cache:cache-file-for-range-read"],
            passthrough=config["file-cache:passthrough"],
        )


def max_streams(config: Config) -> float:
    """Streaming uploads at a time: ``global-max-blocks`` / ``max-blocks-per-file`` (-1 is
    unlimited; 0 turns streaming off). Off with write-back, whose close() is local."""
    if not config["write:enable-streaming-writes"] or config["write:write-back"]:
        return 0
    total, per_file = config["write:global-max-blocks"], config["write:max-blocks-per-file"]
    if total < 0:
        return math.inf
    return total // per_file if per_file > 0 else total


def read_ahead_bytes(config: Config) -> int:
    """How far sequential reads prefetch: ``sequential-read-size-mb``, but never more than a
    quarter of the RAM tier (prefetched blocks wait there; more would evict them unread)."""
    wanted = config["gcs-connection:sequential-read-size-mb"] << 20
    ram = config["ram-cache:max-size-mb"] << 20
    block = config["ram-cache:block-size-mb"] << 20
    return min(wanted, max(block, ram // 4)) if ram else wanted


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


class Filesystem:
    """POSIX operations over a bucket; the state of one mount."""

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
        self._remote_readers: dict[str, Inode] = {}  # old object name -> inode reading it
        self._streams = 0
        self._spares_coming = False  # a thread is making spare journal files
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

    async def _resolve_moving(self, path: str, source: str) -> Inode | None:
        """A new name of a directory rename still moving its objects: under the old name
        until its object is moved, then under the new one."""
        found = await self.names.lookup(source)
        if found is None:
            found = await self.names.lookup(path)
        current = self.inodes.current(path)
        if found is None or current is not None:
            return current
        if found.is_dir:
            return self.inodes.make(
                Kind.DIR, path, mtime_ns=self._dir_mtime(found.info), placeholder=found.placeholder
            )
        assert found.info is not None
        return self._still_moving(await self._file_inode(path, found.info), found.info)

    def _still_moving(self, inode: Inode, info: ObjectInfo) -> Inode:
        """``inode`` reads ``info``'s object, which may still be under its old name."""
        if info.name != self.names.file_object(inode.path) and inode.kind is not Kind.DIR:
            inode.remote = info.name
            self._remote_readers[info.name] = inode
        return inode

    def _read_object(self, inode: Inode) -> str:
        """The object a clean file's bytes are read from."""
        return inode.remote or self.names.file_object(inode.path)

    async def _settle(self, *paths: str) -> None:
        """Before a change to ``paths``: wait for the background renames covering them."""
        if self.pending_moves:
            await self.pending_moves.settled(*paths)

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

    def opendir(self, ino: int) -> int:
        inode = self._dir(ino)
        self.dir_counts["opens"] += 1
        return self.dirs.add(DirHandle(self.dirs.next_number(), inode)).fh

    def kernel_may_keep_listing(self, fh: int) -> bool:
        """Whether the kernel may keep the listing it cached of this handle's directory
        (``kernel-list-cache-ttl-secs``): only while the listing it was last given is still
        the one kept here, that is within the TTL and with no change made through this
        mount since. Otherwise the kernel drops its copy and asks again."""
        listings = self.names.listings
        inode = self.dirs[fh].inode
        given = self._listed.get(inode.path)
        keep = (
            listings is not None
            and given is not None
            and listings.get(inode.path) is given[0]
            and self.inodes.by_path.get(inode.path) is inode
            and not self.pending_moves
        )
        if keep:
            self.dir_counts["kept"] += 1
        return keep

    async def readdir(self, fh: int, start: int) -> list[tuple[str, Inode, int]]:
        """Entries from offset ``start``: (name, inode, next offset)."""
        handle = self.dirs[fh]
        if handle.entries is None or start == 0:
            self.dir_counts["listings_served"] += 1
            handle.entries = await self._list(handle.inode)
        return [
            (name, inode, index)
            for index, (name, inode) in enumerate(handle.entries[start:], start + 1)
        ]

    def releasedir(self, fh: int) -> None:
        self.dirs.pop(fh)

    async def _list(self, directory: Inode) -> list[tuple[str, Inode]]:
        source = self.pending_moves.source_of(directory.path) if self.pending_moves else None
        old = None
        if source is not None:
            # The old prefix first: an object moved between the two listings is in both,
            # never in neither (it is copied before it is deleted).
            old = await self.names.list_dir(source, fresh=True)
        listing = await self.names.list_dir(directory.path, fresh=old is not None)
        entries = self._reuse_listed(directory.path, listing)
        if entries is None:
            entries = []
            for part in listing.dirs:
                path = self.names.child_path(directory.path, part)
                inode = self.inodes.current(path)
                if inode is None or inode.kind is not Kind.DIR:
                    inode = self.inodes.make(
                        Kind.DIR, path, mtime_ns=self.inodes[ROOT_INO].mtime_ns
                    )
                entries.append((part, inode))
            for entry_name, info in listing.files:
                path = self.names.child_path(directory.path, entry_name)
                entries.append((entry_name, await self._file_inode(path, info)))
            if self.names.listings is not None and not self.pending_moves:
                paths = [inode.path for _, inode in entries]  # (else a new object each time)
                self._listed[directory.path] = (listing, entries, paths)
        if self.pending_moves:
            entries = await self._list_moving(directory, entries, old)
        local = [
            inode
            for inode in self.inodes.children(directory.path)
            if inode.staged is not None or inode.local_only
        ]
        if not local:
            return entries
        seen = {name for name, _ in entries}
        return entries + [(inode.name, inode) for inode in local if inode.name not in seen]

    async def _list_moving(
        self, directory: Inode, entries: list[tuple[str, Inode]], old: DirListing | None
    ) -> list[tuple[str, Inode]]:
        """A listing while directory renames move objects: without the names they took
        away, with the new names (``old``: the listing under the old prefix, for objects
        not moved yet)."""
        moves = self.pending_moves
        entries = [(name, inode) for name, inode in entries if not moves.hides(inode.path)]
        seen = {name for name, _ in entries}
        if old is not None:
            for part in old.dirs:
                path = self.names.child_path(directory.path, part)
                inode = self.inodes.current(path)
                if part not in seen and (inode is None or inode.kind is Kind.DIR):
                    inode = inode or self.inodes.make(
                        Kind.DIR, path, mtime_ns=self.inodes[ROOT_INO].mtime_ns
                    )
                    entries.append((part, inode))
                    seen.add(part)
            for entry_name, info in old.files:
                if entry_name not in seen:
                    path = self.names.child_path(directory.path, entry_name)
                    inode = self._still_moving(await self._file_inode(path, info), info)
                    entries.append((entry_name, inode))
                    seen.add(entry_name)
        for destination in moves.destinations_in(directory.path):
            inode = self.inodes.current(destination)
            if inode is not None and inode.name not in seen:
                entries.append((inode.name, inode))
                seen.add(inode.name)
        return entries

    def _reuse_listed(self, dir_path: str, listing: DirListing) -> list[tuple[str, Inode]] | None:
        """The entries built from this very listing last time, if each is still the current
        inode of its path. A kept listing (``kernel-list-cache-ttl-secs``) is the same object
        at every ``ls``; rebuilding its inodes was half of a warm ``ls -lR``'s daemon time."""
        kept = self._listed.get(dir_path)
        if kept is None or kept[0] is not listing:
            return None
        current = self.inodes.by_path.get
        for (_, inode), path in zip(kept[1], kept[2], strict=True):
            # Still this path's inode, and still at this path (not renamed meanwhile).
            if current(path) is not inode or inode.path != path:
                return None
        return kept[1]

    async def mkdir(self, parent_ino: int, name: str) -> Inode:
        path = self._new_path(parent_ino, name)
        await self._settle(path)
        if self.journal is not None:
            return await self._mkdir_local(path)
        try:
            info = await self.bucket.write_bytes(
                self.names.dir_object(path), b"", if_generation_match=0
            )
        except PreconditionFailed:
            self.names.forget(path)
            raise AlreadyExists(path) from None
        self.names.learned(path, Found(True, info, placeholder=True))
        inode = self.inodes.make(
            Kind.DIR, path, mtime_ns=parse_mtime(info.metadata, info.updated_s), placeholder=True
        )
        self.inodes.remember(inode)
        self.owned.added(path)
        return inode

    async def _mkdir_local(self, path: str) -> Inode:
        """mkdir with write-back: no GCS request. The kernel has just looked the name up;
        the placeholder object is a journal record of an empty file, uploaded with the
        files (and moved with the directory if it is renamed first)."""
        self.uploads.busy()
        current = self.inodes.current(path)
        if current is not None and not current.unlinked:
            raise AlreadyExists(path)
        inode = self.inodes.make(Kind.DIR, path, mtime_ns=self.clock_ns(), placeholder=True)
        with self._staging():
            inode.staged = Staged.new(self.settings.temp_dir, journal=self.journal)
        self.names.forget(path)  # a negative entry, and the parent's kept listing
        self.owned.made(path)
        self.inodes.remember(inode)
        await self._commit(inode)
        self._queue_if_closed(inode)
        return inode

    async def rmdir(self, parent_ino: int, name: str) -> None:
        await self._settle(self.names.child_path(self._dir(parent_ino).path, name))
        path, inode = await self._existing(parent_ino, name)
        if inode.kind is not Kind.DIR:
            raise NotADirectory(path)
        if any(child.local_only for child in self.inodes.below(path)):
            raise NotEmpty(path)
        placeholder = self.names.dir_object(path)
        owned = self.owned.children(path)
        if owned is not None:  # made here: its own table says whether it is empty
            if owned:
                raise NotEmpty(path)
        else:
            listing = await self.bucket.list(placeholder, delimiter=None, max_results=2)
            if any(info.name != placeholder for info in listing.objects):
                raise NotEmpty(path)
        async with self._lock(inode):  # (its placeholder may be uploading)
            self._drop_staged(inode)
            if owned is None or inode.generation:
                try:
                    await self.bucket.delete(placeholder)
                except NotFound:
                    pass  # an implicit directory: nothing to delete
        self._removed(path)
        self.owned.removed(path, is_dir=True)
        self.inodes.detach(inode)

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

    async def _start_stream(self, inode: Inode, object_name: str) -> None:
        upload = await self.bucket.open_upload(
            object_name,
            if_generation_match=0,
            chunk_bytes=self.settings.stream_chunk_bytes,
            content_type=mimetypes.guess_type(object_name)[0],
        )
        inode.stream = Stream(upload, max_pending=STREAM_QUEUE_WRITES)
        self._streams += 1
        assert self.spawn is not None
        self.spawn(inode.stream.run)

    def _end_stream(self, inode: Inode) -> None:
        """Abandon the inode's streaming upload (in the background); the staged file has
        every byte, so the file simply becomes a staged write."""
        stream, inode.stream = inode.stream, None
        if stream is not None:
            self._streams -= 1
            assert self.spawn is not None
            self.spawn(stream.abort)

    async def _send(self, inode: Inode, staged: Staged, object_name: str) -> ObjectInfo:
        """Make the object from the staged file: by finishing its stream if it has one that
        holds every byte, else by uploading the file whole."""
        stream, inode.stream = inode.stream, None
        if stream is not None:
            self._streams -= 1
            if staged.size < self.settings.stream_chunk_bytes:
                # Nothing was sent yet: one plain upload is cheaper than finishing a
                # resumable session (and the emulator honours its precondition).
                await stream.abort()
            elif stream.offset == staged.size and not staged.clobbered:
                version = staged.version
                try:
                    info = await stream.finish()
                except PreconditionFailed:
                    raise
                except Exception as err:
                    log.warning(
                        "gs://%s: streaming upload failed (%s); uploading whole", object_name, err
                    )
                else:
                    staged.base_generation = info.generation
                    staged.uploaded_version = version
                    return info
            else:
                await stream.abort()
        return await staged.upload(self.bucket, object_name, self._upload_metadata(inode))

    async def flush(self, fh: int, *, last: bool = True) -> None:
        """close() of one descriptor. One that is not the file's last close (``last``
        False: a forked child's exit, a dup'd fd; see tierfs.closes) publishes nothing
        without write-back, so no partial object appears: release uploads what is left."""
        if not last and self.journal is None:
            self.flushes_held += 1
            return
        await self._persist(self.files[fh].inode)

    async def fsync(self, fh: int) -> None:
        """Without write-back: upload now. With write-back: the data and its journal record
        are durable on the local tier when this returns (the upload waits for the last
        close); ``write:fsync-to-gcs`` makes it wait for GCS too (and retry a failed
        background upload: its error is this call's error)."""
        inode = self.files[fh].inode
        if self.journal is not None and not self.settings.fsync_to_gcs:
            await self._commit(inode, durable=True)
        else:
            await self._sync(inode)

    async def release(self, fh: int) -> None:
        handle = self.files.pop(fh)
        if handle is None:
            return
        self._observe(handle.inode)  # what the kernel wrote directly, before it lets go
        self._release_backing(handle)  # first: a next open must see the kernel's state
        try:
            await self._persist(handle.inode)
        except Exception as err:
            # The kernel does not wait for RELEASE: nobody else will hear of this.
            log.warning("%s: upload at the last close failed: %s", handle.inode.path, err)
            raise
        finally:
            self._close_handle(handle)
        self._queue_if_closed(handle.inode)

    async def _persist(self, inode: Inode) -> None:
        """close() and flush(): upload now, or, with write-back, commit to the journal (a
        flush also comes from a forked child's exit or a dup'd fd's close while the file is
        still being written: the upload itself waits for the last release)."""
        self.uploads.busy()
        if self.journal is None:
            await self._sync(inode)
        else:
            await self._commit(inode)
            self._queue_if_closed(inode)  # (a path-based truncate or utime: nothing is open)

    def _release_backing(self, handle: FileHandle) -> None:
        if handle.backing_id:
            handle.backing_id = 0
            inode = handle.inode
            self.backings.release(inode)
            if inode.staged is not None and not self.backings.holds_staged(inode):
                inode.staged.direct = False

    def _observe(self, inode: Inode) -> None:
        """Take in what the kernel wrote straight into a staged file (passthrough)."""
        staged = inode.staged
        if staged is not None and staged.direct:
            mtime_ns = staged.observe()
            if mtime_ns is not None:
                inode.mtime_ns = mtime_ns

    def _close_handle(self, handle: FileHandle) -> None:
        self._release_backing(handle)
        self.files.pop(handle.fh)
        inode = handle.inode
        inode.open_handles -= 1
        self._writers -= handle.writable
        if handle.reader is not None:
            handle.reader.close()
        self._retire(inode)

    def _retire(self, inode: Inode) -> None:
        """Let go of a closed file's staged copy once GCS has the truth: it was uploaded,
        lost to another writer (the caller got ESTALE), or unlinked."""
        staged = inode.staged
        if (
            inode.open_handles == 0
            and staged is not None
            and (not staged.dirty or staged.clobbered or inode.unlinked)
        ):
            self._drop_staged(inode)
            if staged.clobbered:
                self.inodes.detach(inode)
        self.inodes.release(inode)

    def _drop_staged(self, inode: Inode) -> None:
        self._end_stream(inode)
        staged = inode.staged
        if staged is None:
            return
        staged.close()
        inode.staged = None
        if staged.record_id is not None and self.journal is not None:
            self.journal.discard(staged.record_id)  # two unlinks; a conflict was moved aside

    async def _sync(self, inode: Inode) -> None:
        """Upload the inode's staged data if it has changes (fsync; flush and close unless
        write-back is on)."""
        async with self._lock(inode):
            await self._sync_locked(inode)

    async def _sync_locked(self, inode: Inode) -> None:
        self._observe(inode)
        staged = inode.staged
        if staged is None or not staged.dirty or inode.unlinked:
            return
        if staged.clobbered:
            raise PreconditionFailed(inode.path)
        if staged.write_error:
            self._abandon(inode)
        await self._upload(inode, self._object_of(inode))

    def _object_of(self, inode: Inode) -> str:
        """The object an inode's staged file becomes: a directory's is its placeholder."""
        if inode.kind is Kind.DIR:
            return self.names.dir_object(inode.path)
        return self.names.file_object(inode.path)

    def _abandon(self, inode: Inode) -> None:
        """A local write failed (ENOSPC...): drop the changes rather than upload a file that
        is not what was written; a new file disappears. Raises that write's error."""
        staged = inode.staged
        assert staged is not None
        code = staged.write_error
        self._drop_staged(inode)
        if inode.generation == 0:
            inode.unlinked = True
            self._removed(inode.path)
            self.owned.removed(inode.path)
            self.inodes.detach(inode)
        log.error("%s: a local write failed (%s); changes dropped", inode.path, os.strerror(code))
        raise OSError(code, os.strerror(code), inode.path)

    # -- write-back --------------------------------------------------------------------------

    async def _commit(self, inode: Inode, *, durable: bool = False) -> None:
        """Commit the staged file to the journal (`_queue_if_closed` uploads it): safe from
        a daemon crash once this returns, and with ``durable`` (fsync) from a machine crash
        too. close() is not durable, as on a local disk: an fsync per close would cap a
        save of small files at a few hundred per second."""
        async with self._lock(inode):
            self._observe(inode)
            staged = inode.staged
            if staged is None or not staged.dirty or inode.unlinked:
                return
            if staged.committed and (not durable or staged.durable_version == staged.version):
                return
            if staged.clobbered:
                raise PreconditionFailed(inode.path)
            if staged.write_error:
                self._abandon(inode)
            assert self.journal is not None and staged.record_id is not None
            version = staged.version
            commit = functools.partial(
                self.journal.commit, staged.fd, self._record(inode), durable=durable
            )
            if self.journal.inline and not durable:
                commit()  # one fsetxattr: a thread's round trip would cost more
            else:
                await trio.to_thread.run_sync(commit)
            staged.committed_version = version
            if durable:
                staged.durable_version = version
            self.writeback_counts["committed"] += 1

    def _queue_if_closed(self, inode: Inode) -> None:
        """With write-back, once no handle is open: queue the upload of what was committed.
        Never while open, so no object is made from a file still being written."""
        staged = inode.staged
        if (
            self.journal is not None
            and inode.open_handles == 0
            and not inode.unlinked
            and staged is not None
            and staged.committed
            and staged.dirty
        ):
            self._queue_upload(inode, self.settings.write_back_delay_s)

    def _record(self, inode: Inode) -> Record:
        staged = inode.staged
        assert staged is not None and staged.record_id is not None
        object_name = self._object_of(inode)
        return Record(
            staged.record_id,
            object_name,
            staged.base_generation,
            self._upload_metadata(inode),
            mimetypes.guess_type(object_name)[0],
            staged.size,
        )

    def _queue_upload(self, inode: Inode, delay_s: float = 0.0) -> None:
        self.uploads.queue(inode.ino, inode, delay_s)

    @staticmethod
    def _committed_again(inode: Inode) -> bool:
        """Written and committed again while its upload ran: upload once more (once it is
        closed: the release of an open one queues it)."""
        staged = inode.staged
        return inode.open_handles == 0 and staged is not None and staged.committed and staged.dirty

    async def run_uploads(self, workers: int, retry_s: float = 5.0) -> None:
        """The write-back uploader (runs until cancelled): see `tierfs.uploader`."""
        await self.uploads.run(workers, retry_s)

    def uploads_idle(self) -> bool:
        return self.uploads.idle()

    async def _upload_in_background(self, inode: Inode) -> bool:
        """One queued upload; False when it should be tried again later."""
        if inode.open_handles:
            return True  # opened again while queued: its last release queues it again
        staged = inode.staged
        large = staged is not None and staged.size > LARGE_UPLOAD_BYTES
        try:
            async with self._large_uploads if large else contextlib.nullcontext():
                await self._sync(inode)
        except PreconditionFailed:
            log.error(
                "write-back: gs://%s was changed by another client; this mount's version "
                "is kept in %s",
                self.names.file_object(inode.path),
                self.journal.conflicts_dir if self.journal else "?",
            )
        except Exception as err:
            self.writeback_counts["failed"] += 1
            self._failed[inode.ino] = f"{self.names.file_object(inode.path)}: {err}"
            log.error("write-back: upload of gs://%s failed, will retry: %s", inode.path, err)
            return False
        self._retire(inode)
        return True

    def _upload_metadata(self, inode: Inode) -> dict[str, str]:
        if inode.kind is Kind.DIR:
            return {}  # a placeholder, as mkdir writes it
        metadata = dict(inode.metadata)
        metadata[MTIME_KEY] = format_mtime(inode.mtime_ns)
        return metadata

    async def _upload(self, inode: Inode, object_name: str) -> None:
        if inode.remote is not None:  # its object is still being moved to this name
            await self._settle(inode.path)
        staged = inode.staged
        assert staged is not None
        try:
            info = await self._send(inode, staged, object_name)
        except PreconditionFailed:
            if inode.kind is Kind.DIR:  # another client made this directory too: it exists
                info = await self.bucket.stat(object_name)
                staged.uploaded_version = staged.version
                await self._uploaded_placeholder(inode, staged, info)
                return
            staged.clobbered = True
            self.names.forget(inode.path)
            if staged.committed_version is not None:
                # close() already said yes to these bytes: keep them for the user.
                assert self.journal is not None
                self.writeback_counts["conflicts"] += 1
                with contextlib.suppress(FileNotFoundError):
                    await trio.to_thread.run_sync(self.journal.keep_conflict, self._record(inode))
            raise
        if inode.kind is Kind.DIR:
            await self._uploaded_placeholder(inode, staged, info)
            return
        self.names.learned(inode.path, Found(False, info))
        await self._uploaded(inode, staged)
        if self.spawn is not None and self.settings.file_cache:
            self._cache_upload(staged, object_name, info)
        inode.generation = info.generation
        inode.metageneration = info.metageneration
        inode.size = info.size
        inode.metadata = dict(info.metadata)
        inode.crc32c = info.crc32c

    async def _uploaded(self, inode: Inode, staged: Staged) -> None:
        """An upload of a staged file succeeded: its journal record is done."""
        self._failed.pop(inode.ino, None)
        if staged.committed_version is not None:
            assert self.journal is not None and staged.record_id is not None
            if staged.uploaded_version >= staged.committed_version:
                await trio.to_thread.run_sync(self.journal.done, staged.record_id)
            self.writeback_counts["uploaded"] += 1

    async def _uploaded_placeholder(self, inode: Inode, staged: Staged, info: ObjectInfo) -> None:
        self.names.learned(inode.path, Found(True, info, placeholder=True))
        await self._uploaded(inode, staged)
        inode.generation = info.generation
        inode.metageneration = info.metageneration

    def _cache_upload(self, staged: Staged, object_name: str, info: ObjectInfo) -> None:
        """Keep what was just uploaded in the SSD tier too (in the background, from a dup of
        the staged file, which may be closed meanwhile), unless it is written again first."""
        assert self.spawn is not None
        version = staged.uploaded_version  # what the file held when the upload began
        if staged.version != version:
            return  # written during the upload: the object is not what the file holds
        fd = os.dup(staged.fd)
        if not self._copying:
            self._copies_idle = trio.Event()
        self._copying += 1

        async def store() -> None:
            try:
                await self.blocks.store_local(
                    fd, object_name, info.generation, info.size, lambda: staged.version == version
                )
            except Exception as err:  # a cache that could not be filled is only a miss later
                log.warning("could not cache the upload of gs://%s: %s", object_name, err)
            finally:
                os.close(fd)
                self._copying -= 1
                if not self._copying:
                    self._copies_idle.set()

        self.spawn(store)

    async def _stage(self, inode: Inode, length: int) -> None:
        """Give a clean file inode a local copy of (the first ``length`` bytes of) its object."""
        async with self._lock(inode):
            if inode.staged is not None:
                return
            if inode.generation == 0:
                with self._staging():
                    inode.staged = Staged.new(self.settings.temp_dir, journal=self.journal)
                return
            info = ObjectInfo(
                self.names.file_object(inode.path),
                inode.size,
                inode.generation,
                inode.metageneration,
            )
            try:
                with self._staging():
                    inode.staged = await Staged.from_object(
                        self.bucket,
                        info,
                        self.settings.temp_dir,
                        min(length, inode.size),
                        self.journal,
                    )
            except NotFound:
                raise PreconditionFailed(inode.path) from None

    def _make_spares(self) -> None:
        """Have a thread make empty journal files ahead (`Journal.new_file`): on a disk where
        a create costs ~1 ms, a save of small files would otherwise wait for each."""
        journal = self.journal
        if journal is None or self.spawn is None or self._spares_coming:
            return
        if journal.spares >= SPARE_FILES // 2:
            return
        self._spares_coming = True

        async def make() -> None:
            try:
                await trio.to_thread.run_sync(journal.make_spares, SPARE_FILES)
            except Exception as err:  # a full disk: the next create() says so itself
                log.debug("write-back journal: no spare files made: %s", err)
            finally:
                self._spares_coming = False

        self.spawn(make)

    @contextlib.contextmanager
    def _staging(self) -> Iterator[None]:
        """Around making a local file for writes: a failure (a full or vanished ``temp-dir``
        or write-back directory) still reaches the caller as its errno, and is counted in
        `tierfs stats`; the first one is also said at WARNING, since the mount itself looks
        healthy while every create fails."""
        try:
            yield
        except OSError as err:
            self.staging_errors += 1
            level = logging.WARNING if self.staging_errors == 1 else logging.DEBUG
            log.log(
                level, "cannot make a local file for writing: %s (counted in tierfs stats)", err
            )
            raise

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
        if mtime_ns is not None and inode.kind is Kind.FILE:
            await self._set_mtime(inode, mtime_ns)
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

    async def _set_mtime(self, inode: Inode, mtime_ns: int) -> None:
        inode.mtime_ns = mtime_ns
        self._end_stream(inode)  # the mtime goes in the object's metadata, set at upload
        if inode.staged is not None or inode.generation == 0:
            if inode.staged is not None:
                inode.staged.touch()
            return
        async with self._lock(inode):
            info = await self.bucket.update_metadata(
                self.names.file_object(inode.path),
                {MTIME_KEY: format_mtime(mtime_ns)},
                generation=inode.generation,
            )
            inode.metageneration = info.metageneration
            inode.metadata = dict(info.metadata)
            self.names.learned(inode.path, Found(False, info))

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
                try:
                    await self.bucket.delete(self.names.file_object(path))
                except NotFound:
                    pass  # already gone: the name is gone either way
            inode.unlinked = True
            self._end_stream(inode)
            self._removed(path)
            self.owned.removed(path)
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
        return inode

    def readlink(self, ino: int) -> str:
        inode = self._inode(ino)
        if inode.kind is not Kind.SYMLINK:
            raise Unsupported("not a symlink", errno.EINVAL)
        return inode.target

    async def rename(
        self, old_parent: int, old_name: str, new_parent: int, new_name: str, flags: int = 0
    ) -> None:
        self._writable()
        self.uploads.busy()  # a rename is part of a save: files it moves had better wait
        if flags & RENAME_EXCHANGE:
            raise Unsupported("RENAME_EXCHANGE", errno.EINVAL)
        check_new_name(new_name)
        old_path = self.names.child_path(self._dir(old_parent).path, old_name)
        new_path = self.names.child_path(self._dir(new_parent).path, new_name)
        if old_path == new_path:
            return
        await self._settle(old_path, new_path)
        source = await self._resolve(old_path)
        if source is None:
            raise NotFound(old_path)
        if new_path.startswith(old_path + "/"):
            raise Unsupported("cannot move a directory into itself", errno.EINVAL)
        target = await self._resolve(new_path)
        if target is not None and flags & RENAME_NOREPLACE:
            raise AlreadyExists(new_path)
        if source.kind is Kind.DIR:
            await self._rename_dir(source, target, new_path)
        else:
            await self._rename_file(source, target, new_path)
        self.owned.moved(old_path, new_path, is_dir=source.kind is Kind.DIR)

    async def _rename_file(self, source: Inode, target: Inode | None, new_path: str) -> None:
        if target is not None and target.kind is Kind.DIR:
            raise IsADirectory(new_path)
        async with self._lock(source):
            if source.local_only:
                # Never uploaded: a purely local rename; the upload goes to the new name
                # (a write-back file's journal record is rewritten to say so; a streaming
                # upload, which names its object up front, is abandoned).
                self._end_stream(source)
                if target is not None:
                    await self._drop_target(target, new_path)
                self.names.forget(new_path)
                self.inodes.move(source, new_path)
                await self._rename_records([source], durable=True)
                return
            staged = source.staged
            if staged is not None and staged.dirty:
                if staged.clobbered:
                    raise PreconditionFailed(source.path)
                await self._upload(source, self.names.file_object(source.path))
            target_generation = target.generation if target is not None else 0
            try:
                info = await self.bucket.copy(
                    self.names.file_object(source.path),
                    self.names.file_object(new_path),
                    source_generation=source.generation,
                    if_generation_match=target_generation,
                )
            except NotFound:
                raise PreconditionFailed(source.path) from None
            try:
                await self.bucket.delete(
                    self.names.file_object(source.path), if_generation_match=source.generation
                )
            except NotFound:
                pass
            if target is not None:
                target.unlinked = True
                self.inodes.detach(target)
            self._removed(source.path)
            self.names.learned(new_path, Found(False, info))
            self.inodes.move(source, new_path)
            source.generation = info.generation
            source.metageneration = info.metageneration
            if source.staged is not None:
                source.staged.base_generation = info.generation

    async def _drop_target(self, target: Inode, path: str) -> None:
        if target.generation:
            try:
                await self.bucket.delete(self.names.file_object(path))
            except NotFound:
                pass
        target.unlinked = True
        self.names.learned(path, None)
        self.inodes.detach(target)

    async def _rename_dir(self, source: Inode, target: Inode | None, new_path: str) -> None:
        if target is not None:
            if target.kind is not Kind.DIR:
                raise NotADirectory(new_path)
            await self.rmdir_path(target)
        async with contextlib.AsyncExitStack() as held:
            # Files never uploaded move with the directory as local state (their uploads
            # go to the new names); holding their locks keeps a background upload from
            # starting under the old name meanwhile. Others are uploaded, then copied.
            local: list[Inode] = []
            if source.staged is not None:  # its own placeholder is still a journal record
                await _hold(held, source.lock)
                if source.local_only:
                    local.append(source)
            for inode in sorted(self.inodes.below(source.path), key=lambda i: i.ino):
                if inode.staged is None or inode.unlinked:
                    continue
                await _hold(held, inode.lock)
                if inode.staged is None or inode.unlinked:
                    continue  # uploaded and let go while we waited for its lock
                if inode.local_only:
                    self._end_stream(inode)  # its upload named the old path
                    local.append(inode)
                elif inode.staged.dirty:
                    await self._sync_locked(inode)
            moves = self.journal.moves if self.journal is not None else None
            move = None
            if moves is not None:  # journaled: a crash from here on is finished at remount
                move = await trio.to_thread.run_sync(
                    moves.begin, self.names.dir_object(source.path), self.names.dir_object(new_path)
                )
            if moves is None or move is None:
                await self._rename_dir_objects(source, new_path)
                return
            _, finish = self._move_locally(source, new_path)
            await self._rename_records(local, durable=False)
        # The locks are let go: the objects are moved in the background (or here, in core
        # tests without a nursery).
        if self.spawn is None:
            await finish(move)
        else:
            self.spawn(finish, move)

    def _move_locally(
        self, source: Inode, new_path: str
    ) -> tuple[Moving, Callable[[Move], Awaitable[None]]]:
        """The mount's side of a background directory rename: the tree has its new names
        at once; files already in GCS read their old objects until they are moved. Returns
        the move and the task that moves the objects."""
        old_path = source.path
        old_prefix = self.names.dir_object(old_path)
        new_prefix = self.names.dir_object(new_path)
        placeholder_coming = source.local_only  # its journal record moves with it
        remote = {
            inode.ino: self._read_object(inode)
            for inode in self.inodes.below(old_path)
            if inode.kind is not Kind.DIR and inode.generation and not inode.unlinked
        }
        self._removed(old_path)
        self.names.forget(new_path, below=True)
        self.inodes.move(source, new_path)
        source.placeholder = True
        for inode in self.inodes.below(new_path):
            if inode.ino in remote:
                inode.remote = remote[inode.ino]
                self._remote_readers[inode.remote] = inode
        moving = Moving(old_path, new_path)
        self.pending_moves.add(moving)

        async def finish(move: Move) -> None:
            await self._finish_move(moving, move, old_prefix, new_prefix, placeholder_coming)

        return moving, finish

    def _object_moved(self, source: ObjectInfo, copy: ObjectInfo) -> None:
        """One object of a background rename is under its new name (its old one is deleted
        next): the inode reading it reads the copy from now on."""
        inode = self._remote_readers.pop(source.name, None)
        if inode is not None:
            self._moved_to(inode, copy)

    @staticmethod
    def _moved_to(inode: Inode, copy: ObjectInfo | None) -> None:
        if inode.remote is None:
            return
        inode.remote = None
        if copy is not None:  # the object under its new name is a new generation
            inode.generation = copy.generation
            inode.metageneration = copy.metageneration
            if inode.staged is not None:
                inode.staged.base_generation = copy.generation

    async def _finish_move(
        self, moving: Moving, move: Move, old_prefix: str, new_prefix: str, placeholder: bool
    ) -> None:
        """Move the objects of a renamed directory (retried until it works: the journal
        record stays until then, and a next mount would finish it), then let the mount
        forget the old names. Never raises: a background task."""
        delay = MOVE_RETRY_S
        attempt = 0
        while True:
            try:
                listing = await self.bucket.list(old_prefix, delimiter=None)
                if not placeholder and not any(o.name == old_prefix for o in listing.objects):
                    # An implicit directory: give the new one a placeholder either way.
                    await self.bucket.write_bytes(new_prefix, b"", if_generation_match=None)
                copies = await move_objects(
                    self.bucket,
                    listing.objects,
                    old_prefix,
                    new_prefix,
                    skip_existing=attempt > 0,
                    on_moved=self._object_moved,
                )
                break
            except Exception as err:  # exception groups included: nothing ends the daemon
                attempt += 1
                self.writeback_counts["move_errors"] += 1
                moving.tried(str(root_cause(err)))
                log.error(
                    "write-back: renaming gs://%s to %s failed, will retry in %.0f s: %s",
                    old_prefix,
                    new_prefix,
                    delay,
                    root_cause(err),
                )
                await trio.sleep(delay)
                delay = min(delay * 2, MAX_MOVE_RETRY_S)
        for inode in self.inodes.below(moving.destination):
            if inode.remote is not None:  # its object vanished meanwhile: reads say ESTALE
                self._moved_to(inode, copies.get(self.names.file_object(inode.path)))
        for name in [n for n in self._remote_readers if n.startswith(old_prefix)]:
            del self._remote_readers[name]
        assert self.journal is not None
        try:
            await trio.to_thread.run_sync(self.journal.moves.end, move)
        except OSError as err:  # replayed at the next mount: finds nothing left to move
            log.warning("write-back: could not drop the record of a finished rename: %s", err)
        self.names.forget(moving.source, below=True)
        self.names.forget(moving.destination, below=True)
        self.pending_moves.remove(moving)
        moving.tried(None)

    async def _rename_records(self, inodes: list[Inode], *, durable: bool) -> None:
        """Point the journal records of moved write-back files at their new names, in one
        thread. A file's own rename is ``durable`` (nothing else would redo it after a
        machine crash); a directory's is not: a record that a crash takes back to its old
        name is moved by the directory's journaled rename, which the next mount finishes
        after the uploads, and an fsync per file made renaming an Orbax step take seconds."""
        journal = self.journal
        if journal is None:
            return
        records = [
            self._record(inode)
            for inode in inodes
            if inode.staged is not None and inode.staged.committed
        ]

        def rewrite() -> None:
            for record in records:
                journal.write_record(record, durable=durable)

        if records:
            await trio.to_thread.run_sync(rewrite)

    async def _rename_dir_objects(self, source: Inode, new_path: str) -> None:
        old_prefix = self.names.dir_object(source.path)
        new_prefix = self.names.dir_object(new_path)
        objects = await self.names.list_below(source.path)
        descendants = [o for o in objects if o.name != old_prefix]
        if self.journal is None and len(descendants) > self.settings.rename_dir_limit:
            raise TooManyObjects(
                f"{source.path}: {len(descendants)} objects > rename-dir-limit "
                f"{self.settings.rename_dir_limit}"
            )
        if not source.local_only and not any(o.name == old_prefix for o in objects):
            # An implicit directory: give the new one a placeholder so it exists either way.
            # (A directory made here has one coming: its journal record moves with it.)
            await self.bucket.write_bytes(new_prefix, b"", if_generation_match=None)
        copies = await move_objects(self.bucket, objects, old_prefix, new_prefix)
        self._removed(source.path)
        self.names.forget(new_path, below=True)
        self.inodes.move(source, new_path)
        source.placeholder = True
        for inode in self.inodes.below(new_path):
            copy = copies.get(self.names.file_object(inode.path))
            if copy is not None and inode.kind is not Kind.DIR:
                # The object under its new name is a new generation: writes continue from it.
                inode.generation = copy.generation
                inode.metageneration = copy.metageneration
                if inode.staged is not None:
                    inode.staged.base_generation = copy.generation

    async def rmdir_path(self, inode: Inode) -> None:
        parent = self.inodes.current(inode.parent_path)
        if parent is None:
            raise NotFound(inode.parent_path)
        await self.rmdir(parent.ino, inode.name)

    def statistics(self) -> dict[str, object]:
        """Everything `tierfs stats` shows: GCS requests and bytes, tiers, metadata cache."""
        return {
            "gcs": self.bucket.statistics(),
            "data": self.blocks.statistics(),
            "metadata_cache": self.metadata.statistics(),
            "directories": dict(self.dir_counts),
            "passthrough": self.backings.statistics(),
            "inodes": len(self.inodes),
            "open_files": len(self.files),
            "staging_errors": self.staging_errors,
            "write_requests": self.write_requests,
            "flushes_held": self.flushes_held,
            "writeback": {
                "enabled": self.journal is not None,
                "pending": self.pending_uploads(),
                "failing": len(self._failed),
                "moving": sum(1 for _ in self.pending_moves),
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

    async def sync_all(self, path: str = "", *, moves: bool = True) -> None:
        """Upload every dirty file now (``tierfs sync``, unmount, SIGTERM), write-back ones
        included; only ``path`` and what is below it, if given; SYNC_UPLOADS at a time (a
        save of small files is request latency, one by one it took 6 ms a file). Errors
        are raised after trying all: the first, with how many failed."""
        failures: list[Exception] = []
        limit = trio.CapacityLimiter(SYNC_UPLOADS)

        async def one(inode: Inode) -> None:
            staged = inode.staged
            large = staged is not None and staged.size > LARGE_UPLOAD_BYTES
            try:
                async with limit, self._large_uploads if large else contextlib.nullcontext():
                    await self._sync(inode)
            except Exception as err:  # keep going: upload what can be uploaded
                failures.append(err)
            else:
                if inode.open_handles == 0:
                    self._retire(inode)

        async with trio.open_nursery() as nursery:
            for inode in list(self.inodes.by_ino.values()):
                if path and inode.path != path and not inode.path.startswith(path + "/"):
                    continue
                if inode.staged is not None and inode.staged.dirty and not inode.unlinked:
                    nursery.start_soon(one, inode)
        if len(failures) > 1:
            log.error("%d files could not be uploaded; the first: %s", len(failures), failures[0])
        if failures:
            raise failures[0]
        for moving in self.pending_moves.covering(path) if moves else []:
            await moving.wait()  # durable means moved too

    async def finish(self) -> None:
        """At unmount, while background tasks still run: upload every dirty file, let the
        SSD-tier copies of uploads finish, and seal what is whole, so that the next mount
        reads those files from local disk, directly. An upload error is logged, not raised:
        the daemon is going away either way (a write-back journal keeps the file)."""
        try:
            await self.sync_all(moves=False)  # unbounded: without write-back, nothing else has them
        except Exception as err:
            log.error("pending writes could not be uploaded: %s", err)
        with trio.move_on_after(MOVES_AT_UNMOUNT_S):  # these are journaled: bounded
            for moving in self.pending_moves:
                await moving.done.wait()
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

    def _removed(self, path: str) -> None:
        """``path`` is gone: forget it, and the directories that existed only through it.

        Implied directories (no placeholder) may vanish with their last object; the
        kernel would keep their names for the TTL, so they are dropped there too."""
        self.names.removed(path)
        parent = self.inodes.current(path.rsplit("/", 1)[0] if "/" in path else "")
        while parent is not None and parent.ino != ROOT_INO and not parent.placeholder:
            grand = self.inodes.current(parent.parent_path)
            if grand is None:
                break
            self.kernel_forget(grand.ino, parent.name)
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


async def _hold(held: contextlib.AsyncExitStack, lock: trio.Lock) -> None:
    """Take ``lock`` until ``held`` closes. A free lock is taken without a checkpoint: a
    rename holding the locks of thousands of files would otherwise let the uploader start
    on the ones it has not reached yet, which it would then have to copy."""
    try:
        lock.acquire_nowait()
    except trio.WouldBlock:
        await lock.acquire()
    held.callback(lock.release)
