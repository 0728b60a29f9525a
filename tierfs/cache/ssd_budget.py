"""The SSD tier's index and budget: which records it holds, how many bytes they take on
disk, and what is evicted (least recently used first) to make room.

Part of `tierfs.cache.ssd.SsdTier`, sharing its state.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING

import trio

from tierfs.cache.ssd_format import (
    _NAME_HASH_HEX,
    _apply_drops,
    _Drop,
    _index_of,
    _object_of,
)

if TYPE_CHECKING:  # a part of SsdTier, sharing its state
    from typing import Any as _Base
else:
    _Base = object

log = logging.getLogger("tierfs.cache")


class _Budget(_Base):
    """The index bookkeeping and eviction of `SsdTier`."""

    def _add(self, stem: str, size: int) -> None:
        self._index[stem] = size
        self._used_bytes += size
        obj = _object_of(stem)
        self._objects.setdefault(obj, set()).add(stem)
        self._by_name.setdefault(stem[:_NAME_HASH_HEX], set()).add(obj)

    def _forget(self, stem: str) -> None:
        """Take ``stem`` out of the index (its record is still to be deleted)."""
        self._used_bytes -= self._index.pop(stem)
        self._forgets += 1
        self._trusted.discard(stem)
        obj = _object_of(stem)
        self._sealed.discard(obj)
        stems = self._objects[obj]
        stems.discard(stem)
        if not stems:
            del self._objects[obj]
            self._parts.close(obj)  # before its data file may be unlinked and made anew
            objects = self._by_name[stem[:_NAME_HASH_HEX]]
            objects.discard(obj)
            if not objects:
                del self._by_name[stem[:_NAME_HASH_HEX]]

    def _drops(self, stems: list[str], *, whole: bool = False) -> list[_Drop]:
        """What to delete for ``stems`` (already forgotten), object by object; mark busy.

        An object with no block left, or whose file was handed to the kernel (passthrough:
        an open still pinning it, or a mapping made through one, which outlives its
        close), loses its whole data file: a punched range would read as zeros, an
        unlinked file lives on for its readers. Its other blocks are forgotten with it.
        A file a put is writing is punched, never unlinked: a pin or a mapping of this
        object is then of an older file, already unlinked, and the put's block would land
        in an unlinked file while its record is published."""
        by_object: dict[str, list[str]] = {}
        for stem in stems:
            by_object.setdefault(_object_of(stem), []).append(stem)
        drops = []
        for obj, gone in by_object.items():
            remaining = self._objects.get(obj, set())
            writing = obj in self._writing
            handed = not writing and (obj in self._pins or obj in self._handed)
            if remaining and (whole or handed):
                gone.extend(remaining)
                for stem in list(remaining):
                    self._forget(stem)
                remaining = set()
            punch = None
            if remaining or writing:
                size = self._block_size
                punch = tuple((_index_of(stem) * size, size) for stem in gone)
            else:
                self._busy_objects.add(obj)
                self._handed.discard(obj)  # (its file goes: a new one is not handed yet)
            self._busy.update(gone)
            drops.append(
                _Drop(
                    tuple(self._path(s) for s in gone),
                    self._data_path(obj),
                    self._seal_path(obj),
                    punch,
                )
            )
        return drops

    def _write_ended(self, obj: str, stems: list[str], nbytes: int, drops: list[_Drop]) -> None:
        """A put or an adopt into ``obj`` is over (done or not): its reservation of
        ``nbytes``, its busy ``stems`` and the evictions it made room with are let go."""
        self._pending_bytes -= nbytes
        self._busy.difference_update(stems)
        self._writing[obj] -= 1
        if not self._writing[obj]:
            del self._writing[obj]
        self._release(drops)

    def _release(self, drops: list[_Drop]) -> None:
        for drop in drops:
            self._busy.difference_update(p.name for p in drop.records)
            if drop.punch is None:
                self._busy_objects.discard(drop.data.name.removesuffix(".data"))

    def _make_room(self, size: int) -> list[_Drop]:
        """Evict LRU blocks until ``size`` more bytes (and one more entry) fit; return what
        to delete (marked busy). Requires pending + size <= capacity.

        Blocks of an object the kernel reads through passthrough now (pinned) go last:
        its reads never reach us, so it looked unused, and the first put after it aged
        unlinked its file whole. That freed nothing (the open keeps the inode: the volume
        held the cap plus the file), and its next open fetched it all again. It is moved
        to the recent end instead, and evicted only when nothing else is left."""
        victims: list[str] = []
        entries = 1 if size else 0
        passed = 0  # pinned blocks moved to the recent end by this call
        while self._index and (
            self._used_bytes + self._pending_bytes + size > self._max_bytes
            or len(self._index) + entries > self._max_entries
        ):
            stem = next(iter(self._index))
            if passed < len(self._index) and _object_of(stem) in self._pins:
                self._index.move_to_end(stem)
                passed += 1
                continue
            self._forget(stem)
            victims.append(stem)
        self._evictions += len(victims)
        return self._drops(victims)

    async def _delete(self, drops: list[_Drop]) -> None:
        """Carry out ``drops`` (from `_drops`), busy until done."""
        if not drops:
            return
        failures: list[tuple[Path, OSError]] = []
        try:
            with trio.CancelScope(shield=True):
                failures = await trio.to_thread.run_sync(_apply_drops, drops, limiter=self._limiter)
        finally:
            self._release(drops)
        self._count_delete_failures(failures)

    def _count_delete_failures(self, failures: list[tuple[Path, OSError]]) -> None:
        for path, exc in failures:
            self._failed("delete", "cannot delete %s: %s", path, exc)
