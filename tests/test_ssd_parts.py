"""`tierfs.cache.ssd_parts.PartFiles`: small parts read on the trio thread, larger ones only
from the page cache, never wrong bytes."""

from __future__ import annotations

import os
import random
from pathlib import Path

from tierfs.cache.ssd_parts import INLINE_BYTES, PartFiles


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
