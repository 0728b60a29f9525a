"""Object data in blocks, through the tiers, with shared and parallel downloads.

`Blocks` answers "block i of generation g of object n": from the fastest tier
holding it (copying a hit up to the faster tiers), else from GCS with one
ranged read, stored into every tier. Concurrent requests for one block share
one download (an in-flight table), so two readers of a file, or a reader and
the prefetcher, never fetch the same bytes twice. Downloads across the whole
mount are bounded by one limiter (``file-cache:max-parallel-downloads``).

`BlockReader` (`tierfs.core.blockreader`) serves one open file's reads from it.
Whole objects (a fill, an upload taken into the SSD tier, their seals and passthrough)
are `tierfs.core.wholeobjects`'; random reads, `tierfs.core.randomreads`'.

Tiers never call GCS; a tier that fails is logged and counted as a miss.
"""

from __future__ import annotations

import contextlib
import logging
import weakref
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import trio
from cachetools import LRUCache

from tierfs.cache import BlockKey, Data, Tier
from tierfs.cache.buffers import SPARE as SPARE_BUFFERS
from tierfs.cache.buffers import BlockBuffers
from tierfs.core.background import Spawn
from tierfs.core.keptlast import KeptLast
from tierfs.core.pace import Paces
from tierfs.core.randomreads import PIECE_BYTES, _RandomReads
from tierfs.core.wholeobjects import _WholeObjects
from tierfs.storage import Bucket

log = logging.getLogger("tierfs.blocks")

__all__ = ["DOWNLOAD_COPIES", "PIECE_BYTES", "Blocks", "Flight", "Memory"]

UNSEALED = 4096  # objects remembered for `Blocks.seal_pending`
NO_RAM_BUFFERS = 64  # block buffers kept without a RAM tier, if downloads are unbounded


# How many times the RAM tier counts a block while it downloads. The download itself is
# one copy (since 5eb8075 the bytes are read from the socket into one object: tracemalloc's
# peak during an 8 MiB `GcsBucket.read` is 8.07 MiB). It was 2, a margin kept from when
# the HTTP layer made a copy, which halved the downloads a full RAM tier lets run (a
# fill's lead keeps its own margin: `tierfs.core.pace.LEAD_WEIGHT`). Counted once, with
# read-ahead up to half the tier (`tierfs.settings.read_ahead_bytes`): cold reads on the
# shaped link, bench cells in 4 alternating rounds, 765 / 676 / 691 / 614 against 802 /
# 834 / 802 / 731 MB/s (no cache dir), 666 / 659 / 633 / 637 against 727 / 714 / 701 / 638
# (cache dir); fresh mounts in 4 alternating passes, medians 801 against 810 and 689
# against 690: a gain within the spread at best, no loss. Plain link and peak RSS alike.
DOWNLOAD_COPIES = 1


class Memory(Protocol):
    """Memory that downloads under way take from (`tierfs.cache.ram.RamTier`)."""

    @property
    def max_bytes(self) -> int: ...

    async def reserve(self, nbytes: int) -> None: ...

    def release(self, nbytes: int) -> None: ...

    def demote(self, key: BlockKey) -> None: ...

    def buffer_room(self, block_size: int) -> int: ...


@dataclass
class Flight:
    done: trio.Event = field(default_factory=trio.Event)  # the bytes are there (`data`)
    data: Data | None = None
    settled: trio.Event = field(default_factory=trio.Event)  # ... and stored in every tier
    error: Exception | None = None  # the fetch failed (not cancelled): its waiters fail too
    # The download's buffer and how much of it is filled, as it fills (`Blocks.get_part`):
    # set by its worker thread; ``watching`` readers want to be told (`progressed`).
    partial: tuple[memoryview, int] | None = None
    watching: int = 0
    progressed: trio.Event = field(default_factory=trio.Event)

    def finish(self) -> None:
        """The fetch is over (its bytes there, or failed): every waiter looks again."""
        self.done.set()
        self.wake()

    def wake(self) -> None:
        """Readers waiting for more of the block look again (in trio's thread)."""
        self.progressed.set()
        self.progressed = trio.Event()

    def covered(self, hi: int) -> memoryview | None:
        """The buffer under way if its first ``hi`` bytes have come, else None."""
        partial = self.partial
        return partial[0] if partial is not None and partial[1] >= hi else None


class Blocks(_RandomReads, _WholeObjects):
    """Blocks of objects from the tiers or GCS; one download per block at a time."""

    def __init__(
        self,
        bucket: Bucket,
        tiers: Sequence[Tier],
        *,
        block_size: int,
        downloads: trio.CapacityLimiter,
        per_file: int = 16,
        check_crc: bool = False,
        memory: Memory | None = None,
    ) -> None:
        self.bucket = bucket
        # The RAM tier, which downloads under way take their memory from (None: no bound
        # but the downloads limiter).
        self.memory = memory
        self.tiers = list(tiers)
        self.block_size = block_size
        self.downloads = downloads
        self.per_file = max(1, per_file)
        self.check_crc = check_crc
        self.piece_bytes = min(PIECE_BYTES, block_size)
        # Where downloaded blocks land: aligned, reused (`tierfs.cache.buffers`), as many
        # kept as the RAM tier has room for (`_buffers_kept`).
        self.buffers = BlockBuffers(block_size, keep=self._buffers_kept)
        self.kept_last = KeptLast()  # open files' last blocks (`tierfs.core.keptlast`)
        # Where block fetches run as tasks of their own (`get`): the mount's spawner, when
        # it runs (set by `Filesystem`); None, or None returned: in the reader's task.
        self.spawner: Callable[[], Spawn | None] | None = None
        self._inflight: dict[BlockKey, Flight] = {}
        self._filling: set[tuple[str, int]] = set()
        # Where each object's readers are, which its fill keeps pace with.
        ram = memory.max_bytes if memory is not None else 0
        self.paces = Paces(ram, block_size)
        # Whole objects brought in but maybe not sealed yet (an unmount may cut the
        # seal short): `seal_pending` seals what is complete on the way out.
        self._unsealed: LRUCache[tuple[str, int], int] = LRUCache(maxsize=UNSEALED)
        self.gcs_blocks = 0
        self.gcs_ranges = 0
        self.gcs_bytes = 0
        self.random_reads = 0  # reads taken for random (not where the reader's last ended)
        self.shared_waits = 0
        self.early_reads = 0  # reads answered from a block still downloading (`get_part`)
        self.fills = 0
        self.crc_mismatches = 0
        self.stored_local = 0
        self.tier_errors = 0
        self.fill_errors = 0  # background fills that failed (not counting changed objects)
        self.fill_unread_waits = 0  # fill workers held while nobody read the object
        self.read_ahead = 0  # blocks a sequential reader's read-ahead asked for
        self.read_ahead_unread = 0  # ... that its open file closed without reading
        # Open files reading ahead, with when each last read, which share how far ahead
        # they go (`tierfs.core.blockreader.BlockReader._plan`).
        self.reading_ahead: weakref.WeakKeyDictionary[object, float] = weakref.WeakKeyDictionary()

    def _buffers_kept(self) -> int:
        """Block buffers to keep mapped: as many as the RAM tier has room for; without one,
        as many as downloads may run at once (each needs one, then lets it go)."""
        if self.memory is None:
            return int(min(self.downloads.total_tokens, NO_RAM_BUFFERS))
        return self.memory.buffer_room(self.block_size) + SPARE_BUFFERS

    def went_past(self, key: BlockKey) -> None:
        """A sequential reader has gone past this block: the RAM tier evicts it first, before
        the blocks a fill brought ahead of their readers (`tierfs.cache.ram`)."""
        if self.memory is not None:
            self.memory.demote(key)

    def blocks_of(self, size: int) -> int:
        return (size + self.block_size - 1) // self.block_size

    async def get(self, key: BlockKey, object_size: int) -> Data:
        """The block's bytes (short for the last block of an object). With a `spawner`
        (a mount), the fetch runs as a task of its own, which the reader waits for: a reader
        interrupted (FUSE INTERRUPT of a killed process) leaves it, and the download ends,
        lands in the tiers and gives back its memory when it is done. (Run in the reader's
        task, it was cancelled with it: its thread, abandoned, went on filling an 8 MiB
        buffer whose room in the RAM tier was already given back: 16 interrupted readers
        at the defaults put 256 MiB outside the tier's budget.)"""
        while True:
            flight = self._join(key, object_size)
            if flight is None:
                return await self._fetch(key, object_size)
            await flight.done.wait()
            if (data := _outcome(flight)) is not None:
                return data
            # That fetch was cancelled (its reader interrupted): ours to make.

    async def get_part(
        self, key: BlockKey, object_size: int, lo: int, hi: int, coming: Flight | None = None
    ) -> tuple[Data, bool, Flight | None]:
        """Bytes [lo, hi) of the block as soon as they have come: (the bytes, whether they
        are the whole block, which the caller then slices, and the download they are
        coming from when they are only that part).

        Why: a block is 8 MiB and the kernel asks for at most 1 MiB; waiting for a whole
        block before answering the first read of a file cost a link of 200 MB/s per
        connection 42 ms of its 64 ms to the first byte (shaped bench link, 8 MiB
        blocks). A download under way tells how far its buffer is filled
        (`tierfs.storage.Progress`); a read of its start is answered from that buffer.

        ``coming``: the download an earlier part came from (the reader keeps it). The
        rest is asked of it even once it has ended and left the table: a RAM tier with
        no room left kept no copy, and the reader downloaded the block again (a prefetch
        into a 20 MiB tier read 32 MiB for 16)."""
        while True:
            flight = coming if coming is not None else self._join(key, object_size)
            coming = None
            if flight is None:
                return await self._fetch(key, object_size), True, None
            flight.watching += 1
            try:
                while not flight.done.is_set():
                    buffer = flight.covered(hi)
                    if buffer is not None:
                        self.early_reads += 1
                        return buffer[lo:hi], False, flight
                    await flight.progressed.wait()
            finally:
                flight.watching -= 1
            if (data := _outcome(flight)) is not None:
                return data, True, None
            # That fetch was cancelled (its reader interrupted): look again.

    def _join(self, key: BlockKey, object_size: int) -> Flight | None:
        """The fetch of ``key`` under way (a shared wait), else one started as a task of
        its own (`_start`); None without a spawner: the caller fetches in its own task."""
        flight = self._inflight.get(key)
        if flight is not None:
            self.shared_waits += 1
            return flight
        if self.spawner is None or self.spawner() is None:
            return None
        self._start(key, object_size)
        return self._inflight[key]

    def _start(self, key: BlockKey, object_size: int) -> None:
        """Start fetching ``key`` as a task of its own (`get`), registered in flight."""
        spawn = self.spawner() if self.spawner is not None else None
        assert spawn is not None
        flight = self._inflight[key] = Flight()
        spawn(self._fetch_for_readers, key, object_size, flight)

    async def _fetch_for_readers(self, key: BlockKey, object_size: int, flight: Flight) -> None:
        """`_fetch` as a task of its own (`get`): its failure is its readers' (``flight``)."""
        with contextlib.suppress(Exception):
            await self._fetch(key, object_size, flight)

    async def _fetch(self, key: BlockKey, object_size: int, flight: Flight | None = None) -> Data:
        """From the tiers, else GCS; registered in flight throughout, so that a reader that
        catches up with the prefetcher waits for its read (of the SSD tier too) instead of
        reading the same block file a second time."""
        if flight is None:
            flight = self._inflight[key] = Flight()
        try:
            data = await self._from_tiers(key)
            if data is None:
                data = await self._download(key, object_size, flight)
            flight.data = data
            return data
        except Exception as err:
            flight.error = err
            raise
        finally:
            del self._inflight[key]
            # (a failed download's buffer is not held on: its error's frames refer to
            # the flight, a cycle only a full collection would free)
            flight.partial = None
            flight.finish()
            flight.settled.set()

    async def fetches_settled(self) -> None:
        """Until the fetches under way now have stored their blocks in every tier (at
        unmount: a reader has its block before the SSD and shared tiers do, `get`)."""
        for flight in list(self._inflight.values()):
            await flight.settled.wait()

    async def _settled(self, key: BlockKey) -> None:
        """Until a fetch of ``key`` under way has also stored it in the slower tiers (its
        readers had it before: `_download`)."""
        flight = self._inflight.get(key)
        if flight is not None:
            await flight.settled.wait()

    async def cached(self, key: BlockKey, object_size: int) -> Data | None:
        """The block if a tier holds it (or a download of it is under way), else None."""
        data = await self._from_tiers(key)
        if data is None and key in self._inflight:
            return await self.get(key, object_size)
        return data

    async def _from_tiers(self, key: BlockKey) -> Data | None:
        for level, tier in enumerate(self.tiers):
            try:
                data = await tier.get(key)
            except Exception as err:  # a failing tier is a miss, never the user's error
                self.tier_errors += 1
                log.warning("%s tier failed to read %s: %s", tier.name, key, err)
                continue
            if data is not None:
                for faster in self.tiers[:level]:
                    await self._put(faster, key, data)
                if level:
                    self.buffers.trim()  # (the RAM tier took other memory: see `trim`)
                return data
        return None

    async def _download(self, key: BlockKey, object_size: int, flight: Flight) -> Data:
        """From GCS into every tier; first a tier shared with other nodes may claim the
        download (they wait for our copy) or hand over another node's (we wait for it).

        Readers waiting for the block (``flight``) have it as soon as it is downloaded: the
        slower tiers (SSD, shared) store it after, off their path. The RAM tier gets the
        block only once they have it, as before: stored there during the write as well, it
        counted twice (its copy and `_memory_for`'s), and eight slow readers at the
        defaults read 128 MiB back from the SSD tier, not 0-56
        (`test_fills_keep_eight_slow_readers_pace_at_the_defaults`). Cold read of 4 x 256
        MiB with a cache dir, default options (probe, plain, interleaved pairs), before
        against after: with the RAM tier's put early too 522 / 552 / 542 against 624 / 694
        / 637 MB/s; as it is, 515 / 522 / 582 against 502 / 608 / 544: no gain shown."""
        try:  # (a claim made is let go however this ends: a reader interrupted too)
            for level, tier in enumerate(self.tiers):
                try:
                    claimed = await tier.fetching(key)
                except Exception as err:
                    self.tier_errors += 1
                    log.warning("%s tier failed to claim %s: %s", tier.name, key, err)
                    continue
                if claimed is not None:
                    for faster in self.tiers[:level]:
                        await self._put(faster, key, claimed)
                    return claimed
            offset = key.index * self.block_size
            length = max(0, min(self.block_size, object_size - offset))
            ram = [tier for tier in self.tiers if tier is self.memory]
            slower = [tier for tier in self.tiers if tier is not self.memory]
            async with contextlib.AsyncExitStack() as stack:
                async with self.downloads:  # a download slot first, then its memory
                    release = await stack.enter_async_context(self._memory_for(length))
                    data = await self.bucket.read(
                        key.name,
                        generation=key.generation,
                        offset=offset,
                        length=length,
                        into=self.buffers.take_within,
                        progress=_telling(flight),
                    )
                self.gcs_blocks += 1
                self.gcs_bytes += len(data)
                release((DOWNLOAD_COPIES - 1) * length)  # the block alone from here
                flight.data = data
                flight.partial = None
                flight.finish()
                for tier in slower:  # while the reservation still counts the block
                    await self._put(tier, key, data)
            for tier in ram:  # where it now counts as itself (no await in between)
                await self._put(tier, key, data)
            return data
        finally:
            for tier in self.tiers:
                try:
                    await tier.fetched(key)
                except Exception as err:
                    self.tier_errors += 1
                    log.warning("%s tier failed to release %s: %s", tier.name, key, err)

    @contextlib.asynccontextmanager
    async def _memory_for(self, length: int) -> AsyncIterator[Callable[[int], None]]:
        """Room in the RAM tier for one download: its bytes `DOWNLOAD_COPIES` times.
        Yields a function to give part of it back early; the rest goes on the way out.
        `_download` holds one copy until the slower tiers (SSD, shared) have stored the
        block, and only then puts it in the RAM tier: a block the RAM tier evicted while the
        SSD tier still wrote it was in memory all the same, uncounted (a fill's 16 workers
        could hold 128 MiB that way; peak RSS in random reads with a cache dir was 372-388
        MiB, then 345-372)."""
        memory = self.memory
        held = DOWNLOAD_COPIES * length if memory is not None else 0

        def release(nbytes: int) -> None:
            nonlocal held
            nbytes = min(nbytes, held)
            if memory is not None and nbytes:
                memory.release(nbytes)
            held -= nbytes

        if memory is not None:
            await memory.reserve(held)
        try:
            yield release
        finally:
            release(held)

    async def _put(self, tier: Tier, key: BlockKey, data: Data) -> None:
        try:
            await tier.put(key, data)
        except Exception as err:
            self.tier_errors += 1
            log.warning("%s tier failed to store %s: %s", tier.name, key, err)

    def statistics(self) -> dict[str, Any]:
        return {
            "gcs_blocks": self.gcs_blocks,
            "gcs_ranges": self.gcs_ranges,
            "random_reads": self.random_reads,
            "gcs_bytes": self.gcs_bytes,
            "shared_waits": self.shared_waits,
            "reads_before_block_whole": self.early_reads,
            "whole_object_fills": self.fills,
            "fill_paced": self.paces.waits,
            "fill_pace_stops": self.paces.stops,
            "fill_unread_waits": self.fill_unread_waits,
            "read_ahead_blocks": self.read_ahead,
            "read_ahead_unread": self.read_ahead_unread,
            "crc_mismatches": self.crc_mismatches,
            "uploads_cached": self.stored_local,
            "tier_errors": self.tier_errors,
            "fill_errors": self.fill_errors,
            "block_buffers": self.buffers.statistics(),
            "tiers": {tier.name: tier.statistics() for tier in self.tiers},
        }


def _outcome(flight: Flight) -> Data | None:
    """An ended fetch's bytes; its error, raised (each waiter trying again in turn, each
    for a whole retry deadline, held a reader 2-3 times that); None if it was cancelled
    (its reader interrupted), so the waiter looks again."""
    if flight.data is not None:
        return flight.data
    if flight.error is not None:
        raise flight.error
    return None


def _telling(flight: Flight) -> Callable[[memoryview, int], None]:
    """The `tierfs.storage.Progress` of a download for ``flight``: called in the download's
    worker thread, it records how far the buffer is filled, and wakes the readers watching
    in trio's thread. (No wake-up when nobody watches: a reader counts itself in before it
    looks at ``partial``, and this looks at ``watching`` after setting it, so one of the
    two sees the other: both run under the GIL.)"""
    token = trio.lowlevel.current_trio_token()

    def told(buffer: memoryview, filled: int) -> None:
        flight.partial = (buffer, filled)
        if flight.watching:
            with contextlib.suppress(trio.RunFinishedError):
                token.run_sync_soon(flight.wake)

    return told
