"""The SSD tier's whole objects: sealing a complete object, and handing its file to the
kernel (FUSE passthrough) pinned until the last open of it closes.

A seal records the data file's size, mtime and inode next to it; a file changed since
no longer matches and loses it (then it is read block by block, each block checked).
Part of `tierfs.cache.ssd.SsdTier`, sharing its state.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import trio

from tierfs.cache.ssd_format import (
    _check_seal,
    _name_bytes,
    _name_hash,
    _write_seal,
)

if TYPE_CHECKING:  # a part of SsdTier, sharing its state
    from typing import Any as _Base
else:
    _Base = object

log = logging.getLogger("tierfs.cache")


@dataclass(frozen=True)
class Passthrough:
    """A sealed data file the kernel may read directly, pinned until `SsdTier.unpin`."""

    path: Path
    key: str
    size: int


class _Seals(_Base):
    """seal, passthrough and unpin of `SsdTier`."""

    async def seal(self, name: str, generation: int, size: int) -> bool:
        """Seal an object every block of which is here and was written or CRC-checked by
        this process: sync its data file and record its identity. True if it is sealed."""
        self._check_open()
        obj = self._complete(name, generation, size)
        if obj is None:
            return False
        if obj in self._sealed:
            return True
        if not self._objects[obj] <= self._trusted:
            return False
        forgets = self._forgets
        try:
            with trio.CancelScope(shield=True):
                sealed = await trio.to_thread.run_sync(
                    _write_seal,
                    self._seal_path(obj),
                    self._data_path(obj),
                    generation,
                    self._block_size,
                    size,
                    limiter=self._limiter,
                )
        except OSError as exc:
            self._failed("seal", "cannot seal gs://%s#%d: %s", name, generation, exc)
            return False
        if sealed and self._forgets == forgets:
            self._sealed.add(obj)
            self._seals += 1
            return True
        return False

    async def passthrough(self, name: str, generation: int, size: int) -> Passthrough | None:
        """The object's data file, pinned, if the tier holds all of it under a seal that
        still matches (checked once per object per process) or it can seal it now; else
        None. Every block counts as used. Release with `unpin`."""
        self._check_open()
        obj = self._complete(name, generation, size)
        if obj is None or not size:
            return None
        if obj not in self._sealed:
            records = [self._path(stem) for stem in self._objects[obj]]
            forgets = self._forgets
            try:
                valid = await trio.to_thread.run_sync(
                    _check_seal,
                    self._seal_path(obj),
                    self._data_path(obj),
                    generation,
                    self._block_size,
                    size,
                    records,
                    limiter=self._limiter,
                )
            except OSError as exc:
                self._failed("check", "cannot check the seal of gs://%s: %s", name, exc)
                valid = False
            if valid and self._forgets == forgets:
                self._sealed.add(obj)
            elif not await self.seal(name, generation, size):
                return None
        if obj not in self._sealed or obj in self._busy_objects:
            return None
        for stem in self._objects[obj]:
            self._index.move_to_end(stem)
        self._pins[obj] += 1
        self._passthrough_opens += 1
        self._passthrough_bytes += size
        return Passthrough(self._data_path(obj), obj, size)

    def unpin(self, handle: Passthrough) -> None:
        """The kernel no longer reads ``handle``'s file through that open."""
        self._pins[handle.key] -= 1
        if self._pins[handle.key] <= 0:
            del self._pins[handle.key]

    def _complete(self, name: str, generation: int, size: int) -> str | None:
        """The object's key if every block of a ``size``-byte object is in the index."""
        if not self._max_bytes or not self._wanted(name):
            return None
        obj = f"{_name_hash(_name_bytes(name))}.{generation}.{self._block_size}"
        stems = self._objects.get(obj)
        blocks = -(-size // self._block_size)
        if stems is None or len(stems) != blocks:
            return None
        return obj

    # -- helpers -------------------------------------------------------------------------
