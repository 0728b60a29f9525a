"""The SSD tier's start-up scan: what a previous daemon left in the cache directory.

At `SsdTier.open` the tier rebuilds its index from the files on disk: records oldest
first (their mtime is the last hit, so the LRU order survives restarts), the data
file sizes that bound each block's payload, and the seals. Whatever cannot be trusted
is deleted here, before anything is served: temporaries of an interrupted publish,
data files and seals whose records are gone, and the directory of an older format.
Blocking: run in a thread.
"""

from __future__ import annotations

import errno
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from tierfs.cache.ssd_format import (
    _DATA,
    _FANOUT,
    _SEAL_NAME,
    _STEM,
    _TMP_PREFIX,
    _index_of,
    _make_dir,
    _object_of,
    _unlink,
    lock_for_life,
)


@dataclass(frozen=True)
class _Scan:
    """What `_prepare` found: records oldest first as (stem, payload bytes, record bytes),
    and the volume."""

    records: list[tuple[str, int, int]]
    temporaries_removed: int
    old_format_removed: bool
    fragment_bytes: int
    total_bytes: int
    free_bytes: int
    lock_fd: int = -1  # held for the life of the process (`_lock`)


class CacheInUse(OSError):
    """Another live process has this bucket's SSD cache directory open: its startup scan
    would delete the files that process is writing, and its evictions would punch holes in
    blocks that process serves (zeros, even to the kernel through passthrough)."""


@dataclass
class _Found:
    records: list[tuple[float, str, int]] = field(default_factory=list)
    data_sizes: dict[str, int] = field(default_factory=dict)
    seals: list[Path] = field(default_factory=list)


def _scan_fanout(sub: os.DirEntry[str], found: _Found) -> int:
    removed = 0
    with os.scandir(sub.path) as files:
        for entry in files:
            if entry.name.startswith(_TMP_PREFIX):
                _unlink(Path(entry.path))
                removed += 1
                continue
            if not entry.name.startswith(sub.name):
                continue
            if _SEAL_NAME.fullmatch(entry.name):
                found.seals.append(Path(entry.path))
                continue
            regular = entry.is_file(follow_symlinks=False)
            if _DATA.fullmatch(entry.name) and regular:
                st = entry.stat(follow_symlinks=False)
                found.data_sizes[entry.path[: -len(".data")]] = st.st_size
            elif _STEM.fullmatch(entry.name) and (regular or entry.is_symlink()):
                st = entry.stat(follow_symlinks=False)
                stamp = max(st.st_mtime, st.st_atime)
                found.records.append((stamp, entry.path, st.st_size))
    return removed


def _prepare(root: Path, directory: Path, old_directory: Path) -> _Scan:
    """Create the cache directories, delete leftovers (temporaries, data files and seals
    with no record, the old format's directory), list the records."""
    if not root.is_dir():
        os.makedirs(root.parent, exist_ok=True)
        _make_dir(root)
    old = old_directory.is_dir() and not old_directory.is_symlink()
    if old:
        shutil.rmtree(old_directory, ignore_errors=True)
    _make_dir(directory.parent.parent)
    _make_dir(directory.parent)
    _make_dir(directory)
    lock_fd = _lock(directory.parent / f"{directory.name}.lock")
    found = _Found()
    removed = 0
    with os.scandir(directory) as subdirs:
        for sub in subdirs:
            if _FANOUT.fullmatch(sub.name) and sub.is_dir(follow_symlinks=False):
                removed += _scan_fanout(sub, found)
    st = os.statvfs(directory)
    fragment = st.f_frsize or 4096
    objects_with_records: set[str] = set()
    records = []
    for _stamp, path, record_size in sorted(found.records):
        obj = _object_of(path)
        objects_with_records.add(obj)
        index, block_size = _index_of(path), int(obj.rsplit(".", 1)[1])
        length = max(0, min(block_size, found.data_sizes.get(obj, 0) - index * block_size))
        records.append((os.path.basename(path), length, record_size))
    for obj in set(found.data_sizes) - objects_with_records:
        _unlink(Path(obj + ".data"))
    for seal in found.seals:
        if str(seal)[: -len(".seal")] not in found.data_sizes:
            _unlink(seal)
    return _Scan(
        records=records,
        temporaries_removed=removed,
        old_format_removed=old,
        fragment_bytes=fragment,
        total_bytes=st.f_blocks * st.f_frsize,
        free_bytes=st.f_bavail * st.f_frsize,
        lock_fd=lock_fd,
    )


def _lock(path: Path) -> int:
    """Hold ``path``'s lock before anything in the directory is touched (`lock_for_life`);
    `CacheInUse` if another process holds it."""
    fd = lock_for_life(path)
    if fd is None:
        raise CacheInUse(errno.EBUSY, "used by another tierfs mount of this bucket")
    return fd
