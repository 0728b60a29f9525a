"""Block payloads written to the SSD tier's data files with ``O_DIRECT``, past the page
cache.

Why: a block stored in the SSD tier is already in memory twice (the RAM tier, and the
reader's page cache of the FUSE file). Written through the page cache it takes a third
copy's worth of fresh pages, which the kernel must allocate, fill and later write back
and reclaim. On the bench VM, storing 1 GiB in 8 MiB blocks took 0.64-2.84 s of system
time through the page cache and 0.06-0.11 s with ``O_DIRECT`` (`dd`: 308 MB/s into
fresh page cache, 1.0-1.2 GB/s direct), and those writes were 15 % of a daemon's
samples during a cold read with a cache dir (perf). A restore that reads the tier
later reads it from the disk, as it would after any remount.

What it changes, measured in pairs (`benchmarks` read and rand, tierfs-ckpt, plain,
three runs each way on the bench VM): a read after a remount (a restore) 1,630-1,995
against 679-974 MB/s buffered; daemon RSS in random reads 364-372 against 403-410 MiB;
a cold read the same (477-543 against 525-647 MB/s). What it costs: a second read in
the same mount goes to the disk, not the page cache (818-1,012 against 2,673-3,587
MB/s), and so do random 1 MiB reads of an object the tier just filled (350-470
against 1,386-2,550 MB/s); both stay above rclone's (534 and 110-341).

How: the aligned part of a payload (offsets are block multiples, so all but the last
block's tail) is written with ``pwrite``: in one piece, straight from the payload, where
its memory is aligned (a downloaded block: `tierfs.cache.buffers`), else copied through
a reused page-aligned buffer in `CHUNK_BYTES` pieces; the unaligned tail, and everything
on a file system that refuses ``O_DIRECT`` (tmpfs, some overlays: ``EINVAL``), is
written through the page cache as before. Mixing the two on one file is coherent: a
direct write drops the cached pages of its range.
"""

from __future__ import annotations

import contextlib
import errno
import mmap
import os
import threading
from collections.abc import Iterator
from pathlib import Path

from tierfs.cache.buffers import address_aligned

ALIGN = 4096  # a multiple of every logical block size ext4/xfs use
CHUNK_BYTES = 1 << 20  # each aligned buffer (256 KiB: 2.5x the time, one I/O each)

_O_DIRECT = getattr(os, "O_DIRECT", 0)
_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC


class _Refused:
    """Whether a file system refused ``O_DIRECT`` (by device): then it is not tried again."""

    def __init__(self) -> None:
        self.devices: set[int] = set()


REFUSED = _Refused()


class _Buffers:
    """Page-aligned buffers, reused: as many as stores ever ran at once (the tier's
    limiter bounds them), not one per worker thread that ever stored."""

    def __init__(self) -> None:
        self._free: list[mmap.mmap] = []
        self._lock = threading.Lock()

    @contextlib.contextmanager
    def one(self) -> Iterator[memoryview]:
        with self._lock:
            buf = self._free.pop() if self._free else None
        if buf is None:
            buf = mmap.mmap(-1, CHUNK_BYTES)
        try:
            with memoryview(buf) as view:
                yield view
        finally:
            with self._lock:
                self._free.append(buf)


_BUFFERS = _Buffers()


def write_payload(path: Path, data: bytes | memoryview, offset: int, mode: int) -> None:
    """Write ``data`` at ``offset`` of ``path`` (made with ``mode`` if missing): its aligned
    part with ``O_DIRECT`` where the file system takes it, the rest through the page cache."""
    view = memoryview(data).cast("B")
    done = 0
    if _O_DIRECT and offset % ALIGN == 0 and len(view) >= ALIGN:
        done = _write_direct(path, view, offset, mode)
    if done < len(view) or not view:  # the tail; an empty payload still makes the file
        fd = os.open(path, _FLAGS, mode)
        try:
            os.fchmod(fd, mode)
            _pwrite_all(fd, view[done:], offset + done)
        finally:
            os.close(fd)


def _write_direct(path: Path, view: memoryview, offset: int, mode: int) -> int:
    """Bytes of ``view`` written directly from its start (a multiple of `ALIGN`; 0 when the
    file system refuses ``O_DIRECT``)."""
    try:
        device = os.stat(path.parent).st_dev
    except OSError:
        return 0
    if device in REFUSED.devices:
        return 0
    try:
        fd = os.open(path, _FLAGS | _O_DIRECT, mode)
    except OSError as exc:
        if exc.errno != errno.EINVAL:
            raise
        REFUSED.devices.add(device)
        return 0
    done = 0
    try:
        os.fchmod(fd, mode)
        if address_aligned(view, ALIGN):
            done = _copy_out(fd, None, view, offset, device)
        else:
            with _BUFFERS.one() as buf:
                done = _copy_out(fd, buf, view, offset, device)
    finally:
        os.close(fd)
    return done


def _copy_out(fd: int, buf: memoryview | None, view: memoryview, offset: int, device: int) -> int:
    """Write ``view``'s aligned part, through ``buf`` (None: ``view`` is aligned itself):
    the bytes written from its start."""
    done = 0
    chunk = len(view) if buf is None else CHUNK_BYTES  # (aligned: one pwrite for all)
    while len(view) - done >= ALIGN:
        n = min(chunk, (len(view) - done) // ALIGN * ALIGN)
        if buf is None:
            out = view[done : done + n]
        else:
            buf[:n] = view[done : done + n]
            out = buf[:n]
        try:
            wrote = os.pwrite(fd, out, offset + done)
        except OSError as exc:
            if exc.errno != errno.EINVAL:
                raise
            REFUSED.devices.add(device)  # opened, but a direct write was refused
            break
        done += wrote - wrote % ALIGN
        if wrote != n:
            break  # a short write: the rest goes through the page cache
    return done


def _pwrite_all(fd: int, view: memoryview, offset: int) -> None:
    while view:
        done = os.pwrite(fd, view, offset)
        offset += done
        view = view[done:]
