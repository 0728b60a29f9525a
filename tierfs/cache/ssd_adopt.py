"""The SSD tier takes a local file as an object's data file: renamed into place, not copied.

Why: a file saved through a write-back mount is already on local disk, in the write-back
journal, holding exactly the object's bytes, laid out as a data file of this tier lays
them out (the object's bytes at their own offsets). Copying it into the tier after its
upload wrote every checkpoint twice to the same disk, and unmount waited for the copy.
When the journal and the tier share a file system, the journal's file is renamed into
the tier instead; only the records (a header with each block's CRC32C) and the seal are
written.

A file not adopted may still be at its old name: the caller deletes it (it was
uploaded: GCS has it, and a later read is a miss). Part of `tierfs.cache.ssd.SsdTier`,
sharing its state.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path
from typing import TYPE_CHECKING

import trio

from tierfs.cache import BlockKey
from tierfs.cache.ssd_format import (
    _FILE_MODE,
    _apply_drops,
    _Drop,
    _header,
    _make_dir,
    _name_bytes,
    _object_of,
    _pread_exact,
    _publish,
    _unlink,
)

if TYPE_CHECKING:  # a part of SsdTier, sharing its state
    from typing import Any as _Base
else:
    _Base = object


def _adopt_file(
    source: Path,
    data_path: Path,
    records: list[Path],
    name: bytes,
    generation: int,
    block_size: int,
    size: int,
    drops: list[_Drop],
) -> tuple[bool, list[tuple[Path, OSError]]]:
    """Carry out ``drops``, rename ``source`` (``size`` bytes) to ``data_path``, then
    publish each block's record (its header holds the CRC32C of the block read back):
    (adopted, failed deletes). Not adopted: ``source`` is on another file system (EXDEV)
    or not ``size`` bytes long (it is left where it is). Raises OSError (ENOSPC...), with
    nothing of the object left in the tier."""
    failures = _apply_drops(drops)
    try:
        if os.stat(source, follow_symlinks=False).st_size != size:
            return False, failures
        _make_dir(data_path.parent)
        try:
            os.rename(source, data_path)
        except OSError as exc:
            if exc.errno != errno.EXDEV:
                raise
            return False, failures
        os.chmod(data_path, _FILE_MODE, follow_symlinks=False)
        fd = os.open(data_path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
        try:
            for index, record in enumerate(records):
                offset = index * block_size
                data = _pread_exact(fd, min(block_size, size - offset), offset)
                _publish(record, _header(name, generation, index, block_size, data))
        finally:
            os.close(fd)
    except BaseException:
        _unlink(data_path)
        for record in records:
            _unlink(record)
        raise
    return True, failures


class _Adopt(_Base):
    """takes_files_from and adopt of `SsdTier`."""

    def takes_files_from(self, directory: Path) -> bool:
        """Whether ``directory`` is on this tier's file system (blocking: one ``stat`` of
        each, at most once per directory), so that a file in it can be renamed in."""
        if not self._max_bytes:
            return False
        known: dict[Path, bool] = self._same_device
        if directory not in known:
            try:
                known[directory] = os.stat(directory).st_dev == os.stat(self.directory).st_dev
            except OSError:
                return False
        return known[directory]

    async def adopt(self, source: Path, name: str, generation: int, size: int) -> bool:
        """Make ``source`` (exactly ``size`` bytes of object generation ``name#generation``)
        this tier's data file of that object, every block trusted (this process wrote it):
        True if so (it is no longer at ``source``). Not adopted (the caller deletes
        ``source`` if it is still there): the tier is off or excludes ``name``, holds or
        writes the object already, has no room for it, ``source`` is on another file
        system or not ``size`` bytes, or the disk failed (counted in ``errors``)."""
        self._check_open()
        blocks = -(-size // self._block_size)
        name_b = _name_bytes(name)
        keys = [BlockKey(name, generation, index) for index in range(blocks)]
        stems = [self._stem(name_b, key) for key in keys]
        sizes = [
            self.footprint(key, min(self._block_size, size - key.index * self._block_size))
            for key in keys
        ]
        obj = _object_of(stems[0]) if stems else ""
        if (
            not size
            or not self._max_bytes
            or not self._wanted(name)
            or obj in self._objects
            or obj in self._busy_objects
            or self._writing[obj]
            or any(stem in self._busy for stem in stems)
            or self._pending_bytes + sum(sizes) > self._max_bytes
        ):
            return False
        self._writing[obj] += 1
        drops = []
        for footprint in sizes:
            drops += self._make_room(footprint)
            self._pending_bytes += footprint
        self._busy.update(stems)
        adopted = False
        failures: list[tuple[Path, OSError]] = []
        try:
            with trio.CancelScope(shield=True):
                adopted, failures = await trio.to_thread.run_sync(
                    _adopt_file,
                    source,
                    self._data_path(obj),
                    [self._path(stem) for stem in stems],
                    name_b,
                    generation,
                    self._block_size,
                    size,
                    drops,
                    limiter=self._limiter,
                )
        except OSError as exc:
            self._failed("store", "cannot take in gs://%s#%d: %s", name, generation, exc)
        finally:
            self._write_ended(obj, stems, sum(sizes), drops)
        self._count_delete_failures(failures)
        if adopted:
            for stem, footprint in zip(stems, sizes, strict=True):
                self._add(stem, footprint)
                self._trusted.add(stem)
            self._adopted += 1
        return adopted
