"""`tierfs.cache.ssd_parts.PartFiles`: small parts read on the trio thread, larger ones only
from the page cache, never wrong bytes."""

from __future__ import annotations

import os
import random
from pathlib import Path

import pytest

from tierfs.cache import ssd_parts
from tierfs.cache.ssd_parts import INLINE_BYTES, SLOW_PAUSE_S, SLOW_READ_S, PartFiles


def _data_file(tmp_path: Path, size: int) -> tuple[Path, bytes]:
    data = random.Random(5).randbytes(size)
    path = tmp_path / "obj.data"
    path.write_bytes(data)
    return path, data


def test_a_small_part_is_read_here_even_out_of_the_page_cache(tmp_path: Path) -> None:
    path, data = _data_file(tmp_path, 4 * INLINE_BYTES)
    parts = PartFiles()
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)  # (where the disk keeps it)
    finally:
        os.close(fd)
    for offset, length in ((0, 4096), (12345, 777), (INLINE_BYTES, INLINE_BYTES)):
        assert parts.read("obj", lambda _obj: path, offset, length) == data[offset:][:length]
    assert parts.read("obj", lambda _obj: path, len(data) - 10, 4096) is None  # short
    assert len(parts) == 1  # one descriptor, kept


def test_a_larger_part_is_read_here_only_from_the_page_cache(tmp_path: Path) -> None:
    path, data = _data_file(tmp_path, 4 * INLINE_BYTES)
    parts = PartFiles()
    length = INLINE_BYTES + 4096
    got = parts.read("obj", lambda _obj: path, 100, length)
    assert got is None or got == data[100 : 100 + length]  # None: to a worker thread
    parts._nowait = False  # a file system that cannot say "not cached": always a thread
    assert parts.read("obj", lambda _obj: path, 100, length) is None
    assert parts.read("obj", lambda _obj: path, 100, 4096) == data[100:4196]
    assert parts.read("gone", lambda _obj: tmp_path / "missing", 0, 4096) is None


def test_after_a_slow_read_small_parts_wait_for_the_disk_in_threads_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A disk that answers one read slowly (failing, or a network volume): every request
    waited for each such read on the trio thread. After one, a small part is read here only
    from the page cache for a while (None otherwise: a worker thread reads it)."""
    path, data = _data_file(tmp_path, 4 * INLINE_BYTES)
    parts = PartFiles()
    clock = [100.0]
    pread = os.pread

    def slow_pread(fd: int, length: int, offset: int) -> bytes:
        clock[0] += SLOW_READ_S + 0.01  # (the clock the reads are timed by)
        return pread(fd, length, offset)

    monkeypatch.setattr(ssd_parts.time, "monotonic", lambda: clock[0])
    monkeypatch.setattr(ssd_parts.os, "pread", slow_pread)
    assert parts.read("obj", lambda _obj: path, 0, 4096) == data[:4096]  # slow, but read
    assert parts.slow_reads == 1
    blocking = []
    monkeypatch.setattr(ssd_parts.os, "pread", lambda *args: blocking.append(args) or b"")
    got = parts.read("obj", lambda _obj: path, 8192, 4096)
    assert blocking == []  # no read that waits for the disk on this thread
    assert got is None or got == data[8192 : 8192 + 4096]  # (RWF_NOWAIT: the page cache)
    clock[0] += SLOW_PAUSE_S
    monkeypatch.setattr(ssd_parts.os, "pread", pread)
    assert parts.read("obj", lambda _obj: path, 4096, 4096) == data[4096:8192]  # here again
