"""The SSD tier's whole objects: sealing a complete object, and handing its file to the
kernel (FUSE passthrough) pinned until the last open of it closes.

Once every block of an object is here and was written or
CRC-checked by this process, `seal` fdatasyncs the data file and records its identity
(inode, size, mtime and ctime in nanoseconds) in the seal, published like a record.
`passthrough` hands out a sealed data file whose identity still matches, for the kernel
to read without the daemon: after a remount, a restore reads it as fast as a local
file. Any write to the file, by us or by anyone (an editor, ``dd``, a restore from
backup), changes its ctime, which no one can set back: such a file loses its seal
and is read block by block with CRC checks again. The seal trusts the disk's own
checks for bytes that rot silently on the medium after they were synced; use
``--file-cache-passthrough=false`` to have every read checked. While the kernel reads
a data file (it is *pinned*), no range of it is ever punched out: evicting one of its
blocks unlinks the whole file instead, and open readers keep their copy.

The seal's format (`SEAL`, then the CRC32C of its fields) lives here with the code that
writes and checks it. `_Seals` is part of `tierfs.cache.ssd.SsdTier`, sharing its state.
"""

from __future__ import annotations

import contextlib
import logging
import os
import stat
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import google_crc32c
import trio

from tierfs.cache.ssd_format import (
    FORMAT_VERSION,
    _name_bytes,
    _name_hash,
    _open_ours,
    _pread_exact,
    _publish,
)

if TYPE_CHECKING:  # a part of SsdTier, sharing its state
    from typing import Any as _Base
else:
    _Base = object

log = logging.getLogger("tierfs.cache")

SEAL_MAGIC = b"TFSS"
SEAL = struct.Struct("<4sHHQQQqqQ")  # magic, version, 0, generation, block size, size,
#                                      mtime_ns, ctime_ns, inode; then CRC32C of those
_SEAL_CRC = struct.Struct("<I")


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
        self._handed.add(obj)
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


def _seal_bytes(generation: int, block_size: int, st: os.stat_result) -> bytes:
    fields = SEAL.pack(
        SEAL_MAGIC,
        FORMAT_VERSION,
        0,
        generation,
        block_size,
        st.st_size,
        st.st_mtime_ns,
        st.st_ctime_ns,
        st.st_ino,
    )
    return fields + _SEAL_CRC.pack(google_crc32c.value(fields))


def _write_seal(seal: Path, data_path: Path, generation: int, block_size: int, size: int) -> bool:
    """Sync the data file, then record its identity in ``seal``; False if it is not
    ``size`` bytes long (then nothing is written)."""
    fd = _open_ours(data_path)
    if isinstance(fd, str):
        return False
    try:
        os.fdatasync(fd)
        st = os.fstat(fd)
    finally:
        os.close(fd)
    if st.st_size != size:
        return False
    _publish(seal, _seal_bytes(generation, block_size, st))
    return True


def _check_seal(
    seal: Path, data_path: Path, generation: int, block_size: int, size: int, records: list[Path]
) -> bool:
    """Whether ``seal`` vouches for the data file as it is now; touch ``records`` if so."""
    fd = _open_ours(seal)
    if isinstance(fd, str):
        return False
    try:
        raw = _pread_exact(fd, SEAL.size + _SEAL_CRC.size + 1, 0)
    finally:
        os.close(fd)
    try:
        st = os.stat(data_path, follow_symlinks=False)
    except FileNotFoundError:
        return False
    if not stat.S_ISREG(st.st_mode) or st.st_size != size:
        return False
    if raw != _seal_bytes(generation, block_size, st):
        return False
    for record in records:  # a passthrough open is a use of every block
        with contextlib.suppress(OSError):
            os.utime(record, follow_symlinks=False)
    return True
