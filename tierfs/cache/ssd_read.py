"""The SSD tier's reads: a whole block, checked against its CRC32C, or part of one.

Why two: a sequential reader takes whole blocks, and each is checked as it is read, so
a block damaged on disk is fetched again, never served. A random reader wants 4 KiB of
an 8 MiB block; reading and checking the whole block for it capped random reads of a
cached object at about 500 a second. A part is read alone only from a block this
process wrote or has checked whole (`_trusted`), the same bytes the check vouched for.
Part of `tierfs.cache.ssd.SsdTier`, sharing its state.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import trio

from tierfs.cache import BlockKey
from tierfs.cache.ssd_format import (
    _MISSING,
    _OK,
    _name_bytes,
    _object_of,
    _read_block,
    _read_part,
)
from tierfs.cache.ssd_parts import INLINE_BYTES

if TYPE_CHECKING:  # a part of SsdTier, sharing its state
    from typing import Any as _Base
else:
    _Base = object

log = logging.getLogger("tierfs.cache")


class _Reads(_Base):
    """get, read_part(_now) and _read of `SsdTier`."""

    async def get(self, key: BlockKey) -> bytes | None:
        self._check_open()
        if not self._max_bytes or not self._wanted(key.name):
            self._misses += 1
            return None
        name = _name_bytes(key.name)
        stem = self._stem(name, key)
        if stem not in self._index:
            self._misses += 1
            return None
        self._index.move_to_end(stem)
        for _attempt in range(2):
            forgets = self._forgets
            status, data = await self._read(stem, name, key)
            if status == _OK or self._forgets == forgets:
                break
            # Blocks were dropped while we read: ours may have been punched out (and put
            # back) under us. That is no damage: read again if it is back, else a miss.
            if stem not in self._index:
                self._misses += 1
                return None
        if status == _OK:
            self._hits += 1
            self._bytes_read += len(data)
            if stem in self._index:
                self._trusted.add(stem)
            return data
        self._misses += 1
        if status.startswith("unreadable"):
            self._say("read", "cannot read %s (%s); deleted", self._describe(key), status)
        elif status != _MISSING:
            self._corrupt += 1
            log.warning(
                "SSD cache: %s is damaged (%s); deleted, it will be fetched again",
                self._describe(key),
                status,
            )
        if stem in self._index:
            self._forget(stem)
            # Without a data file of ours, no block of the object can be served.
            await self._delete(self._drops([stem], whole=status.startswith("data file")))
        return None

    def read_part_now(self, key: BlockKey, offset: int, length: int) -> bytes | None:
        """`read_part`'s answer when it is read on the trio thread (`tierfs.cache.ssd_parts`:
        from the page cache, or one small pread): no wait for a worker thread. None on any
        doubt, and `read_part` reads it again (and counts a failure once). A part larger
        than `INLINE_BYTES` is left to `read_part` at once: it may need a worker thread, and
        trying here first would allocate and try it twice."""
        self._check_open()
        if length > INLINE_BYTES:
            return None
        at = self._part_at(key, offset)
        if at is None:
            return None
        stem, obj, position = at
        try:
            data = self._parts.read(obj, self._data_path, position, length)
        except OSError:
            return None
        if data is None or len(data) != length:
            return None
        return self._part_served(stem, data)

    async def read_part(self, key: BlockKey, offset: int, length: int) -> bytes | None:
        """Bytes of a block this process wrote or checked (`_trusted`), read alone: a
        random 4 KiB read costs one pread, not the block's 8 MiB and its CRC (measured: 500
        random reads a second of a cached 1 GiB object, each reading its whole block). A
        block from an earlier mount is checked whole once first (`get`), as the kernel's
        passthrough reads of a sealed file are not checked at all."""
        self._check_open()
        at = self._part_at(key, offset)
        if at is None:
            return None
        stem, obj, position = at
        forgets = self._forgets
        try:
            # On the trio thread first (`tierfs.cache.ssd_parts`): nothing awaits between
            # the index check above and this read, so the block cannot be dropped under it.
            data = self._parts.read(obj, self._data_path, position, length)
            if data is None:
                data = await trio.to_thread.run_sync(
                    _read_part, self._data_path(obj), position, length, limiter=self._limiter
                )
        except OSError as exc:
            self._errors += 1
            log.debug("SSD cache: cannot read part of %s: %s", self._describe(key), exc)
            return None
        # Dropped while we read: its range may have been punched out (zeros), so no answer.
        if data is None or len(data) != length or self._forgets != forgets:
            return None
        return self._part_served(stem, data)

    def _part_at(self, key: BlockKey, offset: int) -> tuple[str, str, int] | None:
        """(record stem, data file, position in it) of a part `read_part` may read alone."""
        if not self._max_bytes or not self._wanted(key.name):
            return None
        stem = self._stem(_name_bytes(key.name), key)
        if stem not in self._index or stem not in self._trusted:
            return None
        return stem, _object_of(stem), key.index * self._block_size + offset

    def _part_served(self, stem: str, data: bytes) -> bytes:
        if stem in self._index:
            self._index.move_to_end(stem)
        self._hits += 1
        self._bytes_read += len(data)
        return data

    async def _read(self, stem: str, name: bytes, key: BlockKey) -> tuple[str, bytes]:
        try:
            return await trio.to_thread.run_sync(
                _read_block,
                self._path(stem),
                self._data_path(_object_of(stem)),
                name,
                key.generation,
                key.index,
                self._block_size,
                limiter=self._limiter,
            )
        except OSError as exc:
            self._errors += 1
            return f"unreadable: {exc}", b""
