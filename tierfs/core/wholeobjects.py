"""Whole objects in `tierfs.core.blocks.Blocks`: a fill, an upload taken in, a seal.

A whole object fill (`fill`) brings an object into the cache with
``parallel-downloads-per-file`` workers (`UNREAD_WORKERS` while nobody has the object
open); ``enable-crc`` checks the CRC32C of a whole object so fetched against the one GCS
keeps, and drops the cached blocks on a mismatch. A file just uploaded goes into the
persistent tiers under its new generation (`store_local`, or `adopt_local`: renamed in,
not copied), so a restore after a remount reads the disk. A whole object in the SSD tier
is sealed (`_seal`), so that opens may read its file directly (FUSE passthrough). Part of
`Blocks`, sharing its state.
"""

from __future__ import annotations

import base64
import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import trio
from crc32c import crc32c as crc32c_of

from tierfs.cache import BlockKey
from tierfs.cache.ssd import Passthrough
from tierfs.errors import NotFound, root_cause

if TYPE_CHECKING:  # a part of Blocks, sharing its state
    from typing import Any as _Base
else:
    _Base = object

log = logging.getLogger("tierfs.blocks")

# Workers a fill keeps going while nobody reads its object (its readers closed it, as a
# loader reading each shard's header does): the daemon is one process (at one CPU in the
# probe), and its other readers share it with the fill's streams. Beside an unread fill
# of 1 GiB, a sequential reader of another file ran at 269-306 MB/s with all 16 workers
# going on (p99 read 97-141 ms; 601-878 alone), at 363-558 with 4 (p99 19-53 ms; probe
# `contend`, cache dir, emulator, 4 interleaved pairs). The others wait, and go on when a
# reader opens the object again.
UNREAD_WORKERS = 4


class _WholeObjects(_Base):
    """fill, store_local, adopt_local, seals and passthrough of `Blocks`."""

    async def store_local(
        self,
        fd: int,
        name: str,
        generation: int,
        size: int,
        unchanged: Callable[[], bool],
    ) -> None:
        """Put a just-uploaded local file into the persistent tiers under its new generation,
        so a restore after a remount reads the disk, not GCS. ``unchanged`` says whether the
        file still holds exactly what was uploaded; if it stops doing so, the copy is dropped.
        """
        persistent = [tier for tier in self.tiers if tier.persistent]
        if not persistent:
            return
        for index in range(self.blocks_of(size)):
            offset = index * self.block_size
            length = min(self.block_size, size - offset)
            data = await trio.to_thread.run_sync(os.pread, fd, length, offset)
            if len(data) != length or not unchanged():
                for tier in persistent:
                    await tier.discard(name, generation)
                return
            for tier in persistent:
                await self._put(tier, BlockKey(name, generation, index), data)
        self.stored_local += 1
        self._unsealed[(name, generation)] = size
        await self._seal(name, generation, size)

    def adopts_from(self, directory: Path) -> bool:
        """Whether a just-uploaded file in ``directory`` can be taken into the persistent
        tier whole (`adopt_local`: renamed, not copied). Only with one persistent tier (the
        SSD tier, on the same file system): a second one (a shared tier) needs a copy."""
        persistent = [tier for tier in self.tiers if tier.persistent]
        return len(persistent) == 1 and persistent[0].takes_files_from(directory)

    async def adopt_local(self, source: Path, name: str, generation: int, size: int) -> bool:
        """Take the local file ``source``, which holds exactly the bytes of this object
        generation (just uploaded from it), into the persistent tier and seal it: a restore
        after a remount reads it from disk. Whether it did; if not, ``source`` may still be
        there (the caller's to delete)."""
        for tier in self.tiers:
            if not tier.persistent:
                continue
            try:
                adopted = await tier.adopt(source, name, generation, size)
            except Exception as err:
                self.tier_errors += 1
                log.warning("%s tier failed to take in gs://%s: %s", tier.name, name, err)
                return False
            if adopted:
                self.stored_local += 1
                self._unsealed[(name, generation)] = size
                await self._seal(name, generation, size)
            return adopted
        return False

    async def fill(self, name: str, generation: int, size: int, crc32c: str | None) -> None:
        """Bring a whole object into the tiers with up to ``per_file`` parallel downloads."""
        job = (name, generation)
        if job in self._filling:
            return
        self._filling.add(job)
        self._unsealed[job] = size
        self.fills += 1
        try:
            # The persistent tiers (SSD, shared) are where the object is meant to end up
            # (else the slowest); blocks they all hold already are not read at all (reading
            # a cached object whole into RAM would only push out the blocks its reader is
            # about to use).
            keep = [tier for tier in self.tiers if tier.persistent] or self.tiers[-1:]
            keys = [BlockKey(name, generation, i) for i in range(self.blocks_of(size))]
            missing = [key for key in keys if not all(tier.holds(key) for tier in keep)]
            todo = iter(missing)
            idle: set[trio.CancelScope] = set()  # workers waiting for a reader to come
            exhausted = False

            async def unread() -> None:
                """While nobody reads the object, until the blocks run out."""
                while not exhausted and not self.paces.reading(job):
                    self.fill_unread_waits += 1
                    with trio.CancelScope() as scope:
                        idle.add(scope)
                        await self.paces.readers_back(job)
                    idle.discard(scope)

            async def worker(index: int) -> None:
                nonlocal exhausted
                for key in todo:
                    await self.paces.keep(job, key.index)
                    data = await self.get(key, size)
                    # A reader's fetch handed us the block before its SSD write ended: the
                    # seal below needs the block there, and our own put would be skipped.
                    await self._settled(key)
                    for tier in keep:
                        if not tier.holds(key):  # a hit in another tier: store it here too
                            await self._put(tier, key, data)
                    # Let the block go before waiting for the readers' pace: held here, a
                    # block the RAM tier evicts stays in memory, uncounted, one per worker.
                    del data
                    if index >= UNREAD_WORKERS:
                        await unread()
                exhausted = True
                for scope in idle:  # (no block left for them)
                    scope.cancel()

            async with trio.open_nursery() as nursery:
                for index in range(min(self.per_file, len(keys))):
                    nursery.start_soon(worker, index)
            if self.check_crc and crc32c and missing:
                await self._verify(name, generation, size, crc32c)
            await self._seal(name, generation, size)
        except Exception as err:  # a background task: exception groups included
            cause = root_cause(err)
            if isinstance(cause, NotFound):
                log.debug("gs://%s#%d changed while being cached", name, generation)
            else:  # a fill that fails is only a miss later; the reader gets its own error
                self.fill_errors += 1
                log.warning("could not cache gs://%s#%d: %s", name, generation, cause)
        finally:
            self._filling.discard(job)
            self.paces.done(job)

    async def seal_pending(self) -> None:
        """Seal the whole objects brought in whose seal a fill did not get to (at unmount)."""
        for (name, generation), size in list(self._unsealed.items()):
            await self._seal(name, generation, size)

    async def _seal(self, name: str, generation: int, size: int) -> None:
        """Let a tier that keeps whole objects (the SSD tier) seal this one, so that later
        opens, after a remount too, may read its file directly (FUSE passthrough)."""
        for tier in self.tiers:
            try:
                if await tier.seal(name, generation, size):
                    self._unsealed.pop((name, generation), None)
            except Exception as err:
                self.tier_errors += 1
                log.warning("%s tier failed to seal gs://%s: %s", tier.name, name, err)

    async def passthrough(self, name: str, generation: int, size: int) -> Passthrough | None:
        """A pinned whole-object file the kernel may read directly (see `SsdTier.passthrough`),
        or None. Release it with `unpin`."""
        for tier in self.tiers:
            try:
                pinned = await tier.passthrough(name, generation, size)
            except Exception as err:
                self.tier_errors += 1
                log.warning("%s tier failed to open gs://%s: %s", tier.name, name, err)
                continue
            if pinned is not None:
                return pinned
        return None

    def unpin(self, pinned: Passthrough) -> None:
        for tier in self.tiers:
            tier.unpin(pinned)

    def filling(self, name: str, generation: int) -> bool:
        return (name, generation) in self._filling

    async def _verify(self, name: str, generation: int, size: int, expected: str) -> None:
        crc = 0
        for index in range(self.blocks_of(size)):
            crc = crc32c_of(await self.get(BlockKey(name, generation, index), size), crc)
        if base64.b64encode(crc.to_bytes(4, "big")).decode() != expected:
            self.crc_mismatches += 1
            log.error("CRC32C mismatch for gs://%s#%d: cached copy dropped", name, generation)
            for tier in self.tiers:
                await tier.discard(name, generation)
