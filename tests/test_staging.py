"""Staged copies of objects (`tierfs.core.writer.Staged.from_object`): a file changed in
place is staged from its object first, and the copy must hold every byte of it."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tierfs.core.writer import COPY_CHUNK_BYTES, Staged
from tierfs.storage.memory import MemoryBucket


async def test_a_short_write_while_staging_goes_on_where_it_stopped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A disk filling up takes half a chunk, then room is made: the copy goes on from the
    byte it stopped at. Before, the rest of that chunk was a hole of zeros, and a small
    edit of the file uploaded them."""
    bucket = MemoryBucket("staging")
    data = os.urandom(COPY_CHUNK_BYTES + 12345)
    info = await bucket.write_bytes("f", data, if_generation_match=0)
    real, shorts = os.pwrite, []

    def short_once(fd: int, chunk: bytes, offset: int) -> int:
        if not shorts:
            shorts.append(offset)
            return real(fd, bytes(memoryview(chunk)[: len(chunk) // 2]), offset)
        return real(fd, chunk, offset)

    monkeypatch.setattr(os, "pwrite", short_once)
    staged = await Staged.from_object(bucket, info, str(tmp_path), len(data))
    try:
        assert shorts == [0]
        assert staged.size == len(data)
        assert os.pread(staged.fd, len(data) + 1, 0) == data
    finally:
        staged.close()
