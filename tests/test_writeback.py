"""Write-back in the core, over MemoryBucket: close() commits to the journal, a background
uploader makes it durable, a crash is finished by the next mount, and nothing is lost or
uploaded twice with different content. (Through a real mount: test_mount_writeback.py.)"""

from __future__ import annotations

import errno
import math
import os
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

from tierfs.core import records as records_module
from tierfs.core import writeback
from tierfs.core.background import Background
from tierfs.core.filesystem import Filesystem, Settings
from tierfs.core.inodes import ROOT_INO
from tierfs.core.records import MoveLog
from tierfs.core.uploader import MAX_YIELD_S, QUIET_S, Uploader
from tierfs.core.writeback import RECORD_XATTR, SPARE_FILES, Journal, Record
from tierfs.errors import AccessDenied, BackendError, NotFound, UploadedOtherBytes
from tierfs.storage.memory import MemoryBucket

pytestmark = pytest.mark.trio


def journal_files(journal: Journal) -> list[str]:
    """What the journal directory holds: a data file each, and a record for each committed
    one (an attribute of its data file, or a file beside it: see `records`); the empty
    files made ahead for the next creates (`Journal.make_spares`) and the journal's lock
    are not counted."""
    files = [p for p in journal.dir.iterdir() if p.is_file() and p.name != "journal.lock"]
    spares = journal.spare_paths()  # after the listing: a spare it saw is known by now
    data = [p for p in files if p.suffix == ".data" and p not in spares]
    other = [p.suffix for p in files if p.suffix not in (".data", ".json")]
    return sorted([".data"] * len(data) + ["record"] * len(journal.pending()) + other)


@pytest.fixture(autouse=True, params=["xattr", "files"])
def records(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Every test here runs with records as attributes and as files (the journal's file
    system has no user attributes: tmpfs before Linux 6.6, some overlays)."""
    if request.param == "files":
        monkeypatch.setattr(writeback, "xattrs_work", lambda directory: False)
    return str(request.param)


@pytest.fixture
async def bucket() -> MemoryBucket:
    return MemoryBucket("wb")


@pytest.fixture
def make_fs(tmp_path: Path, bucket: MemoryBucket) -> Callable[[], Filesystem]:
    made: list[Filesystem] = []

    def make() -> Filesystem:
        fs = Filesystem(
            bucket,
            Settings(temp_dir=str(tmp_path / "tmp"), implicit_dirs=True),
            journal=Journal(tmp_path / "cache", "wb"),
        )
        made.append(fs)
        return fs

    (tmp_path / "tmp").mkdir()
    yield make  # type: ignore[misc]
    for fs in made:
        fs.close()


@pytest.fixture
def live_fs(make_fs: Callable[[], Filesystem], nursery: trio.Nursery) -> Filesystem:
    """A write-back core with a background nursery (uploads, retries)."""
    fs = make_fs()
    fs.background = Background(nursery)
    return fs


async def write_new(fs: Filesystem, name: str, data: bytes, parent: int = ROOT_INO) -> int:
    handle, inode = await fs.create(parent, name, os.O_WRONLY)
    await fs.write(handle.fh, 0, data)
    await fs.release(handle.fh)
    return inode.ino


async def settle(fs: Filesystem) -> None:
    """Let the uploader run until nothing is queued. Bounded in real time: uploads run in
    worker threads, which the autojump clock (it skips the retry delays) does not wait for."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        await trio.sleep(0.5)  # with the autojump clock, a 60 s retry passes in 120 steps
        if fs.uploads_idle():
            return
    raise AssertionError(
        f"uploads did not settle: {fs.uploads.waiting()} queued, failed {fs._failed}"
    )


async def test_close_commits_locally_and_the_uploader_makes_it_durable(
    live_fs: Filesystem, bucket: MemoryBucket, nursery: trio.Nursery
) -> None:
    fs = live_fs
    await write_new(fs, "ckpt.bin", b"x" * 10_000)
    # close() returned: the bytes are on local disk, with a record; GCS has nothing yet.
    assert "ckpt.bin" not in bucket.names()
    assert journal_files(fs.journal) == [".data", "record"]  # type: ignore[arg-type]
    assert fs.pending_uploads() == 1
    inode = await fs.lookup(ROOT_INO, "ckpt.bin")  # visible and readable meanwhile
    handle = await fs.open(inode.ino, os.O_RDONLY)
    assert bytes(await fs.read(handle.fh, 0, 20_000)) == b"x" * 10_000
    await fs.release(handle.fh)
    nursery.start_soon(fs.run_uploads, 2)
    await settle(fs)
    assert bucket.get("ckpt.bin") == b"x" * 10_000
    assert journal_files(fs.journal) == []  # type: ignore[arg-type]
    assert fs.statistics()["writeback"]["uploaded"] == 1


async def test_fsync_is_local_durability(
    make_fs: Callable[[], Filesystem], bucket: MemoryBucket
) -> None:
    fs = make_fs()
    handle, _ = await fs.create(ROOT_INO, "f", os.O_WRONLY)
    await fs.write(handle.fh, 0, b"durable")
    before = bucket.statistics()["requests"]
    await fs.fsync(handle.fh)
    assert bucket.statistics()["requests"] == before  # not one GCS request
    assert journal_files(fs.journal) == [".data", "record"]  # type: ignore[arg-type]
    assert fs.pending_uploads() == 1
    await fs.write(handle.fh, 7, b" again")  # written after the fsync: committed again
    await fs.fsync(handle.fh)
    await fs.release(handle.fh)
    await fs.sync_all()
    assert bucket.get("f") == b"durable again"


def fsync_fs(tmp_path: Path, bucket: MemoryBucket, *, to_gcs: bool) -> Filesystem:
    """A write-back filesystem with or without ``write:fsync-to-gcs``."""
    settings = Settings(temp_dir=str(tmp_path), fsync_to_gcs=to_gcs)
    return Filesystem(bucket, settings, journal=Journal(tmp_path / "cache", "wb"))


async def test_fsync_to_gcs_waits_for_gcs(tmp_path: Path, bucket: MemoryBucket) -> None:
    fs = fsync_fs(tmp_path, bucket, to_gcs=True)
    handle, _ = await fs.create(ROOT_INO, "f", os.O_WRONLY)
    await fs.write(handle.fh, 0, b"durable")
    await fs.flush(handle.fh)
    assert "f" not in bucket.names()
    await fs.fsync(handle.fh)
    assert bucket.get("f") == b"durable"
    await fs.release(handle.fh)
    assert journal_files(fs.journal) == []  # type: ignore[arg-type]
    fs.close()


@pytest.mark.parametrize("to_gcs", [True, False])
async def test_a_failing_upload_is_an_fsyncs_error_only_with_fsync_to_gcs(
    tmp_path: Path, bucket: MemoryBucket, to_gcs: bool
) -> None:
    """With ``write:fsync-to-gcs`` the fsync uploads, and GCS's refusal is its error (the
    next one tries again); a plain write-back fsync is local durability and succeeds."""
    fs = fsync_fs(tmp_path, bucket, to_gcs=to_gcs)
    handle, _ = await fs.create(ROOT_INO, "f", os.O_WRONLY)
    await fs.write(handle.fh, 0, b"durable")
    bucket.fail_next("write_file", BackendError("503 from GCS"))
    if to_gcs:
        with pytest.raises(BackendError):
            await fs.fsync(handle.fh)
        await fs.fsync(handle.fh)
        assert bucket.get("f") == b"durable"
    else:
        await fs.fsync(handle.fh)
        assert "f" not in bucket.names()
    await fs.release(handle.fh)
    fs.close()


async def test_sync_of_a_path_uploads_only_what_is_below_it(
    make_fs: Callable[[], Filesystem], bucket: MemoryBucket
) -> None:
    fs = make_fs()
    for directory in ("a", "ab"):
        parent = await fs.mkdir(ROOT_INO, directory)
        await write_new(fs, "f", directory.encode(), parent.ino)
    await fs.sync_all("a")
    assert bucket.get("a/f") == b"a"
    assert "ab/f" not in bucket.names()
    assert fs.pending_uploads() == 2  # ab/ (its placeholder, a journal record) and ab/f


async def test_a_crash_before_the_upload_is_finished_by_the_next_mount(
    make_fs: Callable[[], Filesystem], bucket: MemoryBucket, tmp_path: Path
) -> None:
    fs = make_fs()
    await write_new(fs, "a", b"first file")
    await write_new(fs, "b", b"second file")
    handle, _ = await fs.create(ROOT_INO, "never-closed", os.O_WRONLY)
    await fs.write(handle.fh, 0, b"no promise was made")
    fs.close()  # kill -9: no sync, no unmount
    assert bucket.names() == []
    journal = Journal(tmp_path / "cache", "wb")
    done = await journal.recover(bucket, trio.to_thread.run_sync)
    assert sorted(done.uploaded) == ["a", "b"] and done.uncommitted == 1
    assert (bucket.get("a"), bucket.get("b")) == (b"first file", b"second file")
    assert journal_files(journal) == []
    again = await journal.recover(bucket, trio.to_thread.run_sync)
    assert (again.uploaded, again.already_there, again.conflicts) == ([], [], [])


async def test_a_file_written_in_place_after_its_close_is_never_uploaded_torn(
    make_fs: Callable[[], Filesystem], bucket: MemoryBucket, tmp_path: Path
) -> None:
    """Closed (committed, not uploaded yet), opened again and half rewritten in place, then
    kill -9 before the next close. The record still named the closed size, and the next
    mount uploaded what the file held: half the new bytes on the old, a state nobody ever
    closed. It is kept aside now, with an error that says so."""
    fs = make_fs()
    ino = await write_new(fs, "f", b"the closed version")
    handle = await fs.open(ino, os.O_RDWR)
    await fs.write(handle.fh, 0, b"THE NEW")
    fs.close()  # kill -9 while it is open
    journal = Journal(tmp_path / "cache", "wb")
    done = await journal.recover(bucket, trio.to_thread.run_sync)
    assert bucket.names() == [] and done.uploaded == []
    assert [p.read_bytes() for p in done.conflicts] == [b"THE NEWsed version"]


async def test_a_crash_after_the_upload_uploads_nothing_twice(
    make_fs: Callable[[], Filesystem], bucket: MemoryBucket, tmp_path: Path
) -> None:
    fs = make_fs()
    await write_new(fs, "a", b"uploaded just before the crash")
    record = fs.journal.pending()[0]  # type: ignore[union-attr]
    bucket.put("a", b"uploaded just before the crash")  # the upload landed; the record stayed
    writes = bucket.statistics()["requests"]
    fs.close()
    journal = Journal(tmp_path / "cache", "wb")
    done = await journal.recover(bucket, trio.to_thread.run_sync)
    assert done.already_there == ["a"] and done.uploaded == []
    assert bucket.statistics()["requests"] == writes + 1  # one stat, no write
    assert not journal.data_path(record.id).exists()


async def test_another_writer_wins_and_our_bytes_are_kept_aside(
    make_fs: Callable[[], Filesystem], bucket: MemoryBucket, tmp_path: Path
) -> None:
    bucket.put("shared", b"v1")
    fs = make_fs()
    inode = await fs.lookup(ROOT_INO, "shared")
    handle = await fs.open(inode.ino, os.O_WRONLY)
    await fs.write(handle.fh, 0, b"ours")
    await fs.release(handle.fh)
    bucket.put("shared", b"theirs")
    fs.close()
    journal = Journal(tmp_path / "cache", "wb")
    done = await journal.recover(bucket, trio.to_thread.run_sync)
    assert bucket.get("shared") == b"theirs"
    assert [p.read_bytes() for p in done.conflicts] == [b"ours"]
    assert done.conflicts[0].parent == journal.conflicts_dir


async def test_rename_before_upload_is_local_and_uploads_the_final_name(
    live_fs: Filesystem, bucket: MemoryBucket, nursery: trio.Nursery
) -> None:
    fs = live_fs
    step = await fs.mkdir(ROOT_INO, "step_10.orbax-checkpoint-tmp")
    for name in ("a.msgpack", "b.msgpack"):
        await write_new(fs, name, name.encode() * 100, parent=step.ino)
    await write_new(fs, ".metadata.tmp", b"{}")
    await fs.rename(ROOT_INO, ".metadata.tmp", ROOT_INO, ".metadata")
    await fs.rename(ROOT_INO, "step_10.orbax-checkpoint-tmp", ROOT_INO, "step_10")
    copies = bucket.statistics().get("copies", 0)
    nursery.start_soon(fs.run_uploads, 2)
    await settle(fs)
    assert sorted(bucket.names()) == [
        ".metadata",
        "step_10/",
        "step_10/a.msgpack",
        "step_10/b.msgpack",
    ]
    assert bucket.get("step_10/a.msgpack") == b"a.msgpack" * 100
    assert bucket.statistics().get("copies", 0) == copies  # the files were never copied


async def test_rename_of_an_uploaded_tree_ignores_rename_dir_limit(
    live_fs: Filesystem, bucket: MemoryBucket, nursery: trio.Nursery
) -> None:
    """Write-back at the default delay uploads an Orbax tmp directory before its rename:
    the rename moves it, whatever rename-dir-limit (0 here) says, journaled and in the
    background: the new names answer at once, read from the old objects until moved."""
    fs = live_fs
    nursery.start_soon(fs.run_uploads, 2)
    tmp = await fs.mkdir(ROOT_INO, "step_1.tmp")
    sub = await fs.mkdir(tmp.ino, "params")
    await write_new(fs, "a", b"A" * 100, parent=sub.ino)
    await write_new(fs, "b", b"B" * 100, parent=tmp.ino)
    await settle(fs)
    assert "step_1.tmp/params/a" in bucket.names()
    copies = bucket.statistics().get("copies", 0)
    await fs.rename(ROOT_INO, "step_1.tmp", ROOT_INO, "step_1")
    assert bucket.statistics().get("copies", 0) == copies  # nothing moved inside the call
    with pytest.raises(NotFound):
        await fs.lookup(ROOT_INO, "step_1.tmp")
    step = await fs.lookup(ROOT_INO, "step_1")
    assert [name for name, _, _ in await fs.readdir(fs.opendir(ROOT_INO), 0)] == ["step_1"]
    assert sorted(n for n, _, _ in await fs.readdir(fs.opendir(step.ino), 0)) == ["b", "params"]
    inode = await fs.lookup(step.ino, "b")
    handle = await fs.open(inode.ino, os.O_RDONLY)
    assert bytes(await fs.read(handle.fh, 0, 200)) == b"B" * 100
    await fs.sync_all()  # durable in GCS: moved
    assert sorted(bucket.names()) == ["step_1/", "step_1/b", "step_1/params/", "step_1/params/a"]
    assert fs.journal is not None and fs.journal.moves.pending() == []
    assert bytes(await fs.read(handle.fh, 0, 200)) == b"B" * 100  # from the new object now
    await fs.release(handle.fh)


class Crash(BaseException):
    """The daemon dies here (kill -9): nothing after this line of the rename runs."""


class CrashingBucket(MemoryBucket):
    """Counts copies and deletes; the one after ``survive`` of them crashes."""

    def __init__(self, survive: int) -> None:
        super().__init__("wb")
        self.survive = survive
        self.calls = 0

    def _tick(self) -> None:
        self.calls += 1
        if self.calls > self.survive:
            raise Crash

    async def copy(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        self._tick()
        return await super().copy(*args, **kwargs)

    async def delete(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        self._tick()
        return await super().delete(*args, **kwargs)


@pytest.mark.parametrize("survive", [0, 1, 4, 7, 10])
async def test_a_crash_anywhere_in_a_directory_rename_is_finished_by_the_next_mount(
    tmp_path: Path, survive: int
) -> None:
    bucket = CrashingBucket(survive=10_000)
    tree = {f"t/d{i % 2}/f{i}": bytes([i]) * (i + 1) for i in range(5)}
    for name, data in tree.items():
        await bucket.write_bytes(name, data, if_generation_match=0)
    await bucket.write_bytes("t/", b"", if_generation_match=0)
    settings = Settings(temp_dir=str(tmp_path), implicit_dirs=True)
    fs = Filesystem(bucket, settings, journal=Journal(tmp_path / "cache", "wb"))
    handle, _ = await fs.create((await fs.lookup(ROOT_INO, "t")).ino, "late", os.O_WRONLY)
    await fs.write(handle.fh, 0, b"committed under the old name")
    await fs.release(handle.fh)  # committed, not uploaded (no uploader runs)
    bucket.survive, bucket.calls = survive, 0
    with pytest.raises((Crash, BaseExceptionGroup)):
        await fs.rename(ROOT_INO, "t", ROOT_INO, "final")
    fs.close()
    bucket.survive = 10_000
    journal = Journal(tmp_path / "cache", "wb")  # the next mount
    recovered = await journal.recover(bucket, trio.to_thread.run_sync)
    assert len(recovered.moves) == 1
    expected = {"final/" + name[2:]: data for name, data in tree.items()}
    expected |= {"final/": b"", "final/late": b"committed under the old name"}
    assert {n: bucket.get(n) for n in bucket.names()} == expected
    assert journal.moves.pending() == [] and journal.pending() == []


async def test_unlink_before_upload_uploads_nothing(
    live_fs: Filesystem, bucket: MemoryBucket, nursery: trio.Nursery
) -> None:
    fs = live_fs
    await write_new(fs, "scratch", b"temporary")
    await fs.unlink(ROOT_INO, "scratch")
    nursery.start_soon(fs.run_uploads, 1)
    await settle(fs)
    assert bucket.names() == []
    assert journal_files(fs.journal) == []  # type: ignore[arg-type]


async def test_failed_upload_is_counted_retried_and_reported(
    live_fs: Filesystem,
    bucket: MemoryBucket,
    nursery: trio.Nursery,
    autojump_clock: object,  # (pytest-trio uses a clock only when the test asks for it)
) -> None:
    fs = live_fs
    bucket.fail_next("write_file", BackendError("503 from GCS"), count=2)
    ino = await write_new(fs, "f", b"data")
    nursery.start_soon(fs.run_uploads, 1, 60.0)
    deadline = time.monotonic() + 10
    while fs.writeback_counts["failed"] < 1 and time.monotonic() < deadline:
        await trio.sleep(0.001)  # the first attempt fails; its retry waits 60 s
    stats = fs.statistics()["writeback"]
    assert (stats["failed"], stats["failing"], stats["pending"]) == (1, 1, 1)
    assert "f" not in bucket.names()
    assert journal_files(fs.journal) == [".data", "record"]  # type: ignore[arg-type]
    with pytest.raises(BackendError):  # `tierfs sync` reports it (and tries again)
        await fs.sync_all()
    await settle(fs)  # the retry, 60 s later, succeeds
    assert bucket.get("f") == b"data"
    assert fs.statistics()["writeback"]["failing"] == 0
    assert fs.inodes.get(ino) is None or fs.inodes[ino].staged is None


async def test_conflict_found_by_the_uploader_keeps_our_bytes(
    live_fs: Filesystem, bucket: MemoryBucket, nursery: trio.Nursery
) -> None:
    fs = live_fs
    await write_new(fs, "f", b"ours")
    bucket.put("f", b"theirs")  # another client creates it first
    nursery.start_soon(fs.run_uploads, 1)
    await settle(fs)
    assert bucket.get("f") == b"theirs"
    kept = list(fs.journal.conflicts_dir.iterdir())  # type: ignore[union-attr]
    assert [p.read_bytes() for p in kept] == [b"ours"]
    assert fs.statistics()["writeback"]["conflicts"] == 1


async def test_an_upload_that_failed_then_met_a_conflict_is_no_longer_failing(
    live_fs: Filesystem,
    bucket: MemoryBucket,
    nursery: trio.Nursery,
    autojump_clock: object,
) -> None:
    """An upload fails (counted as failing), another client writes the object, and the
    retry finds the conflict: our bytes are kept aside and the file is no longer failing
    (`tierfs stats` said "failing 1" for good, though nothing would be tried again)."""
    fs = live_fs
    bucket.fail_next("write_file", BackendError("503 from GCS"), count=1)
    await write_new(fs, "f", b"ours")
    nursery.start_soon(fs.run_uploads, 1, 60.0)
    deadline = time.monotonic() + 10
    while fs.writeback_counts["failed"] < 1 and time.monotonic() < deadline:
        await trio.sleep(0.001)
    assert fs.statistics()["writeback"]["failing"] == 1
    bucket.put("f", b"theirs")  # before the retry, 60 s later
    await settle(fs)
    assert bucket.get("f") == b"theirs"
    stats = fs.statistics()["writeback"]
    assert (stats["conflicts"], stats["failing"], stats["pending"]) == (1, 0, 0), stats


async def test_uploader_queues_once_retries_with_backoff_and_uploads_again(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """The uploader's policy on its own: a key queued twice is uploaded once; a failure is
    retried after 5, 10, 20 s; a file committed again during its upload goes up again."""
    attempts: list[tuple[str, float]] = []
    fail_first = 3
    again = {"b": 1}

    async def attempt(item: str) -> bool:
        attempts.append((item, trio.current_time()))
        await trio.sleep(1)
        if item == "a" and sum(1 for name, _ in attempts if name == "a") <= fail_first:
            return False
        return True

    def committed_again(item: str) -> bool:
        if again.get(item, 0) > 0:
            again[item] -= 1
            return True
        return False

    uploader: Uploader[str] = Uploader(attempt, committed_again)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(uploader.run, 2, 5.0)
        await trio.sleep(0)
        start = trio.current_time()
        uploader.queue(1, "a")
        uploader.queue(1, "a")  # already queued: no second upload
        uploader.queue(2, "b")
        while not uploader.idle():
            await trio.sleep(0.5)
        nursery.cancel_scope.cancel()
    a_times = [round(t - start) for name, t in attempts if name == "a"]
    assert a_times == [0, 6, 17, 38]  # each retry waits 5, 10, 20 s after a 1 s attempt
    assert [name for name, _ in attempts].count("b") == 2  # committed again once


async def test_uploads_yield_to_writers_for_a_bounded_time(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """An upload starts once the writers have been quiet for QUIET_S, or after MAX_YIELD_S
    of a writer that never pauses (uploads are deferred, never starved)."""
    started: list[float] = []

    async def attempt(item: str) -> bool:
        started.append(trio.current_time())
        return True

    uploader: Uploader[str] = Uploader(attempt, lambda item: False)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(uploader.run, 1, 5.0)
        await trio.sleep(1)
        start = trio.current_time()
        uploader.busy()
        uploader.queue(1, "after a pause")
        await trio.sleep(0.05)
        uploader.busy()  # one more close 50 ms later
        while not uploader.idle():
            await trio.sleep(0.01)
        assert round(started[0] - start, 2) == round(0.05 + QUIET_S, 2)
        start = trio.current_time()
        uploader.queue(2, "beside a writer that never pauses")
        while not uploader.idle():
            uploader.busy()
            await trio.sleep(0.02)
        assert MAX_YIELD_S <= started[1] - start < MAX_YIELD_S + 0.1
        nursery.cancel_scope.cancel()


async def test_a_record_whose_data_did_not_all_reach_the_disk_is_kept_not_uploaded(
    make_fs: Callable[[], Filesystem], bucket: MemoryBucket, caplog: pytest.LogCaptureFixture
) -> None:
    """close() is not fsync: after a power cut a record can be on disk with its data cut
    short. The next mount sees the size differ and keeps the bytes aside."""
    fs = make_fs()
    await write_new(fs, "closed-only", b"x" * 10_000)
    await write_new(fs, "fine", b"y" * 100)
    journal = fs.journal
    assert journal is not None
    (short,) = [r for r in journal.pending() if r.object == "closed-only"]
    assert short.size == 10_000
    os.truncate(journal.data_path(short.id), 4096)  # what reached the disk
    fs.close()
    recovered = await Journal(journal.dir.parent.parent, "wb").recover(
        bucket, trio.to_thread.run_sync
    )
    assert recovered.uploaded == ["fine"]
    assert "closed-only" not in bucket.names()
    assert [p.stat().st_size for p in recovered.conflicts] == [4096]
    assert "not fsync'd" in caplog.text


async def test_fsync_makes_a_closed_file_durable_too(make_fs: Callable[[], Filesystem]) -> None:
    """A file committed by close, then opened and fsync'd without a write: fsync still
    makes it durable (the close's commit was not)."""
    fs = make_fs()
    ino = await write_new(fs, "f", b"data")
    handle = await fs.open(ino, os.O_RDONLY)
    staged = fs.inodes.by_ino[ino].staged
    assert staged is not None and staged.durable_version is None
    await fs.fsync(handle.fh)
    assert staged.durable_version == staged.version
    await fs.release(handle.fh)


async def test_uploads_yield_while_a_file_is_open_for_writing(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Writes through passthrough never reach the daemon: an open writable file is what
    says a save is in progress."""
    started: list[float] = []
    writing = [True]

    async def attempt(item: str) -> bool:
        started.append(trio.current_time())
        return True

    uploader: Uploader[str] = Uploader(attempt, lambda item: False, writing=lambda: writing[0])
    async with trio.open_nursery() as nursery:
        nursery.start_soon(uploader.run, 1, 5.0)
        start = trio.current_time()
        uploader.queue(1, "closed while another file is written")
        await trio.sleep(2)
        assert started == []
        writing[0] = False  # the last writer closes
        while not uploader.idle():
            await trio.sleep(0.01)
        assert 2 <= started[0] - start <= 2 + QUIET_S + 0.01  # within QUIET_S of the close
        nursery.cancel_scope.cancel()


async def test_a_record_is_an_attribute_of_its_data_file_where_the_disk_has_them(
    make_fs: Callable[[], Filesystem], records: str
) -> None:
    fs = make_fs()
    await write_new(fs, "f", b"one inode per file")
    journal = fs.journal
    assert journal is not None and journal.xattrs == (records == "xattr")
    (record,) = journal.pending()
    on_disk = sorted(
        p.name for p in journal.dir.iterdir() if p.is_file() and p.name != "journal.lock"
    )
    if records == "xattr":
        assert on_disk == [f"{record.id}.data"]
        assert b'"object": "f"' in os.getxattr(journal.data_path(record.id), RECORD_XATTR)
    else:
        assert on_disk == [f"{record.id}.data", f"{record.id}.json"]


async def test_a_record_too_large_for_an_attribute_goes_to_a_file_and_is_recovered(
    make_fs: Callable[[], Filesystem], bucket: MemoryBucket, tmp_path: Path
) -> None:
    fs = make_fs()
    journal = fs.journal
    assert journal is not None
    record_id, fd = journal.new_file()
    os.write(fd, b"data")
    big = Record(record_id, "big", 0, {"k": "v" * 70_000}, None, 4)  # > 64 KiB: no xattr holds it
    journal.commit(fd, big, durable=True)
    os.close(fd)
    assert journal.record_path(record_id).exists()
    small_id, fd = journal.new_file()
    os.write(fd, b"small")
    journal.commit(fd, Record(small_id, "small", 0, {}, None, 5), durable=False)
    os.close(fd)
    fs.close()
    done = await Journal(tmp_path / "cache", "wb").recover(bucket, trio.to_thread.run_sync)
    assert sorted(done.uploaded) == ["big", "small"]
    assert (bucket.get("big"), bucket.get("small")) == (b"data", b"small")
    assert (await bucket.stat("big")).metadata["k"] == "v" * 70_000
    assert journal_files(journal) == []


async def test_a_record_that_outgrows_its_attribute_replaces_it_and_back(
    make_fs: Callable[[], Filesystem], bucket: MemoryBucket, tmp_path: Path
) -> None:
    """A committed record rewritten too large for an attribute (a rename to a long name,
    large metadata) went to a file beside the data, and the old attribute stayed: recovery
    prefers the attribute, so it uploaded under the old name. And back: a small record
    as the attribute again takes the file it left away (one record each)."""
    fs = make_fs()
    journal = fs.journal
    assert journal is not None
    record_id, fd = journal.new_file()
    os.write(fd, b"data")
    journal.commit(fd, Record(record_id, "old", 0, {}, None, 4), durable=True)
    os.close(fd)
    journal.write_record(Record(record_id, "big", 0, {"k": "v" * 70_000}, None, 4))
    assert [r.object for r in journal.pending()] == ["big"]
    journal.write_record(Record(record_id, "small", 0, {}, None, 4))
    assert [r.object for r in journal.pending()] == ["small"]
    assert journal.record_path(record_id).exists() == (not journal.xattrs)
    fs.close()
    done = await Journal(tmp_path / "cache", "wb").recover(bucket, trio.to_thread.run_sync)
    assert done.uploaded == ["small"] and bucket.names() == ["small"]


async def test_an_unreadable_record_keeps_its_data(
    make_fs: Callable[[], Filesystem], bucket: MemoryBucket, records: str
) -> None:
    fs = make_fs()
    await write_new(fs, "f", b"never thrown away")
    journal = fs.journal
    assert journal is not None
    (record,) = journal.pending()
    if records == "xattr":
        os.setxattr(journal.data_path(record.id), RECORD_XATTR, b"{not json")
    else:
        journal.record_path(record.id).write_bytes(b"{not json")
    assert journal.pending() == [] and journal.uncommitted() == []
    fs.close()
    done = await Journal(journal.dir.parent.parent, "wb").recover(bucket, trio.to_thread.run_sync)
    assert done.uncommitted == 0
    assert journal.data_path(record.id).read_bytes() == b"never thrown away"


async def wait_for_spares(fs: Filesystem) -> None:
    deadline = time.monotonic() + 10
    while fs._spares_coming and time.monotonic() < deadline:
        await trio.sleep(0.01)  # a thread makes them


async def test_spare_journal_files_are_made_ahead_and_a_crash_leaves_nothing_of_them(
    live_fs: Filesystem, bucket: MemoryBucket, tmp_path: Path
) -> None:
    fs = live_fs
    journal = fs.journal
    assert journal is not None
    await write_new(fs, "a", b"first")
    await wait_for_spares(fs)
    assert journal.spares == SPARE_FILES
    made_ahead = journal.spare_paths()
    ino = await write_new(fs, "b", b"second")
    staged = fs.inodes.by_ino[ino].staged
    assert staged is not None and staged.record_id is not None
    assert journal.data_path(staged.record_id) in made_ahead  # create() took one
    await wait_for_spares(fs)
    left = journal.spare_paths()
    assert left and all(p.stat().st_size == 0 for p in left)
    # kill -9 now: the next mount deletes the spares as uncommitted and uploads a and b only
    done = await Journal(tmp_path / "cache", "wb").recover(bucket, trio.to_thread.run_sync)
    assert sorted(done.uploaded) == ["a", "b"] and done.uncommitted == len(left)
    assert not any(p.exists() for p in left)


async def test_closing_the_core_removes_its_spare_files(
    live_fs: Filesystem, bucket: MemoryBucket
) -> None:
    fs = live_fs
    await write_new(fs, "a", b"x")
    await wait_for_spares(fs)
    assert fs.journal is not None and fs.journal.spares
    spares = fs.journal.spare_paths()
    fs.close()
    assert fs.journal.spares == 0 and not any(p.exists() for p in spares)


async def uploaded(fs: Filesystem, nursery: trio.Nursery, tree: dict[str, bytes]) -> None:
    """Write ``tree`` (files under directories made here) and let the uploader take it all."""
    for name, data in tree.items():
        parent = ROOT_INO
        *dirs, leaf = name.split("/")
        for part in dirs:
            try:
                parent = (await fs.lookup(parent, part)).ino
            except NotFound:
                parent = (await fs.mkdir(parent, part)).ino
        await write_new(fs, leaf, data, parent)
    await fs.sync_all()


async def deletes_done(fs: Filesystem) -> None:
    deadline = time.monotonic() + 30
    while fs.pending_deletes and time.monotonic() < deadline:
        await trio.sleep(0.01)  # the deleter's requests run in worker threads
    assert not fs.pending_deletes, f"{len(fs.pending_deletes)} deletes still pending"


async def test_unlink_of_a_file_in_gcs_asks_gcs_nothing_and_a_worker_deletes_it(
    live_fs: Filesystem, bucket: MemoryBucket, nursery: trio.Nursery
) -> None:
    fs = live_fs
    await uploaded(fs, nursery, {"old.ckpt": b"old", "kept": b"kept"})
    before = bucket.statistics()["requests"]
    await fs.unlink(ROOT_INO, "old.ckpt")
    assert bucket.statistics()["requests"] == before  # returned without GCS
    assert bucket.get("old.ckpt") == b"old"  # still there: its delete waits for a worker
    with pytest.raises(NotFound):
        await fs.lookup(ROOT_INO, "old.ckpt")
    assert [name for name, _ in await fs._list(fs.inodes[ROOT_INO])] == ["kept"]
    assert fs.statistics()["writeback"]["deleting"] == 1  # type: ignore[index]
    assert fs.journal is not None and len(fs.journal.deletes.pending()) == 1
    nursery.start_soon(fs.run_uploads, 2)
    await deletes_done(fs)
    assert bucket.names() == ["kept"]
    assert fs.journal.deletes.pending() == []


async def test_rm_rf_of_a_tree_in_gcs_returns_before_gcs_deletes_it(
    live_fs: Filesystem, bucket: MemoryBucket, nursery: trio.Nursery
) -> None:
    """`rm -rf step_90`: its files, then its directories, though GCS still holds them."""
    fs = live_fs
    for name in ("step_90/", "step_90/d0/", "step_90/d1/", "step_90/d2/"):
        bucket.put(name, b"")  # a step saved by an earlier mount: not made here
    for i in range(12):
        bucket.put(f"step_90/d{i % 3}/f{i}", bytes([i]))
    step = await fs.lookup(ROOT_INO, "step_90")
    for d in range(3):
        sub = await fs.lookup(step.ino, f"d{d}")
        for name, _ in await fs._list(sub):
            await fs.unlink(sub.ino, name)
        await fs.rmdir(step.ino, f"d{d}")  # empty here, though GCS still lists its files
    await fs.rmdir(ROOT_INO, "step_90")
    assert any(name.startswith("step_90/d") for name in bucket.names())
    assert await fs._list(fs.inodes[ROOT_INO]) == []
    with pytest.raises(NotFound):
        await fs.lookup(ROOT_INO, "step_90")
    nursery.start_soon(fs.run_uploads, 4)
    await deletes_done(fs)
    assert bucket.names() == []
    with pytest.raises(NotFound):
        await fs.lookup(ROOT_INO, "step_90")


async def test_a_create_at_a_name_being_deleted_waits_for_its_delete(
    live_fs: Filesystem, bucket: MemoryBucket, nursery: trio.Nursery
) -> None:
    fs = live_fs
    await uploaded(fs, nursery, {"latest": b"step 1"})
    await fs.unlink(ROOT_INO, "latest")
    bucket.fail_next("delete", BackendError("503"))  # the delete is retried 50 ms later
    nursery.start_soon(fs.run_uploads, 2, 0.05)
    await write_new(fs, "latest", b"step 2")  # its upload must find the old object gone
    await fs.sync_all()
    assert bucket.get("latest") == b"step 2"
    assert fs.writeback_counts["conflicts"] == 0


async def test_a_background_delete_leaves_a_newer_object_of_another_client(
    live_fs: Filesystem, bucket: MemoryBucket, nursery: trio.Nursery
) -> None:
    fs = live_fs
    await uploaded(fs, nursery, {"shared": b"ours"})
    await fs.unlink(ROOT_INO, "shared")
    bucket.put("shared", b"theirs")  # a new generation, before our delete ran
    nursery.start_soon(fs.run_uploads, 2)
    await deletes_done(fs)
    assert bucket.get("shared") == b"theirs"


async def test_a_crash_before_the_delete_is_finished_by_the_next_mount(
    live_fs: Filesystem, bucket: MemoryBucket, nursery: trio.Nursery, tmp_path: Path
) -> None:
    fs = live_fs
    await uploaded(fs, nursery, {"a/gone": b"1", "a/kept": b"2"})
    a = await fs.lookup(ROOT_INO, "a")
    await fs.unlink(a.ino, "gone")
    assert "a/gone" in bucket.names()
    # kill -9 now (no deleter ran): the next mount deletes it from the journal
    done = await Journal(tmp_path / "cache", "wb").recover(bucket, trio.to_thread.run_sync)
    assert [d.object for d in done.deletes] == ["a/gone"]
    assert sorted(bucket.names()) == ["a/", "a/kept"]
    assert fs.journal is not None and fs.journal.deletes.pending() == []


async def test_a_failing_delete_is_retried_and_stays_hidden(
    live_fs: Filesystem, bucket: MemoryBucket, nursery: trio.Nursery
) -> None:
    fs = live_fs
    await uploaded(fs, nursery, {"f": b"x"})
    await fs.unlink(ROOT_INO, "f")
    bucket.fail_next("delete", BackendError("503"))
    nursery.start_soon(fs.run_uploads, 1, 0.05)
    deadline = time.monotonic() + 10
    while fs.delete_errors == 0 and time.monotonic() < deadline:
        await trio.sleep(0.005)
    assert fs.delete_errors == 1 and bucket.names() == ["f"]
    with pytest.raises(NotFound):
        await fs.lookup(ROOT_INO, "f")  # hidden while it is retried
    await deletes_done(fs)
    assert bucket.names() == []


async def test_rmdir_does_not_count_deletes_that_finish_while_it_lists(
    tmp_path: Path, nursery: trio.Nursery
) -> None:
    """Over a real link the listing that rmdir makes takes a while, and background deletes
    finish meanwhile: objects it lists that were being deleted when it began still do not
    count (`rm -rf` over a +20 ms link failed with ENOTEMPTY)."""

    class DeletesFinishDuringLists(MemoryBucket):
        during_list: Callable[[], Awaitable[None]] | None = None

        async def list(self, *args: Any, **kwargs: Any) -> Any:
            listing = await super().list(*args, **kwargs)
            if self.during_list is not None:
                await self.during_list()
            return listing

    bucket = DeletesFinishDuringLists("wb")
    for name in ("t/", "t/a", "t/b"):
        bucket.put(name, b"")
    fs = Filesystem(
        bucket, Settings(temp_dir=str(tmp_path)), journal=Journal(tmp_path / "cache", "wb")
    )
    fs.background = Background(nursery)
    t = await fs.lookup(ROOT_INO, "t")
    for name in ("a", "b"):
        await fs.lookup(t.ino, name)
        await fs.unlink(t.ino, name)

    async def finish_them() -> None:
        for delete in list(fs.pending_deletes):  # type: ignore[call-overload]
            await fs._delete_in_background(delete)

    bucket.during_list = finish_them
    await fs.rmdir(ROOT_INO, "t")  # (no listing of t/ by this mount: it lists GCS)
    assert bucket.names() == ["t/"]  # its placeholder's delete is journaled, run next
    bucket.during_list = None
    await finish_them()
    assert bucket.names() == []
    fs.close()


@pytest.mark.parametrize("seed", range(20))
async def test_pending_deletes_answer_as_a_scan_of_them_would(seed: int) -> None:
    """`PendingDeletes.busy` keeps counts per directory instead of scanning; a model: the
    scan over what is pending, after random adds and finishes."""
    import random

    from tierfs.core.deletes import Delete, PendingDeletes

    rng = random.Random(seed)
    pending = PendingDeletes()
    live: dict[str, Delete] = {}
    paths = [f"{a}/{b}/f{c}" for a in "xy" for b in "pq" for c in range(3)] + ["x", "top"]
    for step in range(200):
        if live and rng.random() < 0.4:
            delete = live.pop(rng.choice(sorted(live)))
            pending.finished(delete)
        else:
            path = rng.choice(paths)
            if path not in live:
                live[path] = Delete(str(step), path, path, 1)
                pending.add(live[path])
        for probe in ["", "x", "x/p", "x/p/f0", "y", "y/q", "top", "nothing"]:
            model = [p for p in live if not probe or p == probe or p.startswith(probe + "/")]
            assert pending.busy(probe) == bool(model)
            assert sorted(d.path for d in pending.below(probe)) == sorted(model)


async def test_rmdir_of_a_directory_made_here_that_the_kernel_forgot_deletes_its_placeholder(
    live_fs: Filesystem, bucket: MemoryBucket, nursery: trio.Nursery
) -> None:
    """The kernel forgets inodes whenever it likes (``drop_caches``, memory pressure: on a
    busy machine, several times in a minute), and the core lets go of an uploaded one. The
    inode the next lookup makes knows no generation, yet the placeholder is in GCS: rmdir
    must still delete it, or the directory comes back in every later listing (seen in the
    fault model: ``n61``, ``n85``, ``n104`` listed after their rmdir)."""
    fs = live_fs
    made = await fs.mkdir(ROOT_INO, "n61")
    await fs.sync_all()
    assert bucket.names() == ["n61/"]
    fs.forget(made.ino, made.lookups)
    assert fs.inodes.current("n61") is None
    again = await fs.lookup(ROOT_INO, "n61")
    assert again is not made
    await fs.rmdir(ROOT_INO, "n61")
    assert [d.object for d in fs.pending_deletes] == ["n61/"]  # type: ignore[attr-defined]
    assert await fs._list(fs.inodes[ROOT_INO]) == []
    nursery.start_soon(fs.run_uploads, 2)
    await deletes_done(fs)
    assert bucket.names() == []
    assert await fs._list(fs.inodes[ROOT_INO]) == []


class UploadsDuringLists(MemoryBucket):
    """Runs ``during_list`` once an answer is taken and before it is returned: what ends
    then is not in the answer, as over a slow link."""

    during_list: Callable[[], Awaitable[None]] | None = None

    async def list(self, *args: Any, **kwargs: Any) -> Any:
        listing = await super().list(*args, **kwargs)
        hook, self.during_list = self.during_list, None
        if hook is not None:
            await hook()
        return listing


async def test_a_directory_uploaded_and_let_go_of_while_its_parent_is_listed_is_listed(
    tmp_path: Path,
) -> None:
    """A directory made here whose placeholder goes up while its parent's listing is on its
    way is not in that listing (GCS answered before), so the listing counts what was local
    when it was sent. If the kernel has forgotten the directory meanwhile (``drop_caches``),
    the core lets go of its inode the moment the upload ends: it must still be listed
    (seen in the fault model: ``e`` missing from the root listing right after the kernel
    forgot ``d``, ``e`` and ``e/f``)."""

    bucket = UploadsDuringLists("wb")
    fs = Filesystem(
        bucket, Settings(temp_dir=str(tmp_path)), journal=Journal(tmp_path / "cache", "wb")
    )
    made = await fs.mkdir(ROOT_INO, "e")
    fs.forget(made.ino, made.lookups)  # kept while its placeholder is only a record

    async def upload() -> None:
        await fs._upload_in_background(made)
        assert bucket.names() == ["e/"]

    bucket.during_list = upload
    assert [name for name, _ in await fs._list(fs.inodes[ROOT_INO])] == ["e"]
    assert [name for name, _ in await fs._list(fs.inodes[ROOT_INO])] == ["e"]
    await fs.rmdir(ROOT_INO, "e")
    assert await fs._list(fs.inodes[ROOT_INO]) == []
    for delete in list(fs.pending_deletes):  # type: ignore[call-overload]
        await fs._delete_in_background(delete)  # (its placeholder's delete, journaled)
    assert bucket.names() == [] and await fs._list(fs.inodes[ROOT_INO]) == []
    fs.close()


class SendsWhatItReads(MemoryBucket):
    """Takes the file's checksum, then reads the body, as GcsBucket does; stores what
    it read, as the emulator does."""

    during_send: Callable[[], Awaitable[None]] | None = None

    async def write_file(self, name: str, path: str, **kwargs: Any) -> Any:
        declared = await trio.Path(path).read_bytes()
        if self.during_send is None:
            return await super().write_file(name, path, **kwargs)
        hook, self.during_send = self.during_send, None
        await hook()
        now = await trio.Path(path).read_bytes()
        half = len(declared) // 2
        body = declared[:half] + now[half : len(declared)]  # its size was taken first
        info = await self._write(
            "write_file",
            name,
            body,
            kwargs["if_generation_match"],
            kwargs.get("metadata"),
            kwargs.get("content_type"),
        )
        raise UploadedOtherBytes(f"gs://wb/{name}: other bytes", info.generation)


async def test_a_file_rewritten_while_its_upload_is_sent_is_uploaded_again_over_what_it_made(
    tmp_path: Path, nursery: trio.Nursery
) -> None:
    """The kernel's writes to a file it writes directly (FUSE passthrough) do not wait for
    an upload, so a writer that had the file open before an upload of it began (an fsync
    with ``write:fsync-to-gcs``) and writes while it is sent gives the server other bytes than its
    checksum was taken of. (An open for writing after the upload began, and a write that
    reaches the daemon, wait for it: `test_writeback_filerename.py::
    test_a_file_opened_for_writing_during_its_upload_never_goes_up_torn`,
    `test_staging.py`.) GCS refuses
    such a body; the emulator stores it, and the bucket says so (`UploadedOtherBytes`,
    with the generation it made). That generation is ours: the next upload must replace
    it, not fail its precondition and send our bytes to conflicts/ while GCS keeps the mix
    (seen in the fault model: a read of ``d/b`` returned half of an older version, after
    'GCS holds other bytes than were sent' and a conflict)."""
    old, new = b"o" * 4000, b"n" * 6000

    bucket = SendsWhatItReads("wb")
    fs = Filesystem(
        bucket,
        Settings(temp_dir=str(tmp_path), fsync_to_gcs=True),
        journal=Journal(tmp_path / "cache", "wb"),
    )
    fs.background = Background(nursery)
    ino = await write_new(fs, "b", old)
    writer = await fs.open(ino, os.O_WRONLY)  # open before the upload begins
    staged = fs.inodes[ino].staged
    assert staged is not None
    staged.direct = True  # written by the kernel (passthrough): the daemon sees the file
    rewritten: list[int] = []

    async def rewrite() -> None:  # the writer's write, by the kernel; its close comes later
        os.pwrite(staged.fd, new, 0)
        rewritten.append(writer.fh)

    bucket.during_send = rewrite
    with pytest.raises(UploadedOtherBytes):
        await fs.fsync(writer.fh)
    assert bucket.get("b") not in (old, new)  # the mix the emulator kept
    nursery.start_soon(fs.run_uploads, 2, 0.05)
    await fs.release(rewritten[0])
    await settle(fs)
    assert fs.writeback_counts["conflicts"] == 0
    assert bucket.get("b") == new
    handle = await fs.open((await fs.lookup(ROOT_INO, "b")).ino, os.O_RDONLY)
    assert bytes(await fs.read(handle.fh, 0, 10_000)) == new
    await fs.release(handle.fh)
    fs.close()


async def test_a_file_unlinked_before_the_retry_of_an_upload_that_sent_other_bytes_is_deleted(
    tmp_path: Path, nursery: trio.Nursery
) -> None:
    """The object such an upload made (see above) is in GCS even though the upload failed:
    an unlink before the retry deletes it (it stayed, and was listed after the unlink)."""
    bucket = SendsWhatItReads("wb")
    fs = Filesystem(
        bucket, Settings(temp_dir=str(tmp_path)), journal=Journal(tmp_path / "cache", "wb")
    )
    fs.background = Background(nursery)
    ino = await write_new(fs, "c", b"o" * 4000)
    writer = await fs.open(ino, os.O_WRONLY)  # open before the upload begins
    staged = fs.inodes[ino].staged
    assert staged is not None
    staged.direct = True  # written by the kernel (passthrough): the daemon sees the file

    async def rewrite() -> None:  # the writer's write, by the kernel; its close comes later
        os.pwrite(staged.fd, b"n" * 6000, 0)

    bucket.during_send = rewrite
    with pytest.raises(UploadedOtherBytes):  # (an fsync's or a sync's upload)
        await fs._sync(fs.inodes[ino])
    assert bucket.names() == ["c"]
    await fs.unlink(ROOT_INO, "c")
    await fs.release(writer.fh)
    nursery.start_soon(fs.run_uploads, 2, 0.05)
    await deletes_done(fs)
    await settle(fs)
    assert bucket.names() == []
    assert await fs._list(fs.inodes[ROOT_INO]) == []
    fs.close()


async def test_a_listing_older_than_an_upload_that_ended_meanwhile_keeps_the_new_generation(
    tmp_path: Path,
) -> None:
    """A file rewritten here is local when its parent's listing is sent, and its upload
    ends before the answer comes: the answer names the old generation, and made the
    file's inode that one again, so a read gave ESTALE or, from a block of the old
    generation kept in a tier, the old bytes. What was local when the listing was sent is
    listed from what the mount knows."""
    bucket = UploadsDuringLists("wb")
    fs = Filesystem(
        bucket, Settings(temp_dir=str(tmp_path)), journal=Journal(tmp_path / "cache", "wb")
    )
    ino = await write_new(fs, "x", b"1" * 100)
    await fs.sync_all()
    old = (await bucket.stat("x")).generation
    handle = await fs.open(ino, os.O_WRONLY | os.O_TRUNC)
    await fs.write(handle.fh, 0, b"2" * 200)
    await fs.release(handle.fh)

    async def upload() -> None:
        assert await fs._upload_in_background(fs.inodes[ino])

    bucket.during_list = upload
    [(name, listed)] = await fs._list(fs.inodes[ROOT_INO])
    new = (await bucket.stat("x")).generation
    assert new != old
    assert (name, listed.ino, listed.generation, fs.attr(listed).size) == ("x", ino, new, 200)
    assert fs.inodes.current("x") is listed
    handle = await fs.open(listed.ino, os.O_RDONLY)
    assert bytes(await fs.read(handle.fh, 0, 1000)) == b"2" * 200
    await fs.release(handle.fh)
    fs.close()


async def test_a_directory_renamed_here_is_listed_while_it_moves_though_the_kernel_forgot_it(
    tmp_path: Path, nursery: trio.Nursery
) -> None:
    """While a background rename moves a directory's objects, the parent's listing adds the
    new name from the inode table: if the kernel forgot the directory meanwhile, the core had
    let go of its inode, and the name was in neither GCS (nothing copied yet) nor the table
    (a mount test listed an empty root right after ``rename t final``)."""

    class HeldMoves(MemoryBucket):
        """The move's first step (listing the old prefix whole) waits for ``go``."""

        go = trio.Event()

        async def list(self, prefix: str, **kwargs: Any) -> Any:
            if kwargs.get("delimiter", "/") is None and prefix == "t/":
                await self.go.wait()
            return await super().list(prefix, **kwargs)

    bucket = HeldMoves("wb")
    bucket.go = trio.Event()
    for name in ("t/", "t/a"):
        bucket.put(name, b"a")
    fs = Filesystem(
        bucket, Settings(temp_dir=str(tmp_path)), journal=Journal(tmp_path / "cache", "wb")
    )
    fs.background = Background(nursery)
    t = await fs.lookup(ROOT_INO, "t")
    await fs.rename(ROOT_INO, "t", ROOT_INO, "final")
    assert fs.pending_moves
    fs.forget(t.ino, t.lookups)
    assert [name for name, _ in await fs._list(fs.inodes[ROOT_INO])] == ["final"]
    final = await fs.lookup(ROOT_INO, "final")
    assert [name for name, _ in await fs._list(final)] == ["a"]
    bucket.go.set()
    await fs.sync_all()
    assert not fs.pending_moves and sorted(bucket.names()) == ["final/", "final/a"]
    assert [name for name, _ in await fs._list(fs.inodes[ROOT_INO])] == ["final"]
    fs.close()


async def test_a_lookup_answered_before_an_upload_ended_does_not_take_the_file_back(
    live_fs: Filesystem, bucket: MemoryBucket, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A lookup sent while the file was still the old generation (a listing retried over a
    faulty link) answers after this mount truncated the file and uploaded the truncation.
    Its answer is older than the inode's generation (GCS generations only grow): the inode
    stays, at its new size and bytes. Taken, it read the file back at its old size (found
    by the faulty-link model test in CI)."""
    fs = live_fs
    ino = await write_new(fs, "f", b"x" * 1000)
    await fs.sync_all()
    lookup = fs.names.lookup
    answered = trio.Event()
    asked = trio.Event()

    async def late_lookup(path: str) -> Any:
        found = await lookup(path)  # GCS's answer now: the old generation
        asked.set()
        await answered.wait()  # ... arriving only later
        return found

    monkeypatch.setattr(fs.names, "lookup", late_lookup)
    looked_up: list[int] = []

    async def look() -> None:
        looked_up.append((await fs.lookup(ROOT_INO, "f")).ino)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(look)
        await asked.wait()
        await fs.setattr(ino, size=10)  # truncated here, then uploaded
        await fs.sync_all()
        assert bucket.get("f") == b"x" * 10
        answered.set()
    assert looked_up == [ino]
    assert fs.attr(fs._inode(ino)).size == 10
    handle = await fs.open(ino, os.O_RDONLY)
    assert await fs.read(handle.fh, 0, 4096) == b"x" * 10
    await fs.release(handle.fh)


class DeletesRefused(MemoryBucket):
    """A bucket where this mount may write but not delete (a role without
    ``storage.objects.delete``), until ``refuse`` is False."""

    def __init__(self) -> None:
        super().__init__("wb")
        self.refuse = True

    async def delete(self, name: str, **kwargs: Any) -> None:
        if self.refuse:
            await trio.lowlevel.checkpoint()
            raise AccessDenied(f"{name}: storage.objects.delete denied")
        await super().delete(name, **kwargs)


async def test_a_create_behind_a_delete_that_keeps_failing_fails_rather_than_waits(
    tmp_path: Path, nursery: trio.Nursery, autojump_clock: trio.testing.MockClock
) -> None:
    """``rm f; touch f`` where GCS refuses the delete: the create waited for the delete,
    retried for ever, so it hung for good (and so did ``tierfs sync``). It now fails with
    the delete's error, and works once the delete does."""
    bucket = DeletesRefused()
    fs = Filesystem(
        bucket,
        Settings(temp_dir=str(tmp_path / "tmp"), implicit_dirs=True),
        journal=Journal(tmp_path / "cache", "wb"),
        background=Background(nursery),
    )
    await uploaded(fs, nursery, {"f": b"old"})
    nursery.start_soon(fs.run_uploads, 2)
    await fs.unlink(ROOT_INO, "f")
    with trio.fail_after(60), pytest.raises(BackendError, match="delete denied"):
        await write_new(fs, "f", b"new")
    await fs.finish()  # unmount: the failing delete is left to the journal, not raised
    bucket.refuse = False
    await deletes_done(fs)
    await write_new(fs, "f", b"new")
    await fs.sync_all()
    assert bucket.get("f") == b"new"
    fs.close()


async def test_a_journal_disk_gone_read_only_does_not_end_the_uploader(
    live_fs: Filesystem,
    bucket: MemoryBucket,
    nursery: trio.Nursery,
    monkeypatch: pytest.MonkeyPatch,
    autojump_clock: trio.testing.MockClock,
) -> None:
    """An upload done, the journal's file could not be removed (its file system remounted
    read-only, EIO): the error left the upload worker and ended the daemon. It is logged
    and the work retried, and the journal lets go of the file once it can."""
    fs = live_fs
    assert fs.journal is not None
    discard = fs.journal.discard
    failures = [OSError(errno.EROFS, "Read-only file system")]

    def failing(record_id: str) -> None:
        if failures:
            raise failures.pop()
        discard(record_id)

    monkeypatch.setattr(fs.journal, "discard", failing)
    await write_new(fs, "f", b"bytes")
    nursery.start_soon(fs.run_uploads, 2)
    await settle(fs)
    assert bucket.get("f") == b"bytes"
    assert failures == [] and fs.journal.pending() == []


async def test_one_journal_is_one_daemons(tmp_path: Path) -> None:
    """Two daemons of one bucket on one cache-dir shared its journal: the second one's
    recovery took the first one's spare files and files being written for leftovers of a
    crash and deleted them (the first then committed into unlinked files: a crash lost
    closed files), and uploaded the first one's pending records under it. The second is
    refused now; a mount of another only-dir has a journal of its own."""
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; from pathlib import Path; "
            "from tierfs.core.writeback import Journal; "
            "journal = Journal(Path(sys.argv[1]), 'wb'); journal.make_spares(2); "
            "print('held', flush=True); time.sleep(120)",
            str(tmp_path),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        with pytest.raises(writeback.JournalInUse, match="another tierfs mount of gs://wb"):
            Journal(tmp_path, "wb")
        other = Journal(tmp_path, "wb", only_dir="x")  # another only-dir: its own journal
        held = [d for d in other.dir.parent.iterdir() if d.is_dir() and d != other.dir]
        assert len(held) == 1 and len(list(held[0].glob("*.data"))) == 2  # spares untouched
    finally:
        holder.kill()
        holder.wait()
        if holder.stdout is not None:
            holder.stdout.close()
    journal = Journal(tmp_path, "wb")  # the holder is gone (kill -9): free again
    assert journal.pending() == []


async def test_a_finished_move_leaves_the_journal_durably(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A move's record goes, then its directory is fsync'd: without it, a machine crash
    could bring the record back, and the next mount would replay the move over what was
    made under the old name since. (Power loss cannot be made here: what is asserted is
    that the removal is on disk when `end` returns, the directory synced after it.)"""
    synced: list[tuple[Path, list[str]]] = []
    real = records_module._fsync_dir

    def fsync_dir(path: Path) -> None:
        synced.append((path, sorted(p.name for p in path.iterdir())))
        real(path)

    monkeypatch.setattr(records_module, "_fsync_dir", fsync_dir)
    moves = MoveLog(tmp_path)
    move = moves.begin("d/", "e/")
    synced.clear()
    moves.end(move)
    assert synced == [(moves.dir, [])]  # (before: no sync at all)


@pytest.mark.parametrize("which", ["reopened with O_TRUNC", "new"])
async def test_sync_at_sigterm_never_uploads_a_file_still_being_written(
    make_fs: Callable[[], Filesystem], bucket: MemoryBucket, which: str
) -> None:
    """SIGTERM (and ``tierfs sync``) runs sync_all while the application, signalled too,
    may be mid-write: the open file was uploaded half written and, for one closed before,
    the journal then dropped the closed version's record. Open files wait for their close;
    the closed version's record stays for the next mount."""
    fs = make_fs()
    handle, inode = await fs.create(ROOT_INO, "ckpt", os.O_WRONLY)
    if which == "reopened with O_TRUNC":
        await fs.write(handle.fh, 0, b"v1 complete checkpoint")
        await fs.release(handle.fh)
        handle = await fs.open(inode.ino, os.O_WRONLY | os.O_TRUNC)
    await fs.write(handle.fh, 0, b"v2 half")
    assert await fs.sync_all() is True
    assert bucket.names() == []
    assert fs.journal is not None
    pending = [record.object for record in fs.journal.pending()]
    assert pending == (["ckpt"] if which != "new" else [])
    await fs.write(handle.fh, 7, b", then whole")
    await fs.release(handle.fh)
    await fs.sync_all()
    assert bucket.get("ckpt") == b"v2 half, then whole"
    assert fs.journal.pending() == []


def _record_file(journal: Journal, record_id: str, name: str, data: bytes | None) -> None:
    """A committed record in a file (no attributes), with its data file unless None."""
    mtime_ns = 0
    if data is not None:
        journal.data_path(record_id).write_bytes(data)
        mtime_ns = journal.data_path(record_id).stat().st_mtime_ns
    record = Record(record_id, name, 0, size=-1 if data is None else len(data), mtime_ns=mtime_ns)
    records_module._write_record(journal.record_path(record_id), vars(record))


async def test_a_record_whose_data_went_is_dropped_and_holds_nothing_back(
    tmp_path: Path, bucket: MemoryBucket
) -> None:
    """Records in files: `discard` unlinks the data, then the record; a kill -9 between the
    two left a record without data, a failed upload at every mount, which held back the
    directory move covering it at every mount too."""
    bucket.put("t/", b"")
    bucket.put("t/x", b"x")
    journal = Journal(tmp_path / "c", "wb", xattrs=False)
    _record_file(journal, "abc", "t/x", None)
    journal.moves.begin("t/", "final/")
    again = Journal(tmp_path / "c", "wb", xattrs=False)
    result = await again.recover(bucket, trio.to_thread.run_sync)
    assert result.failed == []
    assert sorted(bucket.names()) == ["final/", "final/x"]
    assert again.pending() == []


async def test_recovery_with_gcs_down_stops_at_the_first_upload_that_fails(
    tmp_path: Path, bucket: MemoryBucket
) -> None:
    """GCS down at mount: each record waited its own retry deadline (120 s) before the mount
    served: 2,000 records, 66 hours. After the first, the rest wait for the next mount."""
    journal = Journal(tmp_path / "c", "wb", xattrs=False)
    for i in range(20):
        _record_file(journal, f"r{i:02d}", f"o{i}", b"d")
    bucket.fail_next("*", BackendError("503, retries used up"), count=1000)
    again = Journal(tmp_path / "c", "wb", xattrs=False)
    result = await again.recover(bucket, trio.to_thread.run_sync)
    assert len(result.failed) == 20
    assert sum(1 for _, why in result.failed if why.startswith("not tried: ")) == 19
    assert bucket.statistics()["uploads"] == 0
    assert len(again.pending()) == 20  # kept for the next mount


@pytest.mark.parametrize("kind", ["directory", "file"])
async def test_a_replayed_rename_leaves_what_another_client_wrote_under_the_old_name_since(
    tmp_path: Path, kind: str
) -> None:
    """A rename cut by kill -9 is replayed at the next mount, maybe hours later: it listed
    the old name then and moved everything there, another client's objects written since
    included (deleted from where they put them). It moves what was there when it began,
    and what this recovery uploads under the old name (a file committed before it)."""
    now = [time.time() - 10]
    bucket = MemoryBucket("wb", clock=lambda: now[0])
    journal = Journal(tmp_path / "c", "wb", xattrs=False)
    if kind == "directory":
        bucket.put("d/", b"")
        bucket.put("d/a", b"a")
        journal.moves.begin("d/", "e/")
        _record_file(journal, "rc", "d/c", b"c")  # committed here, uploaded at recovery
    else:
        journal.moves.begin("f", "g", file=True)
    now[0] = time.time() + 3600  # an hour later, another client writes under the old name
    bucket.put("d/b" if kind == "directory" else "f", b"theirs")
    again = Journal(tmp_path / "c", "wb", xattrs=False)
    result = await again.recover(bucket, trio.to_thread.run_sync)
    assert result.failed == [] and len(result.moves) == 1
    if kind == "directory":
        assert sorted(bucket.names()) == ["d/b", "e/", "e/a", "e/c"]
        assert bucket.get("d/b") == b"theirs"
    else:
        assert bucket.names() == ["f"] and bucket.get("f") == b"theirs"


async def test_a_long_recovery_says_it_moves_on_and_a_stuck_one_does_not(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    """Whoever starts the daemon waits while it says it moves on (`tierfs.cli.readiness`):
    recovery that uploads says so every `PROGRESS_EVERY_S`; one whose GCS never answers
    says nothing, and is given up on after a quiet spell."""
    from tierfs import mount

    journal = Journal(tmp_path / "c", "wb", xattrs=False)
    for i in range(10):
        _record_file(journal, f"r{i:02d}", f"o{i}", b"d")
    said: list[str] = []
    slow = MemoryBucket("wb", latency_s=5.0)  # 10 uploads, 5 s each (and a stat each)
    again = Journal(tmp_path / "c", "wb", xattrs=False)
    result = await mount._recovered(again, slow, said.append)
    assert len(result.uploaded) == 10
    assert len(said) >= 50 // mount.PROGRESS_EVERY_S - 1
    stuck = MemoryBucket("wb", latency_s=math.inf)
    _record_file(Journal(tmp_path / "d", "wb", xattrs=False), "r", "o", b"d")
    said.clear()
    with trio.move_on_after(10 * mount.PROGRESS_EVERY_S) as gave_up:
        await mount._recovered(Journal(tmp_path / "d", "wb", xattrs=False), stuck, said.append)
    assert gave_up.cancelled_caught and said == []
