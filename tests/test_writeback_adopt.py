"""A write-back file, once uploaded and let go, becomes the SSD tier's copy of its object
by a rename of the journal's file, not a copy (the journal and the tier share a file
system): a checkpoint is written to local disk once, not twice."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import trio

from tierfs.cache import BlockKey
from tierfs.cache.ssd import SsdTier
from tierfs.core import writeback
from tierfs.core.background import Background
from tierfs.core.blocks import Blocks
from tierfs.core.filesystem import Filesystem, Settings
from tierfs.core.inodes import ROOT_INO
from tierfs.core.writeback import Journal
from tierfs.storage.memory import MemoryBucket

BLOCK = 4096
MiB = 1 << 20


@pytest.fixture(autouse=True, params=["xattr", "files"])
def records(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """With records as attributes and as files (a journal with no user attributes)."""
    if request.param == "files":
        monkeypatch.setattr(writeback, "xattrs_work", lambda directory: False)
    return str(request.param)


async def make(
    tmp_path: Path, nursery: trio.Nursery, *, ssd_bytes: int = MiB, ssd_root: Path | None = None
) -> tuple[Filesystem, SsdTier, MemoryBucket]:
    bucket = MemoryBucket("wb")
    ssd = await SsdTier.create(ssd_root or tmp_path / "cache", "wb", ssd_bytes, block_size=BLOCK)
    blocks = Blocks(bucket, [ssd], block_size=BLOCK, downloads=trio.CapacityLimiter(4))
    (tmp_path / "tmp").mkdir(exist_ok=True)
    fs = Filesystem(
        bucket,
        Settings(temp_dir=str(tmp_path / "tmp"), file_cache=True),
        journal=Journal(tmp_path / "cache", "wb"),
        blocks=blocks,
    )
    fs.background = Background(nursery)
    return fs, ssd, bucket


async def save(fs: Filesystem, name: str, data: bytes) -> int:
    """Write and close a file; the inode number of its journal file."""
    handle, inode = await fs.create(ROOT_INO, name, os.O_WRONLY)
    await fs.write(handle.fh, 0, data)
    assert inode.staged is not None
    journal_ino = os.fstat(inode.staged.fd).st_ino
    await fs.release(handle.fh)
    return journal_ino


async def let_go(fs: Filesystem) -> None:
    """Upload everything, then wait for what follows (the SSD tier taking the files)."""
    await fs.sync_all()
    await fs._copies.wait_idle()


def journal_data_files(fs: Filesystem) -> list[str]:
    """The journal's data files but its spares (empty files made ahead for creates)."""
    assert fs.journal is not None
    files = list(fs.journal.dir.glob("*.data"))
    # After the listing: a spare a thread is making is in `spare_paths` from before its
    # file exists until it is taken for a create (none is, here).
    spares = fs.journal.spare_paths()
    return sorted(p.name for p in files if p not in spares)


async def test_an_uploaded_file_is_renamed_into_the_ssd_tier_not_copied(
    tmp_path: Path, nursery: trio.Nursery
) -> None:
    fs, ssd, bucket = await make(tmp_path, nursery)
    data = os.urandom(3 * BLOCK + 100)
    journal_ino = await save(fs, "ckpt.pt", data)
    await let_go(fs)
    assert bucket.get("ckpt.pt") == data
    generation = (await bucket.stat("ckpt.pt")).generation
    assert all(ssd.holds(BlockKey("ckpt.pt", generation, i)) for i in range(4))
    data_file = ssd.data_path_of("ckpt.pt", generation)
    assert data_file.stat().st_ino == journal_ino  # the same file: renamed, not copied
    assert oct(data_file.stat().st_mode & 0o777) == oct(0o600)
    assert ssd.statistics()["adopted"] == 1
    assert ssd.statistics()["bytes_written"] == 0  # no block was written by a copy
    assert journal_data_files(fs) == []
    assert fs.journal is not None and not list(fs.journal.dir.glob("*.json"))  # no record
    pinned = await fs.blocks.passthrough("ckpt.pt", generation, len(data))
    assert pinned is not None  # sealed: the next mount may hand it to the kernel
    fs.blocks.unpin(pinned)
    for index in range(4):  # each block's record holds its CRC: reads check out
        block = await ssd.get(BlockKey("ckpt.pt", generation, index))
        assert block == data[index * BLOCK : (index + 1) * BLOCK]
    fs.close()


async def test_a_file_written_again_before_it_is_let_go_is_taken_at_its_last_version(
    tmp_path: Path, nursery: trio.Nursery
) -> None:
    """The tier takes the file only if it still holds the bytes of the upload it is
    named after: written again (and uploaded again), it is the newer generation."""
    fs, ssd, bucket = await make(tmp_path, nursery)
    handle, _ = await fs.create(ROOT_INO, "f", os.O_WRONLY)
    await fs.write(handle.fh, 0, b"a" * BLOCK)
    await fs.flush(handle.fh)
    await fs.sync_all()  # uploaded while still open: not let go
    first = (await bucket.stat("f")).generation
    await fs.write(handle.fh, 0, b"b" * BLOCK)
    await fs.release(handle.fh)
    await let_go(fs)
    second = (await bucket.stat("f")).generation
    assert second != first
    assert bucket.get("f") == b"b" * BLOCK
    assert not ssd.holds(BlockKey("f", first, 0))
    assert await ssd.get(BlockKey("f", second, 0)) == b"b" * BLOCK
    assert journal_data_files(fs) == []
    fs.close()


async def test_a_file_the_tier_has_no_room_for_is_deleted_from_the_journal(
    tmp_path: Path, nursery: trio.Nursery
) -> None:
    fs, ssd, bucket = await make(tmp_path, nursery, ssd_bytes=2 * BLOCK)
    data = os.urandom(4 * BLOCK)
    await save(fs, "big", data)
    await let_go(fs)
    assert bucket.get("big") == data
    assert ssd.statistics()["adopted"] == 0
    assert ssd.statistics()["used_bytes"] == 0
    assert journal_data_files(fs) == []
    fs.close()


async def test_on_another_file_system_the_upload_is_copied(
    tmp_path: Path, nursery: trio.Nursery, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A journal on another file system (a tmpfs write-back-dir) cannot be renamed into
    the tier: the upload is copied in, as before, and the journal's file deleted."""
    monkeypatch.setattr(SsdTier, "takes_files_from", lambda self, directory: False)
    fs, ssd, bucket = await make(tmp_path, nursery)
    data = os.urandom(BLOCK + 1)
    journal_ino = await save(fs, "f", data)
    await let_go(fs)
    generation = (await bucket.stat("f")).generation
    assert await ssd.get(BlockKey("f", generation, 1)) == data[BLOCK:]
    assert ssd.data_path_of("f", generation).stat().st_ino != journal_ino
    assert ssd.statistics()["adopted"] == 0
    assert journal_data_files(fs) == []
    fs.close()


async def test_the_tier_takes_no_file_from_another_file_system(tmp_path: Path) -> None:
    ssd = await SsdTier.create(tmp_path / "cache", "wb", MiB, block_size=BLOCK)
    assert ssd.takes_files_from(tmp_path)
    if os.stat("/dev/shm").st_dev != os.stat(tmp_path).st_dev:
        assert not ssd.takes_files_from(Path("/dev/shm"))
    off = await SsdTier.create(tmp_path / "off", "wb", 0, block_size=BLOCK)
    assert not off.takes_files_from(tmp_path)
