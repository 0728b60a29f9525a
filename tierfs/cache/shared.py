"""`SharedTier`: a block tier on a directory several nodes share (NFS, Filestore, Lustre).

The last tier of the chain, below RAM and SSD and above GCS: when many nodes restore
one checkpoint at once, one of them fetches each block from GCS and publishes it
here, and the others read it from here (issue 19; gcsfuse's
``enable-experimental-shared-chunk-cache``). The files and their format are in
`tierfs.cache.shared_format`; this module is the tier's policy.

No coordinator, no lock between nodes beyond ``rename`` and ``O_EXCL``:

- *Whole or nothing*: a block is written under a temporary name and renamed into place;
  every read checks the header against the key, the length and the CRC32C. A torn or
  rotten file is counted (``corrupt``), deleted, and answered as a miss: the reader
  fetches the block from GCS again. Nothing unchecked is ever served.
- *One fetch for many readers*: before a block download, `fetching` creates the
  block's ``.fetching`` marker with ``O_EXCL`` (holding when it expires, now +
  ``marker_s``). A node that finds a live marker waits for the block, polling, at most
  ``wait_s`` and never past the marker's expiry, then fetches it itself. `fetched`
  removes our marker once the block is published (or the download failed).
- *Bounded*: each node keeps the directory within ``max_bytes`` by its own scans: after
  writing ``max_bytes / 16`` (or `SCAN_EVERY_S` after a write), it lists the files and,
  over the cap, unlinks the least recently used down to `LOW_WATER` of it. A hit sets
  the file's mtime at most once a minute, so recency costs one ``utime`` a minute per
  busy block. Two nodes evicting at once is safe: a file the other removed first is
  freed all the same, one read since the scan is kept, and a reader whose file vanished
  reads the copy it has open, or misses.
- *Never in the way*: every file operation runs in a worker thread under a time bound
  (``io_timeout_s``). A shared directory that is missing, read-only, full, failing or
  slow beyond the bound makes the tier step aside for ``retry_s`` (every get a miss,
  every put skipped, no I/O); the first time is logged at WARNING, later ones at DEBUG,
  the return at INFO. The mount goes on with its local tiers and GCS.

``holds`` answers from what this process has published or read here (no I/O): a block
another node published and this one never read is not known until a get finds it, and
a block another node evicted may still be "held" (then a get misses and the reader
fetches from GCS). Both only cost a miss.
"""

from __future__ import annotations

import errno
import hashlib
import logging
import math
import os
import re
import threading
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import trio
from cachetools import LRUCache

from tierfs.cache import BlockKey, Data, PieceKey
from tierfs.cache import shared_format as fmt
from tierfs.cache.shared_access import Access, Unavailable
from tierfs.cache.ssd_format import _U64, _name_bytes, _name_hash, safety_margin

__all__ = ["AUTO", "SharedTier"]

log = logging.getLogger("tierfs.cache")

AUTO = -1
"""``max_bytes``: the shared volume's free space plus what the tier holds, less a margin."""
SCAN_EVERY_S = 30.0
LOW_WATER = 0.9
KNOWN_KEYS = 1 << 16


class SharedTier:
    """Blocks in one file each under ``root`` (a shared directory), within ``max_bytes``.

    ``max_bytes``: a byte count, 0 (disabled) or `AUTO`. ``clock``: the wall clock the
    markers' expiry times are read against (shared by all nodes; tests pass trio's).
    ``limiter``: bounds the worker threads. Call `open` first (it never raises: an
    unreachable directory only makes the tier step aside)."""

    name = "shared"
    persistent = True  # takes copies of uploads; seals nothing, no passthrough

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
        clock: Callable[[], float] = time.time,
        io_timeout_s: float = 10.0,
        wait_s: float = 30.0,
        marker_s: float = 20.0,
        retry_s: float = 30.0,
        poll_s: float = 0.005,
        background: Callable[[Callable[[], Awaitable[None]]], bool] | None = None,
    ) -> None:
        if max_bytes < AUTO:
            raise ValueError(f"shared tier size must be -1, 0 or a byte count, not {max_bytes}")
        if not 0 < block_size < _U64:
            raise ValueError(f"block size must be positive, not {block_size}")
        self.root = Path(root)
        self.bucket = bucket
        bucket_hash = hashlib.sha256(bucket.encode("utf-8", "surrogatepass")).hexdigest()[:16]
        self.directory = self.root / fmt.SHARED_DIR_NAME / fmt.SHARED_FORMAT_DIR / bucket_hash
        self._requested_bytes = max_bytes
        self._max_bytes = math.inf if max_bytes == AUTO else float(max_bytes)
        self._block_size = block_size
        self._include = include
        self._exclude = exclude
        self._limiter = limiter
        self._clock = clock
        self._wait_s = wait_s
        self._marker_s = marker_s
        self._access = Access(
            self.directory, limiter=limiter, io_timeout_s=io_timeout_s, retry_s=retry_s
        )
        self._poll_s = poll_s
        self._background = background
        self._known: LRUCache[BlockKey, bool] = LRUCache(maxsize=KNOWN_KEYS)
        self._claims: dict[BlockKey, tuple[Path, float]] = {}  # marker, when it expires
        self._scanning = False
        self._last_scan = -math.inf
        self._written_since_scan = 0
        self._used_bytes = 0
        self._last_cap = self._max_bytes  # AUTO: as measured by the last listing
        self._scan_lock = threading.Lock()  # held by the scan running in a thread (`_scan`)
        self._counts = dict.fromkeys(
            (
                "hits", "misses", "corrupt", "bytes_read", "bytes_written", "puts_skipped",
                "evictions", "evicted_bytes", "waits", "wait_hits", "wait_timeouts",
                "stale_removed",
            ),
            0,
        )  # fmt: skip

    @property
    def _enabled(self) -> bool:
        return self._requested_bytes != 0

    async def open(self) -> None:
        """Make the per-bucket directory (0700) under ``root``, which must exist (a shared
        filesystem that is not mounted must not become a local directory). The first
        listing comes with the first writes (a big share takes a while to list)."""
        if not self._enabled:
            return
        try:
            await self._access.run("open", _make_tree, self.root, self.directory)
        except Unavailable:
            return

    # -- Tier protocol -------------------------------------------------------------------

    async def get(self, key: BlockKey) -> Data | None:
        if not self._usable(key):
            self._counts["misses"] += 1
            return None
        data = await self._read(key)
        self._counts["hits" if data is not None else "misses"] += 1
        return data

    def holds(self, key: BlockKey) -> bool:
        return self._usable(key) and key in self._known

    async def put(self, key: BlockKey, data: Data) -> None:
        if len(data) > self._block_size:
            raise ValueError(
                f"block {key.index} of {key.name!r} is {len(data)} bytes, "
                f"more than the block size {self._block_size}"
            )
        if not self._usable(key) or not data or len(data) > self._max_bytes:
            return
        if not self._access.writable():
            self._counts["puts_skipped"] += 1
            return
        name = _name_bytes(key.name)
        content = fmt.block_bytes(name, key.generation, key.index, self._block_size, data)
        try:
            with trio.CancelScope(shield=True):
                wrote = await self._access.run(
                    "store", fmt.write_block, self._path(key), self.root, content
                )
        except Unavailable:
            return
        self._known[key] = True
        if wrote:
            self._counts["bytes_written"] += len(data)
            self._written_since_scan += len(content)
            if self._due():
                # Listing a big share takes a while: not in the reader's time, if we can.
                if self._background is None or not self._background(self._evict_if_due):
                    await self._evict_if_due()

    async def discard(self, name: str, generation: int | None = None) -> None:
        """Delete the object's blocks here (a whole-object CRC32C mismatch): for every node."""
        if not self._enabled or not self._access.usable():
            return
        stem = _name_hash(_name_bytes(name))
        prefix = f"{stem}." if generation is None else f"{stem}.{generation}."
        for key in [k for k in self._known if k.name == name]:
            if generation is None or key.generation == generation:
                del self._known[key]
        try:
            await self._access.run("delete", _remove_prefixed, self.directory / stem[:2], prefix)
        except Unavailable:
            pass

    async def fetching(self, key: BlockKey) -> bytes | None:
        """About to fetch ``key`` from GCS: claim it (a marker), or, if another node has a
        live claim, wait for its copy (bounded); the block if it came, else None (fetch it,
        then call `fetched`)."""
        if not self._usable(key):
            return None
        marker = self._marker(key)
        if await self._claim(key, marker):
            # Another node may have published it and dropped its claim between our miss
            # and our claim: look once more before going to GCS.
            data = await self._read(key)
            if data is not None:
                self._miss_was_a_hit()
                await self.fetched(key)
            return data
        data = await self._wait(key, marker)
        # That fetch failed or expired: ours now, and others wait for us (unless the share
        # stepped aside meanwhile: a claim then only waited out one more bound, shielded).
        if data is None and self._access.usable():
            await self._claim(key, marker)
        return data

    def _miss_was_a_hit(self) -> None:
        """The block `get` missed came after all (published meanwhile, or waited for): one
        lookup, one hit (it counted as a miss and a hit)."""
        self._counts["hits"] += 1
        self._counts["misses"] = max(0, self._counts["misses"] - 1)

    async def _claim(self, key: BlockKey, marker: Path) -> bool:
        now = self._clock()
        expires_at = now + self._marker_s
        try:
            # Shielded (bounded by the I/O bound): a claim abandoned in its thread would
            # still make the marker, which nobody would then remove before it expires.
            with trio.CancelScope(shield=True):
                claimed = await self._access.run(
                    "claim", fmt.create_marker, marker, self.root, expires_at, now
                )
        except Unavailable:
            return False
        if claimed:
            self._claims[key] = (marker, expires_at)
        return claimed

    async def read_part(self, key: BlockKey, offset: int, length: int) -> bytes | None:
        return None  # another node's block is checked whole (`get`) before it is served

    def read_part_now(self, key: BlockKey, offset: int, length: int) -> bytes | None:
        return None  # a file read: never without waiting

    def get_piece(self, key: PieceKey) -> bytes | None:
        return None  # random reads' pieces stay in this node's RAM

    def put_piece(self, key: PieceKey, data: bytes) -> None:
        return None

    async def fetched(self, key: BlockKey) -> None:
        """The fetch `fetching` claimed is over (stored or failed): drop our marker."""
        claim = self._claims.pop(key, None)
        if claim is None:
            return
        try:
            with trio.CancelScope(shield=True):
                await self._access.run("claim", fmt.remove_marker, *claim)
        except Unavailable:
            pass  # it expires by itself

    async def seal(self, name: str, generation: int, size: int) -> bool:
        return False

    async def passthrough(self, name: str, generation: int, size: int) -> None:
        return None

    def takes_files_from(self, directory: Path) -> bool:
        return False  # keeps no whole objects

    async def adopt(self, source: Path, name: str, generation: int, size: int) -> bool:
        return False

    def unpin(self, pinned: object) -> None:
        pass

    def statistics(self) -> dict[str, int]:
        return {
            **self._counts,
            "errors": self._access.errors,
            "outages": self._access.outages,
            "used_bytes": self._used_bytes,
            "capacity_bytes": -1 if math.isinf(self._last_cap) else int(self._last_cap),
            "known_blocks": len(self._known),
            "unavailable": int(self._access.down()),
        }

    # -- reading and waiting ---------------------------------------------------------------

    async def _read(self, key: BlockKey) -> bytes | None:
        """The block from its file, checked; None if absent, damaged (then deleted) or the
        directory cannot be used."""
        name = _name_bytes(key.name)
        path = self._path(key)
        try:
            status, data = await self._access.run(
                "read",
                fmt.read_block,
                path,
                name,
                key.generation,
                key.index,
                self._block_size,
                time.time(),
            )
        except Unavailable:
            return None
        if status == fmt.OK:
            self._known[key] = True
            self._counts["bytes_read"] += len(data)
            return data
        self._known.pop(key, None)
        if status != fmt.MISSING:
            self._counts["corrupt"] += 1
            log.warning(
                "shared cache: block %d of %r (generation %d) is damaged (%s); deleted, "
                "it will be fetched again",
                key.index,
                key.name,
                key.generation,
                status,
            )
            try:
                await self._access.run(
                    "delete",
                    fmt.remove_damaged,
                    path,
                    name,
                    key.generation,
                    key.index,
                    self._block_size,
                )
            except Unavailable:
                pass
        return None

    async def _wait(self, key: BlockKey, marker: Path) -> bytes | None:
        """Another node claimed ``key``: poll for its copy until the marker goes or expires,
        or ``wait_s`` passes. The marker goes only after the block is published, so a
        marker seen gone then a block not there means that fetch failed."""
        self._counts["waits"] += 1
        deadline = trio.current_time() + self._wait_s
        delay = self._poll_s
        while True:
            try:  # one worker thread per poll: the marker, then whether the block is there
                expiry, there = await self._access.run("claim", fmt.poll, marker, self._path(key))
            except Unavailable:
                return None
            data = await self._read(key) if there else None
            if data is not None:
                self._counts["wait_hits"] += 1
                self._miss_was_a_hit()
                return data
            if expiry is None:
                return None  # that fetch failed: ours now
            if expiry <= self._clock() or trio.current_time() >= deadline:
                self._counts["wait_timeouts"] += 1
                return None
            await trio.sleep(min(delay, max(0.0, deadline - trio.current_time())))
            delay = min(delay * 2, 0.05)  # a block takes tens of ms: stay close

    # -- eviction ----------------------------------------------------------------------------

    async def _evict_if_due(self, *, force: bool = False) -> None:
        """Scan and evict when this node wrote a sixteenth of the cap since its last scan,
        or `SCAN_EVERY_S` passed since then and it wrote anything (other nodes write too:
        their share shows at the next scan)."""
        if self._scanning or not (force or self._due()):
            return
        self._scanning = True
        try:
            self._last_scan = trio.current_time()
            self._written_since_scan = 0
            listing = await self._access.run(
                "scan",
                self._scan,
                self.directory,
                time.time(),
                self._clock(),
                timeout_s=self._access.io_timeout_s * 6,
            )
            if listing is None:
                return  # the last one still runs
            self._counts["stale_removed"] += listing.stale_removed
            self._used_bytes = listing.used_bytes
            cap = self._last_cap = self._cap(listing)
            if listing.used_bytes <= cap:
                return
            excess = listing.used_bytes - int(cap * LOW_WATER)
            files, removed = await self._access.run(
                "evict", fmt.evict, listing.blocks, excess, timeout_s=self._access.io_timeout_s * 6
            )
            self._counts["evictions"] += files
            self._counts["evicted_bytes"] += removed
            self._used_bytes = max(0, self._used_bytes - removed)
        except Unavailable:
            pass
        finally:
            self._scanning = False

    def _scan(self, top: Path, now: float, marker_now: float) -> fmt.Listing | None:
        """`fmt.scan`, one at a time (in a worker thread): a scan abandoned past its bound
        goes on alone, and the next one waits for it to end rather than pile up beside
        it, each holding one of the tier's threads."""
        if not self._scan_lock.acquire(blocking=False):
            return None
        try:
            return fmt.scan(top, now, marker_now)
        finally:
            self._scan_lock.release()

    def _due(self) -> bool:
        """With the cap sized by the volume (AUTO), by the cap the last scan measured: by
        `_max_bytes` (infinite there) only the 30 s timer ever started a scan, and the
        nodes could write 30 s of blocks past the cap, into the volume's margin. Before a
        first scan has measured it, the first write starts one."""
        if self._scanning or not self._written_since_scan or self._scan_lock.locked():
            return False
        elapsed = trio.current_time() - self._last_scan
        cap = self._last_cap
        return math.isinf(cap) or self._written_since_scan >= cap / 16 or elapsed >= SCAN_EVERY_S

    def _cap(self, listing: fmt.Listing) -> float:
        if self._requested_bytes != AUTO:
            return self._max_bytes
        total, free = listing.total_bytes, listing.free_bytes
        return max(0, free + listing.used_bytes - safety_margin(total))

    # -- helpers ---------------------------------------------------------------------------

    def _usable(self, key: BlockKey) -> bool:
        if not self._enabled or not self._access.usable():
            return False
        full = f"{self.bucket}/{key.name}"
        if self._exclude is not None and self._exclude.search(full):
            return False
        return self._include is None or bool(self._include.search(full))

    def _stem(self, key: BlockKey) -> str:
        if not (0 <= key.generation < _U64 and 0 <= key.index < _U64):
            raise ValueError(f"generation and index must be unsigned 64-bit integers: {key}")
        name_hash = _name_hash(_name_bytes(key.name))
        return f"{name_hash}.{key.generation}.{self._block_size}.{key.index}"

    def _path(self, key: BlockKey) -> Path:
        stem = self._stem(key)
        return self.directory / stem[:2] / stem

    def _marker(self, key: BlockKey) -> Path:
        path = self._path(key)
        return path.with_name(path.name + fmt.MARKER_SUFFIX)

    def path_of(self, key: BlockKey) -> Path:
        """Where the file of ``key`` lives (whether or not it is there)."""
        return self._path(key)


def _make_tree(root: Path, directory: Path) -> None:
    """The per-bucket directory and its parents below ``root`` (which must exist), 0700."""
    if not root.is_dir():
        raise FileNotFoundError(errno.ENOENT, "no such directory (not mounted?)", str(root))
    fmt._ensure_dirs(directory / "x", root)
    probe = directory / f"{fmt._TMP_PREFIX}probe-{os.getpid()}"
    fmt._publish(probe, b"tierfs")  # can we write here at all?
    fmt.remove(probe)


def _remove_prefixed(fanout: Path, prefix: str) -> None:
    try:
        entries = list(os.scandir(fanout))
    except FileNotFoundError:
        return
    for entry in entries:
        if entry.name.startswith(prefix):
            fmt.remove(Path(entry.path))
