"""`SsdTier`: the SSD file cache, persistent across unmount, crash and remount.

The tier below RAM and above GCS (DESIGN decisions 2, 3, 7, 9). Like gcsfuse's file
cache it lives in ``cache-dir``, is bounded by ``file-cache:max-size-mb`` (-1 = the
free space of that volume less a safety margin, see `capacity_for`), evicts least
recently used data first, honours ``include-regex`` / ``exclude-regex`` (matched
against ``bucket/name``; exclude wins) and keeps files 0600 and directories 0700.
Unlike gcsfuse's, it survives a remount: an object whose generation is unchanged is
served from disk with no GCS download.

Layout (format 3). One *data file* per object generation, holding the object's bytes
at their own offsets (sparse where blocks are missing), so that a complete object is a
plain copy of it: the kernel can read it directly (FUSE passthrough, see `passthrough`),
as it reads a local file. Beside it, one small *record* per cached block, and a *seal*
once the object is complete::

    <cache-dir>/tierfs-cache/v3/<sha256(bucket)[:16]>/<hh>/<h>.<generation>.<block_size>.data
                                                      .../<h>.<generation>.<block_size>.<index>
                                                      .../<h>.<generation>.<block_size>.seal

where ``h`` is the first 32 hex digits (128 bits) of sha256 of the UTF-8 object name
and ``hh`` its first two digits (256 fan-out directories). Every path component is
made of hex digits and decimal integers, so no object name (``../../etc/passwd``,
``/abs``, 1,024 bytes, newlines...) can reach outside the cache directory, and names
of any length fit. The index is rebuilt at start from file names and ``stat`` alone
(nothing is read): a block's length follows from its index and the data file's size
(every block of an object but its last is full). The block size is part of the names
because a block index means different bytes under another ``ram-cache:block-size-mb``:
after such a change old blocks are never served, they just age out. Format 2 (one file
per block, header and payload) lived in ``tierfs-cache/<sha256(bucket)[:16]>``; `open`
deletes that directory.

The files' format (records, seals, names) is in `tierfs.cache.ssd_format`.

Accounting and invariants:

- Every block is accounted as its payload plus its record, each rounded up to the
  volume's fragment size (their real footprint; evicting a block punches its range out
  of the data file). ``used_bytes + pending_bytes <= capacity_bytes`` at every
  checkpoint: a put reserves its footprint first, evicting least recently used blocks
  (their ranges are released before the new one is written); a block whose footprint
  exceeds the capacity is not stored (the reader serves it from GCS). Directories and
  seals are not counted.
- ``max_entries`` bounds the in-memory index (about 300 bytes per block) whatever
  the capacity, so memory stays bounded even with many tiny blocks.
- A record exists under its final name iff its stem is in the index or is in
  ``_busy`` (being written or deleted right now); puts of a busy or present block
  are skipped (same key, same bytes: decision 2), and so are puts into an object whose
  data file is being deleted. Gets of an absent block miss without touching the disk.
- All blocking file I/O runs in ``trio.to_thread.run_sync`` under the given limiter,
  but for small reads of trusted blocks (`tierfs.cache.ssd_parts`: one ``pread`` is
  cheaper than the thread hop);
  threads get immutable inputs (paths, bytes, ints) and never touch the index, which
  is changed only on the trio thread, between checkpoints. The writes and deletes
  are shielded from cancellation so the index always learns their outcome.
- A failing disk is logged (WARNING on ``tierfs.cache``), counted in ``errors`` and
  treated as a miss or a skipped put; the tier never raises for lack of space.
- One live process per cache directory and bucket: the first to open it holds its lock
  (a file beside it) until it ends; a second mount of the bucket on the same cache-dir
  runs without the SSD tier, with a WARNING. (Sharing it, the second one's start-up
  scan deleted the first one's files in progress, and each one's evictions punched
  holes in blocks the other served: zeros.)
"""

from __future__ import annotations

import functools
import hashlib
import logging
import re
from collections import Counter, OrderedDict
from pathlib import Path

import trio

from tierfs.cache import BlockKey, Data, PieceKey
from tierfs.cache.buffers import pooled
from tierfs.cache.ssd_adopt import _Adopt
from tierfs.cache.ssd_budget import _Budget
from tierfs.cache.ssd_format import (
    _U64,
    AUTO,
    CACHE_DIR_NAME,
    DEFAULT_MAX_ENTRIES,
    FORMAT_DIR,
    FORMAT_VERSION,
    HEADER,
    MAGIC,
    _auto_capacity,
    _header,
    _name_bytes,
    _name_hash,
    _object_of,
    _round_up,
    _write_block,
    capacity_for,
    safety_margin,
)
from tierfs.cache.ssd_parts import PartFiles
from tierfs.cache.ssd_read import _Reads
from tierfs.cache.ssd_scan import CacheInUse, _prepare
from tierfs.cache.ssd_seals import SEAL, Passthrough, _Seals

__all__ = [
    "AUTO",
    "CACHE_DIR_NAME",
    "DEFAULT_MAX_ENTRIES",
    "FORMAT_VERSION",
    "HEADER",
    "MAGIC",
    "SEAL",
    "Passthrough",
    "SsdTier",
    "capacity_for",
    "safety_margin",
]

log = logging.getLogger("tierfs.cache")

# --- the tier ---------------------------------------------------------------------------


class SsdTier(_Reads, _Seals, _Adopt, _Budget):
    """Blocks in files under ``root``, LRU-evicted within ``max_bytes``, kept across mounts.

    ``max_bytes``: a byte count, 0 (disabled: nothing is created, every get misses)
    or `AUTO` (the volume's free space plus what the cache already holds, less
    `safety_margin`, measured by `open`; times ``auto_share``, less than 1 where a
    write-back journal shares the volume). ``block_size``: the chain's block size
    (part of every file name; a longer put is a ValueError). ``limiter``: bounds the
    worker threads (None: trio's default limiter). ``max_entries``: bounds the index.
    Call `open` (or build with `create`) before anything else.
    """

    name = "ssd"
    persistent = True  # whole objects kept across remounts, sealed, handed to the kernel

    def __init__(
        self,
        root: Path,
        bucket: str,
        max_bytes: int,
        *,
        block_size: int,
        include: re.Pattern[str] | None = None,
        exclude: re.Pattern[str] | None = None,
        limiter: trio.CapacityLimiter | None = None,
        max_entries: int = DEFAULT_MAX_ENTRIES,
        auto_share: float = 1.0,
    ) -> None:
        if max_bytes < AUTO:
            raise ValueError(f"SSD tier size must be -1, 0 or a byte count, not {max_bytes}")
        if not 0 < block_size < _U64:
            raise ValueError(f"block size must be positive, not {block_size}")
        if max_entries < 1:
            raise ValueError(f"max_entries must be positive, not {max_entries}")
        self.root = Path(root)
        self.bucket = bucket
        bucket_hash = hashlib.sha256(bucket.encode("utf-8", "surrogatepass")).hexdigest()[:16]
        self.directory = self.root / CACHE_DIR_NAME / FORMAT_DIR / bucket_hash
        self._old_directory = self.root / CACHE_DIR_NAME / bucket_hash
        self._requested_bytes = max_bytes
        self._max_bytes = max(max_bytes, 0)
        self._auto_share = auto_share  # of the space `AUTO` may take (a journal beside it)
        self._max_entries = max_entries
        self._block_size = block_size
        self._include = include
        self._exclude = exclude
        self._limiter = limiter
        self._fragment_bytes = 4096
        self._opened = False
        self._lock_fd = -1  # the directory's lock (`tierfs.cache.ssd_scan._lock`)
        self._index: OrderedDict[str, int] = OrderedDict()
        self._objects: dict[str, set[str]] = {}  # object -> its stems in the index
        self._by_name: dict[str, set[str]] = {}  # name hash -> its objects in the index
        self._busy: set[str] = set()
        self._busy_objects: set[str] = set()  # data files being deleted
        self._parts = PartFiles()  # descriptors for small reads on the trio thread
        self._trusted: set[str] = set()  # stems written or CRC-checked by this process
        self._sealed: set[str] = set()  # objects whose seal this process wrote or checked
        self._pins: Counter[str] = Counter()
        # Objects whose file was handed to the kernel (passthrough) and is not unlinked
        # since: a mapping made through it outlives the open's pin (`_drops`).
        self._handed: set[str] = set()
        self._writing: Counter[str] = Counter()  # objects with a put under way
        self._forgets = 0  # blocks ever forgotten: did the index change during an await?
        self._used_bytes = 0
        self._pending_bytes = 0
        self._hits = 0
        self._misses = 0
        self._corrupt = 0
        self._bytes_read = 0
        self._bytes_written = 0
        self._evictions = 0
        self._errors = 0
        self._warned: set[str] = set()  # kinds of disk failure already said at WARNING
        self._passthrough_opens = 0
        self._passthrough_bytes = 0
        self._seals = 0
        self._adopted = 0  # local files taken in whole (`adopt`), not copied
        self._same_device: dict[Path, bool] = {}  # directory -> on this tier's file system

    @classmethod
    async def create(
        cls,
        root: Path,
        bucket: str,
        max_bytes: int,
        *,
        block_size: int,
        include: re.Pattern[str] | None = None,
        exclude: re.Pattern[str] | None = None,
        limiter: trio.CapacityLimiter | None = None,
        max_entries: int = DEFAULT_MAX_ENTRIES,
        auto_share: float = 1.0,
    ) -> SsdTier:
        """A tier, opened."""
        tier = cls(
            root,
            bucket,
            max_bytes,
            block_size=block_size,
            include=include,
            exclude=exclude,
            limiter=limiter,
            max_entries=max_entries,
            auto_share=auto_share,
        )
        await tier.open()
        return tier

    async def open(self) -> None:
        """Create the directories and rebuild the index from the files already there.

        One thread does the walk (names and ``stat`` only). Temporary files a crash
        left are deleted; if the limit shrank since the last mount, the least recently
        used blocks are evicted now. Raises OSError if the directory cannot be made or
        read (a misconfigured ``cache-dir`` should fail the mount, not every read).
        """
        if self._opened:
            return
        if self._requested_bytes == 0:
            self._opened = True
            return
        try:
            scan = await trio.to_thread.run_sync(
                _prepare, self.root, self.directory, self._old_directory, limiter=self._limiter
            )
        except CacheInUse:
            log.warning(
                "SSD cache %s is used by another tierfs mount of gs://%s (a cache-dir serves "
                "one mount of a bucket at a time): this mount runs without it",
                self.directory,
                self.bucket,
            )
            self._requested_bytes = self._max_bytes = 0
            self._opened = True
            return
        self._lock_fd = scan.lock_fd
        self._fragment_bytes = scan.fragment_bytes
        for stem, length, record_size in scan.records:
            self._add(stem, self._footprint(length, record_size))
        if self._requested_bytes == AUTO:
            room = _auto_capacity(scan.total_bytes, scan.free_bytes, self._used_bytes)
            self._max_bytes = int(room * self._auto_share)
            if not self._max_bytes:
                log.warning(
                    "SSD cache %s: no free space left on its volume; the cache stores nothing",
                    self.directory,
                )
        drops = self._make_room(0)
        self._opened = True
        if scan.temporaries_removed:
            log.info(
                "SSD cache %s: removed %d unfinished files left by a crash",
                self.directory,
                scan.temporaries_removed,
            )
        if scan.old_format_removed:
            log.info("SSD cache: removed %s (an older cache format)", self._old_directory)
        if drops:
            await self._delete(drops)

    # -- Tier protocol -------------------------------------------------------------------

    def holds(self, key: BlockKey) -> bool:
        if not self._max_bytes or not self._wanted(key.name):
            return False
        return self._stem(_name_bytes(key.name), key) in self._index

    async def put(self, key: BlockKey, data: Data) -> None:
        self._check_open()
        if len(data) > self._block_size:
            raise ValueError(
                f"block {key.index} of {key.name!r} is {len(data)} bytes, "
                f"more than the block size {self._block_size}"
            )
        if not self._max_bytes or not self._wanted(key.name):
            return
        name = _name_bytes(key.name)
        stem = self._stem(name, key)
        obj = _object_of(stem)
        if stem in self._index:
            self._index.move_to_end(stem)
            return
        if stem in self._busy or obj in self._busy_objects:
            return
        size = self.footprint(key, len(data))
        if self._pending_bytes + size > self._max_bytes:
            return
        self._writing[obj] += 1  # from now on, making room punches this object's file
        drops = self._make_room(size)
        self._busy.add(stem)
        self._pending_bytes += size
        data = data if pooled(data) else bytes(data)  # (as the RAM tier: `pooled`)
        failures: list[tuple[Path, OSError]] = []
        stored = False
        try:
            with trio.CancelScope(shield=True):
                failures = await trio.to_thread.run_sync(
                    _write_block,
                    self._path(stem),
                    self._data_path(obj),
                    functools.partial(
                        _header, name, key.generation, key.index, self._block_size, data
                    ),
                    data,
                    key.index * self._block_size,
                    drops,
                    limiter=self._limiter,
                )
            stored = True
        except OSError as exc:
            self._failed("store", "cannot store %s: %s", self._describe(key), exc)
        finally:
            self._write_ended(obj, [stem], size, drops)
        self._count_delete_failures(failures)
        if stored:
            self._add(stem, size)
            self._trusted.add(stem)
            self._bytes_written += len(data)

    def get_piece(self, key: PieceKey) -> bytes | None:
        return None  # pieces of random reads stay in RAM (cache-file-for-range-read: whole files)

    def put_piece(self, key: PieceKey, data: bytes) -> None:
        return None

    async def discard(self, name: str, generation: int | None = None) -> None:
        self._check_open()
        name_hash = _name_hash(_name_bytes(name))
        objects = self._by_name.get(name_hash, ())
        prefix = f"{name_hash}." if generation is None else f"{name_hash}.{generation}."
        stems = [
            stem for obj in list(objects) if obj.startswith(prefix) for stem in self._objects[obj]
        ]
        for stem in stems:
            self._forget(stem)
        await self._delete(self._drops(stems, whole=True))

    async def fetching(self, key: BlockKey) -> None:
        return None  # no other node shares this tier

    async def fetched(self, key: BlockKey) -> None:
        pass

    def statistics(self) -> dict[str, int]:
        return {
            "hits": self._hits,
            "misses": self._misses,
            "corrupt": self._corrupt,
            "bytes_read": self._bytes_read,
            "bytes_written": self._bytes_written,
            "evictions": self._evictions,
            "used_bytes": self._used_bytes,
            "pending_bytes": self._pending_bytes,
            "capacity_bytes": self._max_bytes,
            "entries": len(self._index),
            "errors": self._errors,
            "seals": self._seals,
            "adopted": self._adopted,
            "passthrough_opens": self._passthrough_opens,
            "passthrough_bytes": self._passthrough_bytes,
            "slow_reads": self._parts.slow_reads,
        }

    # -- whole objects: seal and passthrough --------------------------------------------

    def footprint(self, key: BlockKey, length: int) -> int:
        """Bytes of cache a block of ``length`` payload bytes costs (its record included,
        each rounded up to the volume's fragment size)."""
        return self._footprint(length, HEADER.size + len(_name_bytes(key.name)))

    def _footprint(self, length: int, record_size: int) -> int:
        return _round_up(length, self._fragment_bytes) + _round_up(
            record_size, self._fragment_bytes
        )

    def path_of(self, key: BlockKey) -> Path:
        """Where the record of ``key`` lives (whether or not it is cached)."""
        return self._path(self._stem(_name_bytes(key.name), key))

    def data_path_of(self, name: str, generation: int) -> Path:
        """Where the data file of an object generation lives (whether or not it exists)."""
        return self._data_path(f"{_name_hash(_name_bytes(name))}.{generation}.{self._block_size}")

    def _check_open(self) -> None:
        if not self._opened:
            raise RuntimeError("SsdTier used before open()")

    def _wanted(self, name: str) -> bool:
        full = f"{self.bucket}/{name}"
        if self._exclude is not None and self._exclude.search(full):
            return False
        return self._include is None or bool(self._include.search(full))

    def _stem(self, name: bytes, key: BlockKey) -> str:
        if not (0 <= key.generation < _U64 and 0 <= key.index < _U64):
            raise ValueError(f"generation and index must be unsigned 64-bit integers: {key}")
        return f"{_name_hash(name)}.{key.generation}.{self._block_size}.{key.index}"

    def _path(self, stem: str) -> Path:
        return self.directory / stem[:2] / stem

    def _data_path(self, obj: str) -> Path:
        return self.directory / obj[:2] / f"{obj}.data"

    def _seal_path(self, obj: str) -> Path:
        return self.directory / obj[:2] / f"{obj}.seal"

    def _describe(self, key: BlockKey) -> str:
        return f"block {key.index} of {key.name!r} (generation {key.generation})"

    def _failed(self, kind: str, message: str, *args: object) -> None:
        """A disk failure: counted (``errors`` in `tierfs stats`) and said (see `_say`)."""
        self._errors += 1
        self._say(kind, message, *args)

    def _say(self, kind: str, message: str, *args: object) -> None:
        """The first failure of each kind at WARNING, the rest at DEBUG: a full or broken
        disk fails every block, and one line tells the user as much as thousands."""
        if kind in self._warned:
            log.debug("SSD cache: " + message, *args)
            return
        self._warned.add(kind)
        log.warning(
            "SSD cache: " + message + " (further failures: 'errors' in tierfs stats)", *args
        )
