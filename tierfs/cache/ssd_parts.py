"""Small reads of the SSD tier's data files on the trio thread, on descriptors kept open.

Why not a worker thread, as every other disk access of the tier: a random 4 KiB read
of a cached object is one ``pread``, and handing it to a thread costs more than the
read. Measured on the 2-vCPU bench VM: ``trio.to_thread.run_sync`` of one 4 KiB
``pread`` takes 218 us, the ``pread`` itself 2 us from the page cache and about 80 us
from the disk; opening and closing the data file around it adds 10 us. So a part is
read here: a part of at most `INLINE_BYTES` with a plain ``pread`` that may wait for
the local disk as long as one read takes; a larger one only if the page cache holds it
(``RWF_NOWAIT``: never blocks). Other larger parts, and descriptors that cannot be
opened, fall back to the worker thread (`tierfs.cache.ssd_read`).

A disk that answers one such read slowly (`SLOW_READ_S`: failing, or a network volume
behind the cache dir) would stall every request while it does: after one, small parts are
read here only from the page cache too, for `SLOW_PAUSE_S`, the rest in worker threads.

Descriptors are kept per data file (at most `MAX_OPEN`, least recently used closed
first). A descriptor must never outlive its file's identity: the tier closes it the
moment the object's last block leaves the index (`forget`), before the data file is
unlinked and perhaps made anew (a put or an adopt under the same name), and none is
opened for a data file being deleted. Blocks forgotten while others stay are punched
out of the same file, whose descriptor stays right; the caller reads only blocks in
the index, checked in the same step as the read (nothing awaits in between).
"""

from __future__ import annotations

import errno
import logging
import os
import stat
import time
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path

INLINE_BYTES = 128 * 1024  # largest part read with a blocking pread on the trio thread
MAX_OPEN = 32  # data files kept open for part reads
SLOW_READ_S = 0.25  # a blocking pread this slow: the disk struggles (a local one: < 1 ms)
SLOW_PAUSE_S = 30.0  # ... then no blocking pread on the trio thread for this long

log = logging.getLogger("tierfs.cache")

_NOWAIT = getattr(os, "RWF_NOWAIT", 0)


class PartFiles:
    """Open descriptors of data files, by object stem, for `read`."""

    def __init__(self, max_open: int = MAX_OPEN) -> None:
        self._fds: OrderedDict[str, int] = OrderedDict()
        self._max_open = max_open
        self._nowait = bool(_NOWAIT)
        self._blocking_from = 0.0  # monotonic time blocking preads are made here again
        self.slow_reads = 0

    def __len__(self) -> int:
        return len(self._fds)

    def read(
        self, obj: str, path_of: Callable[[str], Path], offset: int, length: int
    ) -> bytes | None:
        """Exactly ``length`` bytes at ``offset`` of ``obj``'s data file (``path_of(obj)``,
        made only to open it: a path per read was a tenth of a random read's time), or
        None when they are not read here (the caller reads them in a worker thread): the
        part is larger than `INLINE_BYTES` (or a read was slow lately) and not in the page
        cache, the file is short there, or it cannot be opened. Raises OSError for a
        failing read."""
        fd = self._fds.get(obj)
        if fd is None:
            fd = self._open(obj, path_of(obj))
            if fd is None:
                return None
        else:
            self._fds.move_to_end(obj)
        if length <= INLINE_BYTES and time.monotonic() >= self._blocking_from:
            # Read here whether cached or not: asking "cached?" first (RWF_NOWAIT) only
            # added a failing syscall and an exception before the same read.
            began = time.monotonic()
            data = os.pread(fd, length, offset)
            took = time.monotonic() - began
            if took > SLOW_READ_S:
                self._slow(took)
            return data if len(data) == length else None
        if not self._nowait:
            return None
        buf = bytearray(length)
        try:
            got = os.preadv(fd, [buf], offset, _NOWAIT)
        except BlockingIOError:
            return None
        except OSError as exc:
            if exc.errno not in (errno.EOPNOTSUPP, errno.EINVAL):
                raise
            self._nowait = False  # this file system cannot say "not cached"
            return None
        return bytes(buf) if got == length else None

    def _slow(self, took: float) -> None:
        self.slow_reads += 1
        self._blocking_from = time.monotonic() + SLOW_PAUSE_S
        log.warning(
            "SSD cache: a %d ms read of its disk held every request; reads that would wait "
            "for the disk go to worker threads for %g s",
            took * 1000,
            SLOW_PAUSE_S,
        )

    def close(self, obj: str) -> None:
        """Close ``obj``'s descriptor, if one is open (its data file may go next)."""
        fd = self._fds.pop(obj, None)
        if fd is not None:
            os.close(fd)

    def close_all(self) -> None:
        while self._fds:
            os.close(self._fds.popitem()[1])

    def __del__(self) -> None:
        self.close_all()

    def _open(self, obj: str, path: Path) -> int | None:
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            return None
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            return None
        self._fds[obj] = fd
        while len(self._fds) > self._max_open:
            os.close(self._fds.popitem(last=False)[1])
        return fd
