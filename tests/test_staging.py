"""Staged copies of files being written (`tierfs.core.writer.Staged`): a file changed in
place is staged from its object first, and the copy must hold every byte of it; a write
that fails drops the changes, and no later write of that handle brings half of them back."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest
import trio
import trio.testing

from tests.test_writeback_filerename import _HeldBeforeReading
from tierfs.core.background import Background
from tierfs.core.filesystem import Filesystem, Settings
from tierfs.core.inodes import ROOT_INO
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


async def test_writes_after_a_failed_one_was_dropped_fail_until_the_close(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """O_TRUNC rewrite of a file; one write fails (ENOSPC) and the fsync that follows
    drops the changes (nothing partial is uploaded). The writer frees space and writes
    on through the same handle: those writes fail too, until it closes, and GCS keeps
    the old file. Before, they landed on a fresh copy of the old object and the close
    uploaded the old bytes with the later writes on top, and returned 0."""
    bucket = MemoryBucket("staging")
    bucket.put("f", b"the old file, whole")
    fs = Filesystem(bucket, Settings(temp_dir=str(tmp_path)))
    try:
        entry = await fs.lookup(ROOT_INO, "f")
        handle = await fs.open(entry.ino, os.O_WRONLY | os.O_TRUNC)
        await fs.write(handle.fh, 0, b"new ")
        real = os.pwrite

        def full(fd: int, data: bytes, offset: int) -> int:
            if data == b"no room":
                raise OSError(errno.ENOSPC, "No space left on device")
            return real(fd, data, offset)

        monkeypatch.setattr(os, "pwrite", full)
        with pytest.raises(OSError) as failed:
            await fs.write(handle.fh, 4, b"no room")
        assert failed.value.errno == errno.ENOSPC
        with pytest.raises(OSError):
            await fs.fsync(handle.fh)  # the changes are dropped here
        with pytest.raises(OSError) as later:
            await fs.write(handle.fh, 4, b"room again")
        assert later.value.errno == errno.ENOSPC
        await fs.release(handle.fh)
        assert bucket.get("f") == b"the old file, whole"
    finally:
        fs.close()


async def test_a_write_through_another_handle_waits_for_the_upload_a_close_makes(
    tmp_path: Path, nursery: trio.Nursery
) -> None:
    """Two handles on one file (no write-back): A's close uploads; B writes meanwhile. B's
    write waits for that upload, as gcsfuse's inode lock makes it: the upload sent the file
    as B was changing it (and a shrink made A's close EIO)."""
    bucket = _HeldBeforeReading("write_file")
    fs = Filesystem(bucket, Settings(temp_dir=str(tmp_path)), background=Background(nursery))
    try:
        a, inode = await fs.create(ROOT_INO, "f", os.O_WRONLY)
        await fs.write(a.fh, 0, b"written by A")
        b = await fs.open(inode.ino, os.O_WRONLY)
        closed, wrote = trio.Event(), trio.Event()

        async def close_a() -> None:
            await fs.flush(a.fh, last=True)  # the upload: held before it reads the file
            await fs.release(a.fh)
            closed.set()

        async def write_b() -> None:
            await fs.write(b.fh, 0, b"B")
            wrote.set()

        nursery.start_soon(close_a)
        with trio.fail_after(30):
            await bucket.entered.wait()
        nursery.start_soon(write_b)
        await trio.testing.wait_all_tasks_blocked()
        assert not wrote.is_set()
        bucket.gate.set()
        with trio.fail_after(30):
            await closed.wait()
            await wrote.wait()
        await fs.flush(b.fh, last=True)
        await fs.release(b.fh)
        assert bucket.made == [b"written by A", b"Britten by A"]
    finally:
        fs.close()
