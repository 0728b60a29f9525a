"""A file's rename with write-back never waits for GCS, in the core over MemoryBucket: a
file in GCS, or with its upload under way, is renamed at once and moved in the
background (journaled: a crash is finished by the next mount); a file changed since its
upload goes up under the new name only. (Through a real mount: test_mount_writeback.py.)"""

from __future__ import annotations

import contextlib
import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

from tests.test_writeback import Crash, CrashingBucket, DeletesRefused, settle, write_new
from tierfs.core.background import Background
from tierfs.core.filesystem import Filesystem, Settings
from tierfs.core.inodes import ROOT_INO
from tierfs.core.uploads import LARGE_UPLOAD_BYTES, LARGE_UPLOADS
from tierfs.core.writeback import Journal
from tierfs.errors import AccessDenied, BackendError, NotFound, PreconditionFailed
from tierfs.storage.memory import MemoryBucket

pytestmark = pytest.mark.trio


class GatedBucket(MemoryBucket):
    """Holds each call of the operations in ``held`` until ``gate`` is set, saying when
    one has begun (``entered``)."""

    def __init__(self, *held: str) -> None:
        super().__init__("wb")
        self.held = set(held)
        self.gate = trio.Event()
        self.entered = trio.Event()

    async def _wait(self, operation: str) -> None:
        if operation in self.held:
            self.entered.set()
            await self.gate.wait()

    async def copy(self, *args: Any, **kwargs: Any) -> Any:
        await self._wait("copy")
        return await super().copy(*args, **kwargs)

    async def write_file(self, name: str, path: str, **kwargs: Any) -> Any:
        """(The body is read before the hold: what is held is its sending.)"""
        body = await trio.Path(path).read_bytes()
        await self._wait("write_file")
        with tempfile.NamedTemporaryFile() as sent:
            sent.write(body)
            sent.flush()
            return await super().write_file(name, sent.name, **kwargs)


@pytest.fixture
def make_fs(tmp_path: Path, nursery: trio.Nursery) -> Callable[[MemoryBucket], Filesystem]:
    made: list[Filesystem] = []
    (tmp_path / "tmp").mkdir(exist_ok=True)

    def make(bucket: MemoryBucket) -> Filesystem:
        fs = Filesystem(
            bucket,
            Settings(temp_dir=str(tmp_path / "tmp"), implicit_dirs=True, metadata_prefetch=False),
            journal=Journal(tmp_path / "cache", bucket.name),
            background=Background(nursery),
        )
        made.append(fs)
        return fs

    yield make  # type: ignore[misc]
    for fs in made:
        fs.close()


async def read_all(fs: Filesystem, name: str, parent: int = ROOT_INO) -> bytes:
    inode = await fs.lookup(parent, name)
    handle = await fs.open(inode.ino, os.O_RDONLY)
    try:
        return bytes(await fs.read(handle.fh, 0, 1 << 20))
    finally:
        await fs.release(handle.fh)


async def listed(fs: Filesystem, directory: int = ROOT_INO) -> list[str]:
    return sorted(name for name, _, _ in await fs.readdir(fs.opendir(directory), 0))


async def test_a_file_in_gcs_is_renamed_at_once_and_moved_in_the_background(
    make_fs: Callable[[MemoryBucket], Filesystem], nursery: trio.Nursery
) -> None:
    """DCP's commit of a file uploaded already: rename() returns while the copy is held;
    the mount shows the new name only, reads its bytes, and sync waits for the move."""
    bucket = GatedBucket("copy")
    bucket.put("dcp/.metadata.tmp", b"meta" * 100)
    bucket.put("dcp/.metadata", b"older step")
    fs = make_fs(bucket)
    nursery.start_soon(fs.run_uploads, 2)
    dcp = await fs.lookup(ROOT_INO, "dcp")
    assert await read_all(fs, ".metadata.tmp", dcp.ino) == b"meta" * 100
    await fs.lookup(dcp.ino, ".metadata")  # (the kernel looks the target up first)
    requests = bucket.statistics()["requests"]
    with trio.fail_after(5):  # (the copy is held: a rename that waited for it would hang)
        await fs.rename(dcp.ino, ".metadata.tmp", dcp.ino, ".metadata")
    assert bucket.statistics()["requests"] == requests  # rename() asked GCS nothing
    with pytest.raises(NotFound):
        await fs.lookup(dcp.ino, ".metadata.tmp")
    assert await listed(fs, dcp.ino) == [".metadata"]
    assert await read_all(fs, ".metadata", dcp.ino) == b"meta" * 100  # from the old object
    assert len(list(fs.pending_moves)) == 1
    bucket.gate.set()
    await fs.sync_all()
    assert sorted(bucket.names()) == ["dcp/.metadata"]
    assert bucket.get("dcp/.metadata") == b"meta" * 100
    assert fs.journal is not None and fs.journal.moves.pending() == []
    assert len(list(fs.pending_moves)) == 0
    assert await read_all(fs, ".metadata", dcp.ino) == b"meta" * 100  # from the new one


async def test_a_file_renamed_while_its_upload_runs_does_not_wait_for_it(
    make_fs: Callable[[MemoryBucket], Filesystem], nursery: trio.Nursery
) -> None:
    """The upload (to the old name) is held in GCS; the rename returns at once, the new
    name reads the file's bytes, and once the upload ends its object is moved."""
    bucket = GatedBucket("write_file")
    fs = make_fs(bucket)
    await write_new(fs, "shard.tmp", b"s" * 5000)
    nursery.start_soon(fs.run_uploads, 2)
    await bucket.entered.wait()  # the upload is under way, holding the file's lock
    with trio.fail_after(5):
        await fs.rename(ROOT_INO, "shard.tmp", ROOT_INO, "shard")
    assert await listed(fs) == ["shard"]
    assert await read_all(fs, "shard") == b"s" * 5000
    assert bucket.names() == []
    bucket.gate.set()
    await fs.sync_all()
    assert bucket.names() == ["shard"]
    assert bucket.get("shard") == b"s" * 5000
    assert fs.journal is not None and fs.journal.moves.pending() == []
    assert fs.journal.pending() == []


async def test_a_file_changed_since_its_upload_goes_up_under_its_new_name_only(
    make_fs: Callable[[MemoryBucket], Filesystem], nursery: trio.Nursery
) -> None:
    """Its bytes are local and newer: nothing is copied; the old object is deleted in the
    background, and the name it replaces is replaced by its upload."""
    bucket = MemoryBucket("wb")
    bucket.put("a", b"old a")
    bucket.put("b", b"old b")
    fs = make_fs(bucket)
    inode = await fs.lookup(ROOT_INO, "a")
    handle = await fs.open(inode.ino, os.O_WRONLY | os.O_TRUNC)
    await fs.write(handle.fh, 0, b"new a")
    await fs.release(handle.fh)  # committed; no uploader runs yet
    await fs.lookup(ROOT_INO, "b")
    requests = bucket.statistics()["requests"]
    await fs.rename(ROOT_INO, "a", ROOT_INO, "b")
    assert bucket.statistics()["requests"] == requests
    assert await listed(fs) == ["b"]
    assert await read_all(fs, "b") == b"new a"
    nursery.start_soon(fs.run_uploads, 2)
    await settle(fs)
    await fs.sync_all()
    assert {n: bucket.get(n) for n in bucket.names()} == {"b": b"new a"}
    assert bucket.statistics().get("copies", 0) == 0


async def test_a_new_file_renamed_over_one_in_gcs_replaces_it_by_its_upload(
    make_fs: Callable[[MemoryBucket], Filesystem], nursery: trio.Nursery
) -> None:
    """DCP's commit over the last step's ``.metadata``: no request in the rename, and no
    delete ever (the upload replaces that generation)."""
    bucket = MemoryBucket("wb")
    bucket.put(".metadata", b"last step")
    fs = make_fs(bucket)
    await fs.lookup(ROOT_INO, ".metadata")
    await write_new(fs, ".metadata.tmp", b"this step")
    requests = bucket.statistics()["requests"]
    await fs.rename(ROOT_INO, ".metadata.tmp", ROOT_INO, ".metadata")
    assert bucket.statistics()["requests"] == requests
    assert await read_all(fs, ".metadata") == b"this step"
    nursery.start_soon(fs.run_uploads, 2)
    await settle(fs)
    assert {n: bucket.get(n) for n in bucket.names()} == {".metadata": b"this step"}
    assert bucket.statistics()["deletes"] == 0


async def test_a_file_open_with_changes_is_moved_after_its_last_close(
    make_fs: Callable[[MemoryBucket], Filesystem], nursery: trio.Nursery
) -> None:
    """Renamed while its upload runs, then opened for writing again (the open waits for
    the upload under way, `_after_upload`): no partial object ever appears under either
    name; its last close's bytes end up under the new one."""
    bucket = GatedBucket("write_file")
    fs = make_fs(bucket)
    ino = await write_new(fs, "f.tmp", b"first")
    nursery.start_soon(fs.run_uploads, 2)
    await bucket.entered.wait()
    await fs.rename(ROOT_INO, "f.tmp", ROOT_INO, "f")
    opened: list[int] = []

    async def open_again() -> None:
        opened.append((await fs.open(ino, os.O_WRONLY | os.O_TRUNC)).fh)

    nursery.start_soon(open_again)
    await trio.testing.wait_all_tasks_blocked()
    assert opened == []  # waiting for the upload
    bucket.held.clear()
    bucket.gate.set()
    with trio.fail_after(30):
        while not opened:
            await trio.sleep(0.01)
    handle = fs.files[opened[0]]
    await fs.write(handle.fh, 0, b"sec")
    for _ in range(20):  # the move runs meanwhile: it must not publish "sec"
        await trio.sleep(0.01)
        assert b"sec" not in [bucket.get(n) for n in bucket.names()]
    await fs.write(handle.fh, 3, b"ond")
    await fs.release(handle.fh)
    await settle(fs)
    await fs.sync_all()
    assert {n: bucket.get(n) for n in bucket.names()} == {"f": b"second"}


@pytest.mark.parametrize("survive", [0, 1])
async def test_a_crash_in_a_file_move_is_finished_by_the_next_mount(
    tmp_path: Path, survive: int
) -> None:
    """Killed before the copy, or between the copy and the delete: the record makes the
    next mount move the object (after its uploads)."""
    bucket = CrashingBucket(survive=10_000)
    bucket.put("x.tmp", b"x" * 300)
    fs = Filesystem(
        bucket, Settings(temp_dir=str(tmp_path)), journal=Journal(tmp_path / "cache", "wb")
    )
    await fs.lookup(ROOT_INO, "x.tmp")
    bucket.survive, bucket.calls = survive, 0
    with pytest.raises((Crash, BaseExceptionGroup)):
        await fs.rename(ROOT_INO, "x.tmp", ROOT_INO, "x")  # no nursery: moves inline
    fs.close()
    bucket.survive = 10_000
    journal = Journal(tmp_path / "cache", "wb")  # the next mount
    recovered = await journal.recover(bucket, trio.to_thread.run_sync)
    assert [move.file for move in recovered.moves] == [True]
    assert {n: bucket.get(n) for n in bucket.names()} == {"x": b"x" * 300}
    assert journal.moves.pending() == []


async def killed_while_the_renamed_file_uploads(tmp_path: Path) -> GatedBucket:
    """``y.tmp`` written, its upload under way (held), renamed to ``y``, then the daemon
    killed: the bucket, its hold let go, for the next mount's recovery."""
    bucket = GatedBucket("write_file")
    async with trio.open_nursery() as daemon:
        fs = Filesystem(
            bucket, Settings(temp_dir=str(tmp_path)), journal=Journal(tmp_path / "cache", "wb")
        )
        fs.background = Background(daemon)
        await write_new(fs, "y.tmp", b"y" * 700)
        daemon.start_soon(fs.run_uploads, 2)
        await bucket.entered.wait()
        await fs.rename(ROOT_INO, "y.tmp", ROOT_INO, "y")
        daemon.cancel_scope.cancel()  # kill -9: the held upload never ends
    fs.close()
    bucket.held.clear()
    return bucket


async def test_a_crash_while_the_renamed_file_was_uploading_is_finished_by_the_next_mount(
    tmp_path: Path,
) -> None:
    """Its journal record names the old object and the move record says where it goes: the
    next mount uploads, then moves."""
    bucket = await killed_while_the_renamed_file_uploads(tmp_path)
    journal = Journal(tmp_path / "cache", "wb")
    recovered = await journal.recover(bucket, trio.to_thread.run_sync)
    assert recovered.uploaded == ["y.tmp"] and len(recovered.moves) == 1
    assert {n: bucket.get(n) for n in bucket.names()} == {"y": b"y" * 700}


async def test_a_file_renamed_while_open_with_changes_survives_a_crash(tmp_path: Path) -> None:
    """Log rotation's rename: a file in GCS, open and written, renamed before its close,
    then the daemon killed. The delete of the old object is journaled with the rename; the
    file's bytes must be too, under the new name, or the next mount deletes the old object
    and drops the data file that had no record: the file gone under both names."""
    bucket = MemoryBucket("wb")
    bucket.put("app.log", b"old lines\n")
    fs = Filesystem(
        bucket, Settings(temp_dir=str(tmp_path)), journal=Journal(tmp_path / "cache", "wb")
    )
    inode = await fs.lookup(ROOT_INO, "app.log")
    handle = await fs.open(inode.ino, os.O_WRONLY)
    await fs.write(handle.fh, 10, b"new lines\n")
    await fs.rename(ROOT_INO, "app.log", ROOT_INO, "app.log.1")
    fs.close()  # kill -9: no close, no upload
    journal = Journal(tmp_path / "cache", "wb")  # the next mount
    await journal.recover(bucket, trio.to_thread.run_sync)
    assert {n: bucket.get(n) for n in bucket.names()} == {"app.log.1": b"old lines\nnew lines\n"}


async def test_a_rename_over_a_file_waiting_for_its_upload_survives_a_crash(
    tmp_path: Path,
) -> None:
    """The tmp-then-rename commit over a file whose own upload had not run yet, then the
    daemon killed: the replaced file's record must go with it, or the next mount uploads
    it and then finds the renamed file's upload in conflict with it (kept aside, the old
    bytes in GCS)."""
    bucket = MemoryBucket("wb")
    fs = Filesystem(
        bucket, Settings(temp_dir=str(tmp_path)), journal=Journal(tmp_path / "cache", "wb")
    )
    await write_new(fs, "step", b"step 1")  # committed; no uploader runs
    await write_new(fs, "step.tmp", b"step 2")
    await fs.rename(ROOT_INO, "step.tmp", ROOT_INO, "step")
    fs.close()  # kill -9
    journal = Journal(tmp_path / "cache", "wb")
    await journal.recover(bucket, trio.to_thread.run_sync)
    assert {n: bucket.get(n) for n in bucket.names()} == {"step": b"step 2"}
    assert not journal.conflicts_dir.exists() or not any(journal.conflicts_dir.iterdir())


class _CopiesRefused(MemoryBucket):
    """A bucket that refuses every copy (a role without ``storage.objects.create`` on the
    new name, or GCS down), until ``refuse`` is False."""

    def __init__(self) -> None:
        super().__init__("wb")
        self.refuse = True

    async def copy(self, *args: Any, **kwargs: Any) -> Any:
        if self.refuse:
            await trio.lowlevel.checkpoint()
            raise AccessDenied("copy denied")
        return await super().copy(*args, **kwargs)


async def test_a_change_behind_a_move_that_keeps_failing_fails_rather_than_waits(
    make_fs: Callable[[MemoryBucket], Filesystem], autojump_clock: trio.testing.MockClock
) -> None:
    """A create at the new name of a file whose background move keeps failing waited for
    the move, retried for ever: it hung for good. It now fails with the move's error once
    two attempts in a row failed, and works once the move does."""
    bucket = _CopiesRefused()
    bucket.put("a", b"a")
    fs = make_fs(bucket)
    await fs.lookup(ROOT_INO, "a")
    await fs.rename(ROOT_INO, "a", ROOT_INO, "b")
    with trio.fail_after(600), pytest.raises(BackendError, match="copy denied"):
        await fs.setattr((await fs.lookup(ROOT_INO, "b")).ino, size=0)
    bucket.refuse = False
    deadline = time.monotonic() + 30  # (real time: the move ends in worker threads)
    while fs.pending_moves and time.monotonic() < deadline:
        await trio.sleep(0.01)
    await fs.setattr((await fs.lookup(ROOT_INO, "b")).ino, size=0)
    await fs.sync_all()
    assert {n: bucket.get(n) for n in bucket.names()} == {"b": b""}


async def test_a_file_rename_inside_a_directory_being_renamed_does_not_deadlock(
    make_fs: Callable[[MemoryBucket], Filesystem], nursery: trio.Nursery
) -> None:
    """``mv D E`` beside ``mv D/y D/x`` (the kernel does not serialize them: different
    parents are locked). The directory's rename takes its files' locks in inode order and
    uploads a changed one holding its lock (x); the file's rename held y's and waited for
    x's, while the directory's waited for y's: both hung for good, and every later close
    of x or y behind them."""
    bucket = GatedBucket()
    fs = make_fs(bucket)
    d = await fs.mkdir(ROOT_INO, "D")
    x = await write_new(fs, "x", b"x1", d.ino)
    await fs.sync_all()  # x in GCS
    handle = await fs.open(x, os.O_WRONLY)
    await fs.write(handle.fh, 0, b"x2")
    await fs.release(handle.fh)  # x changed since (committed, no uploader runs)
    await write_new(fs, "y", b"y1", d.ino)  # never uploaded: a local rename, y's lock held
    bucket.held.add("write_file")
    done: list[str] = []

    async def rename(*args: Any) -> None:
        await fs.rename(*args)
        done.append(args[1])

    with trio.fail_after(20):
        nursery.start_soon(rename, ROOT_INO, "D", ROOT_INO, "E")
        await bucket.entered.wait()  # the directory's rename uploads x, holding x's lock
        nursery.start_soon(rename, d.ino, "y", d.ino, "x")
        await trio.testing.wait_all_tasks_blocked()
        bucket.gate.set()
        while len(done) < 2:
            await trio.sleep(0.01)
    assert sorted(done) == ["D", "y"]
    await settle_moves(fs)
    # Which rename wins the name is the race's; no bytes may be lost: y's are in GCS, or,
    # when its upload finds the name changed by the other rename, kept aside (ESTALE).
    with contextlib.suppress(PreconditionFailed):
        await fs.sync_all()
    assert fs.journal is not None
    kept = [f.read_bytes() for f in fs.journal.conflicts_dir.rglob("*") if f.is_file()]
    assert b"y1" in [bucket.get(n) for n in bucket.names()] + kept


async def settle_moves(fs: Filesystem) -> None:
    deadline = time.monotonic() + 30  # (real time: moves end in worker threads)
    while fs.pending_moves and time.monotonic() < deadline:
        await trio.sleep(0.01)
    assert not fs.pending_moves


@pytest.mark.parametrize("in_gcs", [False, True])
async def test_a_file_unlinked_while_open_stays_gone_after_a_crash(
    tmp_path: Path, in_gcs: bool
) -> None:
    """A closed file waiting for its upload, still open in a reader, unlinked, then the
    daemon killed: its journal record outlived the name (kept for the open handle), so the
    next mount uploaded it again: the removed file was back (and, when it was in GCS
    before, its changed bytes beat the delete's generation check)."""
    bucket = MemoryBucket("wb")
    fs = Filesystem(
        bucket, Settings(temp_dir=str(tmp_path)), journal=Journal(tmp_path / "cache", "wb")
    )
    ino = await write_new(fs, "scratch", b"first")
    if in_gcs:
        await fs.sync_all()
        handle = await fs.open(ino, os.O_WRONLY)
        await fs.write(handle.fh, 0, b"again")
        await fs.release(handle.fh)  # committed, not uploaded: no uploader runs
    reader = await fs.open(ino, os.O_RDONLY)
    await fs.unlink(ROOT_INO, "scratch")
    assert bytes(await fs.read(reader.fh, 0, 5)) == (b"again" if in_gcs else b"first")
    fs.close()  # kill -9, the reader still open
    journal = Journal(tmp_path / "cache", "wb")
    await journal.recover(bucket, trio.to_thread.run_sync)
    assert bucket.names() == []


async def test_a_rename_waits_in_the_journal_for_the_upload_it_follows(tmp_path: Path) -> None:
    """Killed while the renamed file was uploading, and at the next mount its upload fails
    again (GCS down): the journaled move ran anyway, found no object to move and ended, and
    the mount after uploaded the file under its old name: the rename lost. The move now
    waits in the journal with its upload, and the mount after finishes both."""
    bucket = await killed_while_the_renamed_file_uploads(tmp_path)
    bucket.fail_next("write_file", BackendError("503"))
    journal = Journal(tmp_path / "cache", "wb")
    recovered = await journal.recover(bucket, trio.to_thread.run_sync)
    assert [name for name, _ in recovered.failed] == ["y.tmp"] and recovered.moves == []
    assert bucket.names() == [] and len(journal.moves.pending()) == 1
    again = Journal(tmp_path / "cache", "wb")  # the mount after, GCS back
    recovered = await again.recover(bucket, trio.to_thread.run_sync)
    assert recovered.uploaded == ["y.tmp"] and len(recovered.moves) == 1
    assert {n: bucket.get(n) for n in bucket.names()} == {"y": b"y" * 700}


async def test_a_delete_gcs_refuses_does_not_stop_the_next_mounts(tmp_path: Path) -> None:
    """A journaled delete GCS refuses (a role without storage.objects.delete, a retention
    policy): its error ended recovery, so that mount failed, and every mount after it until
    someone removed the record by hand. It is now logged and kept for the next mount."""
    bucket = DeletesRefused()
    bucket.put("old", b"kept by a retention policy")
    fs = Filesystem(
        bucket, Settings(temp_dir=str(tmp_path)), journal=Journal(tmp_path / "cache", "wb")
    )
    await fs.lookup(ROOT_INO, "old")
    await fs.unlink(ROOT_INO, "old")  # journaled; no deleter runs
    fs.close()
    journal = Journal(tmp_path / "cache", "wb")
    recovered = await journal.recover(bucket, trio.to_thread.run_sync)
    assert recovered.deletes == [] and len(journal.deletes.pending()) == 1
    bucket.refuse = False
    recovered = await Journal(tmp_path / "cache", "wb").recover(bucket, trio.to_thread.run_sync)
    assert len(recovered.deletes) == 1 and bucket.names() == []


class _HeldBeforeReading(GatedBucket):
    """Holds each whole-file upload before it reads the file (a slow start: the request
    limiter, the throttle, the worker thread)."""

    def __init__(self, *held: str) -> None:
        super().__init__(*held)
        self.made: list[bytes] = []  # each upload's bytes, in order
        self.started: list[str] = []  # each upload's object, as it began

    async def write_file(self, name: str, path: str, **kwargs: Any) -> Any:
        self.started.append(name)
        await self._wait("write_file")
        info = await MemoryBucket.write_file(self, name, path, **kwargs)
        self.made.append(self.get(name))
        return info


async def test_a_file_opened_for_writing_during_its_upload_never_goes_up_torn(
    make_fs: Callable[[MemoryBucket], Filesystem], nursery: trio.Nursery
) -> None:
    """A closed file reopened with O_TRUNC and written while its background upload was
    starting: the upload read the file as the writer had left it, so GCS got bytes that
    were neither the closed file nor the next one, and the journal let go of the record
    (the upload's version had been counted before). A writable open now waits for an
    upload of the file under way."""
    bucket = _HeldBeforeReading("write_file")
    fs = make_fs(bucket)
    ino = await write_new(fs, "f", b"first")
    nursery.start_soon(fs.run_uploads, 2)
    await bucket.entered.wait()
    written = trio.Event()

    async def writer() -> None:
        handle = await fs.open(ino, os.O_WRONLY | os.O_TRUNC)
        await fs.write(handle.fh, 0, b"sec")
        written.set()
        await fs.write(handle.fh, 3, b"ond")
        await fs.release(handle.fh)

    nursery.start_soon(writer)
    await trio.testing.wait_all_tasks_blocked()
    bucket.gate.set()
    with trio.fail_after(30):
        await written.wait()
    await settle(fs)
    await fs.sync_all()
    assert bucket.made == [b"first", b"second"]  # never b"sec": each upload a closed file


async def test_a_large_file_opened_while_it_waits_for_an_upload_slot_never_goes_up_torn(
    make_fs: Callable[[MemoryBucket], Filesystem], nursery: trio.Nursery
) -> None:
    """Five large files saved: four uploads take the slots (held), the fifth waits for one.
    Meanwhile the fifth is opened with O_TRUNC and half written. Its upload, let through
    when a slot freed, did not look at the open again and published the half file."""
    bucket = _HeldBeforeReading("write_file")
    fs = make_fs(bucket)
    size = LARGE_UPLOAD_BYTES + 1
    inos = [await write_new(fs, f"f{i}", bytes([i]) * size) for i in range(LARGE_UPLOADS + 1)]
    nursery.start_soon(fs.run_uploads, LARGE_UPLOADS + 2)
    with trio.fail_after(60):
        await bucket.entered.wait()
        await trio.testing.wait_all_tasks_blocked()
        sending = set(bucket.started)  # four, held; the fifth waits for a slot
        (waiting,) = [i for i in range(len(inos)) if f"f{i}" not in sending]
        handle = await fs.open(inos[waiting], os.O_WRONLY | os.O_TRUNC)
        await fs.write(handle.fh, 0, b"half")
        bucket.gate.set()
        await settle(fs)  # the four sent, and the fifth's turn come (still open: skipped)
        await fs.write(handle.fh, 4, b" and the rest")
        await fs.release(handle.fh)
        await settle(fs)
        await fs.sync_all()
    assert len(sending) == LARGE_UPLOADS
    assert b"half" not in bucket.made
    assert bucket.get(f"f{waiting}") == b"half and the rest"


async def test_a_name_another_client_writes_while_a_rename_moves_onto_it_stays_theirs(
    make_fs: Callable[[MemoryBucket], Filesystem], nursery: trio.Nursery
) -> None:
    """``mv a b`` with write-back returns at once; the object is moved in the background.
    Another client writes b before the copy: theirs is newer than the rename and stays,
    and a stays where it is (our bytes, under the old name). Before, the copy named no
    precondition and overwrote their b."""
    bucket = GatedBucket("copy")
    bucket.put("a", b"mine")
    bucket.put("b", b"the b the rename replaces")
    fs = make_fs(bucket)
    await fs.lookup(ROOT_INO, "a")
    await fs.lookup(ROOT_INO, "b")
    await fs.rename(ROOT_INO, "a", ROOT_INO, "b")
    with trio.fail_after(30):
        await bucket.entered.wait()
    bucket.put("b", b"theirs, written after the rename")
    bucket.gate.set()
    await settle_moves(fs)
    assert bucket.get("b") == b"theirs, written after the rename"
    assert bucket.get("a") == b"mine"


async def test_a_file_another_client_replaced_before_its_directory_moved_reads_stale(
    tmp_path: Path, nursery: trio.Nursery
) -> None:
    """A file open for reading while a background directory rename moves it, its object
    replaced by another client before the move listed it: the handle followed the copy of
    the other client's object, and read its bytes cut to the old size. ESTALE, as for any
    handle whose file another client replaced."""
    bucket = MemoryBucket("wb")
    bucket.put("d/", b"")
    bucket.put("d/x", b"o" * 4000)
    fs = Filesystem(
        bucket,
        Settings(temp_dir=str(tmp_path), implicit_dirs=True),
        journal=Journal(tmp_path / "cache", "wb"),
    )
    fs.background = Background(nursery)
    directory = await fs.lookup(ROOT_INO, "d")
    inode = await fs.lookup(directory.ino, "x")
    handle = await fs.open(inode.ino, os.O_RDONLY)
    bucket.put("d/x", b"n" * 6000)  # another client
    await fs.rename(ROOT_INO, "d", ROOT_INO, "e", 0)
    with trio.fail_after(30):
        while fs.pending_moves:
            await trio.sleep(0.01)
    assert bucket.get("e/x") == b"n" * 6000  # theirs, moved with the directory
    with pytest.raises(PreconditionFailed):
        await fs.read(handle.fh, 0, 4000)
    await fs.release(handle.fh)
    fs.close()
