"""The namespace of a write-back mount never waits for GCS, in the core over MemoryBucket:
rmdir of a directory in GCS (its placeholder's delete journaled and run in the background,
its emptiness known from the mount's own listing) and the rename of a file in GCS (a
journaled move, carried out in the background, finished by the next mount after a crash).
(Through a real mount: test_mount_writeback.py.)"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import trio

from tests.test_writeback import deletes_done, write_new
from tierfs.core.background import Background
from tierfs.core.filesystem import Filesystem, Settings
from tierfs.core.inodes import ROOT_INO, Inode
from tierfs.core.writeback import Journal
from tierfs.errors import NotEmpty, NotFound
from tierfs.storage.memory import MemoryBucket

pytestmark = pytest.mark.trio


class Clock:
    """The core's monotonic clock, moved by hand (the metadata TTL)."""

    def __init__(self) -> None:
        self.now_s = 1000.0

    def __call__(self) -> float:
        return self.now_s


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def make_fs(
    tmp_path: Path, nursery: trio.Nursery, clock: Clock
) -> Iterator[Callable[[MemoryBucket], Filesystem]]:
    """A write-back core with a background nursery (no uploader or deleter runs until a
    test starts one), with the clock above."""
    made: list[Filesystem] = []
    (tmp_path / "tmp").mkdir()

    def make(bucket: MemoryBucket) -> Filesystem:
        fs = Filesystem(
            bucket,
            # (No listing ahead of lookups: its requests would run when they like.)
            Settings(temp_dir=str(tmp_path / "tmp"), implicit_dirs=True, metadata_prefetch=False),
            journal=Journal(tmp_path / "cache", bucket.name),
            monotonic_s=clock,
            background=Background(nursery),
        )
        made.append(fs)
        return fs

    yield make
    for fs in made:
        fs.close()


def requests(bucket: MemoryBucket) -> int:
    return int(bucket.statistics()["requests"])


async def names_in(fs: Filesystem, directory: Inode) -> list[str]:
    return sorted(name for name, _ in await fs._list(directory))


async def rm_rf(fs: Filesystem, directory: Inode) -> None:
    """What ``rm -rf`` asks of a directory: a listing, then an unlink or a recursion for
    each entry, then the rmdir (from its parent, by the caller)."""
    for name, inode in await fs._list(directory):
        found = await fs.lookup(directory.ino, name)
        if found.kind.value == "dir":
            await rm_rf(fs, found)
            await fs.rmdir(directory.ino, name)
        else:
            await fs.unlink(directory.ino, name)
        del inode


def old_step(bucket: MemoryBucket) -> dict[str, bytes]:
    """A step an earlier mount left: placeholders for its directories, as gcsfuse makes."""
    tree = {"old/": b"", "old/d0/": b"", "old/d1/": b""}
    tree |= {f"old/d{i % 2}/f{i}": bytes([i]) for i in range(6)}
    for name, data in tree.items():
        bucket.put(name, data)
    return tree


async def test_rm_rf_of_a_tree_not_made_here_asks_gcs_nothing_after_its_listings(
    make_fs: Callable[[MemoryBucket], Filesystem],
) -> None:
    """Its rmdirs find the directories empty from the listings rm -rf made moments before
    (less what it removed since), and journal the deletes of their placeholders; the
    background deletes remove every object, placeholders included."""
    bucket = MemoryBucket("wb")
    tree = old_step(bucket)
    fs = make_fs(bucket)
    old = await fs.lookup(ROOT_INO, "old")
    listed: list[int] = []
    real_list = fs._list

    async def counting_list(directory: Inode) -> list[tuple[str, Inode]]:
        before = requests(bucket)
        try:
            return await real_list(directory)
        finally:
            listed.append(requests(bucket) - before)

    fs._list = counting_list  # type: ignore[method-assign]
    before = requests(bucket)
    await rm_rf(fs, old)
    await fs.rmdir(ROOT_INO, "old")
    # Only the three listings asked GCS (one request each: lookups came from them).
    assert requests(bucket) - before == sum(listed) == 3
    assert sorted(bucket.names()) == sorted(tree)  # nothing deleted inside the calls
    assert await names_in(fs, fs.inodes[ROOT_INO]) == []
    with pytest.raises(NotFound):
        await fs.lookup(ROOT_INO, "old")
    assert fs.journal is not None and len(fs.journal.deletes.pending()) == len(tree)
    async with trio.open_nursery() as deleter:
        deleter.start_soon(fs.run_uploads, 2)
        await deletes_done(fs)
        deleter.cancel_scope.cancel()
    assert bucket.names() == []
    assert fs.journal.deletes.pending() == []
    with pytest.raises(NotFound):
        await fs.lookup(ROOT_INO, "old")


async def test_a_crash_after_rmdir_deletes_the_placeholder_at_the_next_mount(
    make_fs: Callable[[MemoryBucket], Filesystem], tmp_path: Path
) -> None:
    bucket = MemoryBucket("wb")
    bucket.put("empty/", b"")
    fs = make_fs(bucket)
    await fs.lookup(ROOT_INO, "empty")
    await fs._list(await fs.lookup(ROOT_INO, "empty"))
    await fs.rmdir(ROOT_INO, "empty")
    assert bucket.names() == ["empty/"]
    # kill -9 now: the next mount deletes it from the journal
    done = await Journal(tmp_path / "cache", "wb").recover(bucket, trio.to_thread.run_sync)
    assert [d.object for d in done.deletes] == ["empty/"]
    assert bucket.names() == []


async def test_rmdir_never_removes_a_directory_holding_an_object_the_mount_knows_of(
    make_fs: Callable[[MemoryBucket], Filesystem], clock: Clock
) -> None:
    """The listing answers only while nothing else says otherwise: another client's object
    that a lookup found after the listing, or any listing older than the metadata TTL
    (then GCS is asked, as without write-back)."""
    bucket = MemoryBucket("wb")
    for name in ("a/", "a/f", "b/", "b/f"):
        bucket.put(name, b"x")
    fs = make_fs(bucket)
    for directory in ("a", "b"):
        inode = await fs.lookup(ROOT_INO, directory)
        assert await names_in(fs, inode) == ["f"]
        await fs.lookup(inode.ino, "f")
        await fs.unlink(inode.ino, "f")
        bucket.put(f"{directory}/theirs", b"another client's, after the listing")
    a = await fs.lookup(ROOT_INO, "a")
    await fs.lookup(a.ino, "theirs")  # the kernel looked it up (a stat, an open): known
    before = requests(bucket)
    with pytest.raises(NotEmpty):
        await fs.rmdir(ROOT_INO, "a")
    assert requests(bucket) - before == 1  # the mount asked GCS, which said so
    clock.now_s += fs.settings.metadata_ttl_s  # b's listing is too old to answer now
    with pytest.raises(NotEmpty):
        await fs.rmdir(ROOT_INO, "b")
    assert "b/" in bucket.names() and "a/" in bucket.names()


async def test_within_the_ttl_a_listing_answers_for_another_clients_unseen_object(
    make_fs: Callable[[MemoryBucket], Filesystem],
) -> None:
    """As the metadata cache does: an object another client wrote after this mount's listing
    and that nothing here looked up is not seen by the rmdir; only the placeholder goes, and
    their object stays (an implicit directory, for mounts with --implicit-dirs)."""
    bucket = MemoryBucket("wb")
    for name in ("c/", "c/f"):
        bucket.put(name, b"")
    fs = make_fs(bucket)
    c = await fs.lookup(ROOT_INO, "c")
    await names_in(fs, c)
    await fs.lookup(c.ino, "f")
    await fs.unlink(c.ino, "f")
    bucket.put("c/theirs", b"unseen")
    await fs.rmdir(ROOT_INO, "c")
    async with trio.open_nursery() as deleter:
        deleter.start_soon(fs.run_uploads, 2)
        await deletes_done(fs)
        deleter.cancel_scope.cancel()
    assert bucket.names() == ["c/theirs"]


async def test_a_directory_made_here_and_uploaded_is_removed_in_the_background(
    make_fs: Callable[[MemoryBucket], Filesystem], nursery: trio.Nursery
) -> None:
    bucket = MemoryBucket("wb")
    fs = make_fs(bucket)
    made = await fs.mkdir(ROOT_INO, "made")
    await write_new(fs, "f", b"f", made.ino)
    await fs.sync_all()
    await fs.unlink(made.ino, "f")
    before = requests(bucket)
    await fs.rmdir(ROOT_INO, "made")
    assert requests(bucket) == before
    assert sorted(bucket.names()) == ["made/", "made/f"]
    await fs.mkdir(ROOT_INO, "other")  # the mount goes on meanwhile
    with pytest.raises(NotFound):
        await fs.lookup(ROOT_INO, "made")
    nursery.start_soon(fs.run_uploads, 2)
    await fs.sync_all()  # durable in GCS: deleted too
    assert bucket.names() == ["other/"]


async def test_a_directory_removed_then_listed_can_be_made_again(
    make_fs: Callable[[MemoryBucket], Filesystem], nursery: trio.Nursery
) -> None:
    """`rm -rf step; ls; mkdir step`: the listing made while the placeholder's delete was
    pending made the removed directory an inode again, and once the delete ran, mkdir said
    EEXIST (found by the write-back model test)."""
    bucket = MemoryBucket("wb")
    bucket.put("step/", b"")
    fs = make_fs(bucket)
    await fs.lookup(ROOT_INO, "step")
    await fs.rmdir(ROOT_INO, "step")
    assert bucket.names() == ["step/"]  # its delete waits for the deleter
    assert await names_in(fs, fs.inodes[ROOT_INO]) == []
    nursery.start_soon(fs.run_uploads, 2)
    made = await fs.mkdir(ROOT_INO, "step")  # waits for the delete, then makes it
    await fs.sync_all()
    assert bucket.names() == ["step/"]
    assert bucket.statistics()["deletes"] == 1
    assert await names_in(fs, fs.inodes[ROOT_INO]) == ["step"]
    assert (await fs.lookup(ROOT_INO, "step")).ino == made.ino
