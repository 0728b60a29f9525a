"""Streaming writes in the core (MemoryBucket) and through a real mount: in-order writes are
uploaded while written, anything else falls back to a staged write with the same bytes."""

from __future__ import annotations

import os
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing
from google.cloud import storage

from tests.conftest import MountFactory
from tierfs.cli.control import request
from tierfs.core.background import Background
from tierfs.core.filesystem import Filesystem, Settings
from tierfs.core.inodes import ROOT_INO
from tierfs.errors import AccessDenied, BackendError, NotFound, PreconditionFailed
from tierfs.storage import ObjectInfo
from tierfs.storage.memory import MemoryBucket

MiB = 1 << 20


@pytest.fixture
async def streaming_fs(tmp_path: Path) -> AsyncIterator[tuple[Filesystem, MemoryBucket]]:
    bucket = MemoryBucket("s")
    fs = Filesystem(bucket, Settings(temp_dir=str(tmp_path), max_streams=2, stream_chunk_bytes=MiB))
    async with trio.open_nursery() as nursery:
        fs.background = Background(nursery)
        yield fs, bucket
        nursery.cancel_scope.cancel()
    fs.close()


@pytest.mark.trio
async def test_in_order_writes_stream_and_the_object_appears_at_close(
    streaming_fs: tuple[Filesystem, MemoryBucket],
) -> None:
    fs, bucket = streaming_fs
    handle, inode = await fs.create(ROOT_INO, "ckpt", os.O_WRONLY)
    stream = inode.stream
    assert stream is not None
    data = os.urandom(3 * MiB + 7)
    for start in range(0, len(data), 128 * 1024):
        await fs.write(handle.fh, start, data[start : start + 128 * 1024])
    await trio.sleep(0.01)
    assert stream.offset == len(data) and bucket.names() == []  # sent, not made yet
    assert bytes(await fs.read(handle.fh, 0, 10)) == data[:10]  # reads during the write
    await fs.release(handle.fh)
    assert bucket.get("ckpt") == data
    assert bucket.statistics()["uploads"] == 1


@pytest.mark.trio
async def test_an_fsync_while_streaming_sends_what_is_written_and_makes_no_object(
    streaming_fs: tuple[Filesystem, MemoryBucket],
) -> None:
    """As gcsfuse's: an fsync of a file being streamed hands what was written to the
    upload, and the object is made at close. It was made at the fsync (other clients saw
    a cut file), and the close then uploaded the whole file again: a log fsync'd at each
    line went up whole each time (8 MiB written, 12 MiB uploaded, in a probe)."""
    fs, bucket = streaming_fs
    handle, inode = await fs.create(ROOT_INO, "log", os.O_WRONLY)
    stream = inode.stream
    assert stream is not None
    data = os.urandom(3 * MiB + 7)
    half = len(data) // 2
    for start in range(0, half, 128 * 1024):
        await fs.write(handle.fh, start, data[start : min(half, start + 128 * 1024)])
    await fs.fsync(handle.fh)
    assert stream._handed == half  # all of it in the upload's hands
    assert bucket.names() == [] and inode.stream is stream  # no object yet, still streaming
    for start in range(half, len(data), 128 * 1024):
        await fs.write(handle.fh, start, data[start : min(len(data), start + 128 * 1024)])
    await fs.release(handle.fh)
    assert bucket.get("log") == data
    assert bucket.statistics()["uploads"] == 1
    assert bucket.statistics()["bytes_written"] == len(data)


@pytest.mark.trio
@pytest.mark.parametrize("disorder", ["random write", "truncate", "rename"])
async def test_anything_out_of_order_falls_back_with_the_same_bytes(
    streaming_fs: tuple[Filesystem, MemoryBucket], disorder: str
) -> None:
    fs, bucket = streaming_fs
    handle, inode = await fs.create(ROOT_INO, "f", os.O_RDWR)
    await fs.write(handle.fh, 0, b"a" * 1000)
    name = "f"
    if disorder == "random write":
        await fs.write(handle.fh, 10, b"B" * 10)
        expected = b"a" * 10 + b"B" * 10 + b"a" * 980
    elif disorder == "truncate":
        await fs.setattr(inode.ino, size=500)
        expected = b"a" * 500
    else:
        await fs.rename(ROOT_INO, "f", ROOT_INO, "g")
        name, expected = "g", b"a" * 1000
    assert inode.stream is None
    await fs.release(handle.fh)
    assert bucket.names() == [name]
    assert bucket.get(name) == expected


class _LostAnswer(MemoryBucket):
    """A bucket whose streaming uploads make their object and then fail (the answer to
    the last request lost), or, with ``made`` False, fail having made nothing while
    another client's object with other bytes appears."""

    def __init__(self, made: bool) -> None:
        super().__init__("s")
        self.made = made

    async def open_upload(self, name: str, **kwargs: Any) -> Any:
        upload = await super().open_upload(name, **kwargs)
        finish = upload.finish

        async def lost() -> ObjectInfo:
            if self.made:
                await finish()
            else:
                self.put(name, b"another client's bytes")
            raise BackendError("the session is gone (404)")

        upload.finish = lost
        return upload


@pytest.mark.trio
@pytest.mark.parametrize("made", [True, False])
async def test_a_stream_that_made_its_object_but_lost_the_answer_is_not_a_conflict(
    tmp_path: Path, made: bool
) -> None:
    """The whole upload after a failed finish fails its precondition on the object the
    stream made: close must succeed (the object holds exactly the bytes written), not
    say ESTALE. An object with other bytes is still a conflict."""
    bucket = _LostAnswer(made)
    settings = Settings(temp_dir=str(tmp_path), max_streams=2, stream_chunk_bytes=MiB)
    fs = Filesystem(bucket, settings)
    data = os.urandom(2 * MiB + 3)
    async with trio.open_nursery() as nursery:
        fs.background = Background(nursery)
        handle, inode = await fs.create(ROOT_INO, "ckpt", os.O_WRONLY)
        assert inode.stream is not None
        await fs.write(handle.fh, 0, data)
        if made:
            await fs.release(handle.fh)
            assert bucket.get("ckpt") == data
            assert (await fs.lookup(ROOT_INO, "ckpt")).size == len(data)
        else:
            with pytest.raises(PreconditionFailed):
                await fs.release(handle.fh)
            assert bucket.get("ckpt") == b"another client's bytes"
        nursery.cancel_scope.cancel()
    fs.close()


class _GatedUploads(MemoryBucket):
    """A bucket whose streaming uploads take no chunk until ``gate`` is set: a writer
    faster than GCS fills the stream's queue and then waits on it."""

    def __init__(self) -> None:
        super().__init__("s")
        self.gate = trio.Event()

    async def open_upload(self, name: str, **kwargs: Any) -> Any:
        upload = await super().open_upload(name, **kwargs)
        write = upload.write

        async def gated(data: bytes) -> None:
            await self.gate.wait()
            await write(data)

        upload.write = gated
        return upload


@pytest.mark.trio
@pytest.mark.parametrize("ends_it", ["another descriptor's close", "a truncate"])
async def test_a_write_waiting_on_a_full_stream_reaches_the_object(
    tmp_path: Path, ends_it: str
) -> None:
    """A write waiting for room in the stream's queue was counted as sent: a close of
    another descriptor (a reader's, an fsync) then finished the stream without it, marked
    the file clean, and the waiting write failed although its bytes were in the file. The
    object lacked them for good. Also when a truncate abandons the stream meanwhile."""
    bucket = _GatedUploads()
    settings = Settings(temp_dir=str(tmp_path), max_streams=2, stream_chunk_bytes=MiB)
    fs = Filesystem(bucket, settings)
    piece = 128 * 1024
    # The sender holds the first piece, the queue the next 8, and the 10th, the last,
    # waits: 1.25 MiB, past one chunk, so a close finishes the stream.
    data = os.urandom(10 * piece)
    failures: list[BaseException] = []
    written = trio.Event()
    async with trio.open_nursery() as nursery:
        fs.background = Background(nursery)
        handle, inode = await fs.create(ROOT_INO, "ckpt", os.O_RDWR)
        stream = inode.stream
        assert stream is not None

        async def writer() -> None:
            for start in range(0, len(data), piece):
                try:
                    await fs.write(handle.fh, start, data[start : start + piece])
                except Exception as err:  # each write's outcome is kept
                    failures.append(err)
            written.set()

        async def close_another() -> None:
            other = await fs.open(inode.ino, os.O_RDONLY)
            await fs.flush(other.fh)
            await fs.release(other.fh)

        nursery.start_soon(writer)
        await trio.testing.wait_all_tasks_blocked()
        assert not written.is_set() and inode.staged is not None
        assert inode.staged.size == len(data)  # every write is in the file
        expected = data
        if ends_it == "a truncate":
            expected = data[: len(data) // 2]
            await fs.setattr(inode.ino, size=len(expected))
            assert inode.stream is None
        else:
            nursery.start_soon(close_another)
            await trio.testing.wait_all_tasks_blocked()
        bucket.gate.set()
        with trio.fail_after(10):
            await written.wait()
            await trio.testing.wait_all_tasks_blocked()
        await fs.release(handle.fh)
        assert bucket.get("ckpt") == expected
        assert failures == []
        nursery.cancel_scope.cancel()
    fs.close()


@pytest.mark.trio
async def test_streams_are_bounded_by_global_max_blocks(
    streaming_fs: tuple[Filesystem, MemoryBucket],
) -> None:
    fs, _ = streaming_fs
    opened = [await fs.create(ROOT_INO, f"f{i}", os.O_WRONLY) for i in range(3)]
    assert [inode.stream is not None for _, inode in opened] == [True, True, False]
    for handle, _ in opened:
        await fs.release(handle.fh)
    assert fs._streams == 0


def test_a_big_file_is_uploading_before_close(
    mount_factory: MountFactory, gcs_client: storage.Client, bucket_name: str
) -> None:
    mount = mount_factory("--write-block-size-mb=1")
    data = os.urandom(12 * MiB + 1)
    with open(mount.path / "model.safetensors", "wb") as handle:
        for start in range(0, len(data), MiB):
            handle.write(data[start : start + MiB])
            handle.flush()
        # (In-process: a forked child closing its copy of the fd would flush the file.)
        deadline = time.monotonic() + 30
        while request(str(mount.path), "stats")["gcs"]["bytes_written"] < 12 * MiB:
            assert time.monotonic() < deadline, "the queued writes were never sent"
            time.sleep(0.05)
        assert list(gcs_client.list_blobs(bucket_name)) == []  # on its way, not an object yet
    blob = gcs_client.bucket(bucket_name).blob("model.safetensors")
    assert blob.download_as_bytes() == data


def test_an_fsync_through_the_mount_makes_the_object_only_at_close(
    mount_factory: MountFactory, gcs_client: storage.Client, bucket_name: str
) -> None:
    """At the defaults (streaming writes): an fsync mid-file makes no object, as gcsfuse's;
    the close makes it, uploaded once (the fsync made a cut object, then the close sent
    the whole file again)."""
    mount = mount_factory()
    data = os.urandom(3 * MiB)
    with open(mount.path / "train.log", "wb") as handle:
        handle.write(data[: 2 * MiB])
        handle.flush()
        os.fsync(handle.fileno())
        assert list(gcs_client.list_blobs(bucket_name)) == []
        handle.write(data[2 * MiB :])
    blob = gcs_client.bucket(bucket_name).blob("train.log")
    assert blob.download_as_bytes() == data
    assert request(str(mount.path), "stats")["gcs"]["bytes_written"] == len(data)


def test_random_writes_through_the_mount_fall_back(
    mount_factory: MountFactory, gcs_client: storage.Client, bucket_name: str
) -> None:
    mount = mount_factory("--write-block-size-mb=1")
    with open(mount.path / "f", "wb") as handle:
        handle.write(b"x" * (3 * MiB))
        handle.flush()
        handle.seek(MiB)
        handle.write(b"y" * 10)
    blob = gcs_client.bucket(bucket_name).blob("f")
    assert blob.download_as_bytes() == b"x" * MiB + b"y" * 10 + b"x" * (2 * MiB - 10)


@pytest.mark.parametrize("args", [(), ("--enable-streaming-writes=false",), ("--write-back",)])
def test_written_bytes_are_counted_once(mount_factory: MountFactory, args: tuple[str, ...]) -> None:
    mount = mount_factory(*args)
    (mount.path / "small").write_bytes(os.urandom(MiB))  # below one streaming chunk
    (mount.path / "big").write_bytes(os.urandom(40 * MiB + 3))  # streamed, in chunks
    assert request(str(mount.path), "sync")["synced"]
    assert request(str(mount.path), "stats")["gcs"]["bytes_written"] == 41 * MiB + 3


@pytest.mark.trio
@pytest.mark.parametrize("before", ["absent", "in GCS"])
async def test_a_create_whose_upload_session_is_refused_leaves_no_name(
    streaming_fs: tuple[Filesystem, MemoryBucket], monkeypatch: pytest.MonkeyPatch, before: str
) -> None:
    """The inode was made before GCS was asked for the upload session: a create that said
    EACCES left a 0-byte file, listed and looked up, which `sync` then uploaded."""
    fs, bucket = streaming_fs
    if before == "in GCS":
        bucket.put("x", b"theirs")

    async def refused(*args: Any, **kwargs: Any) -> Any:
        raise AccessDenied("403: no storage.objects.create")

    monkeypatch.setattr(bucket, "open_upload", refused)
    with pytest.raises(AccessDenied):
        await fs.create(ROOT_INO, "x", os.O_WRONLY | os.O_CREAT)
    listing = fs.opendir(ROOT_INO)
    names = [entry[0] for entry in await fs.readdir(listing, 0)]
    fs.releasedir(listing)
    if before == "absent":
        with pytest.raises(NotFound):
            await fs.lookup(ROOT_INO, "x")
        assert "x" not in names
    else:
        assert (await fs.lookup(ROOT_INO, "x")).size == len(b"theirs")
        assert "x" in names
    await fs.sync_all()
    assert bucket.names() == ([] if before == "absent" else ["x"])
    if before == "in GCS":
        assert bucket.get("x") == b"theirs"
