"""Model test: random operation sequences on the filesystem core vs. a plain-dict reference.

Hypothesis draws sequences of file operations made through the core
(create/write/close, overwrite at an offset, truncate, unlink, mkdir, rmdir,
rename) interleaved with changes made by another client directly in the
bucket (put, delete). After every step, every file's bytes read through the
core and every directory listing must equal the reference model, and the
bucket must hold exactly the model's files. One scenario: a file rewritten
by another client while open for writing gives ESTALE at close and the other
client's bytes survive.

The core runs over `MemoryBucket`, which passes the same contract suite as
the emulator (tests/test_storage_contract.py).
"""

from __future__ import annotations

import errno
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import trio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tierfs.core.background import Background
from tierfs.core.filesystem import Filesystem, Settings
from tierfs.core.inodes import ROOT_INO, Kind
from tierfs.core.writeback import Journal
from tierfs.errors import BackendError, PreconditionFailed, TierfsError, errno_of
from tierfs.storage.memory import MemoryBucket

NAMES = ["a", "b", "c"]
DIRS = ["", "d", "e"]
paths = st.builds(
    lambda d, n: f"{d}/{n}" if d else n, st.sampled_from(DIRS), st.sampled_from(NAMES)
)
data = st.binary(max_size=300)


@dataclass
class Model:
    files: dict[str, bytes] = field(default_factory=dict)
    dirs: set[str] = field(default_factory=set)  # placeholders

    def is_dir(self, path: str) -> bool:
        return path == "" or path in self.dirs or any(f.startswith(path + "/") for f in self.files)

    def children(self, path: str) -> set[str]:
        prefix = path + "/" if path else ""
        names = set()
        for item in [*self.files, *self.dirs]:
            if item.startswith(prefix) and item != path:
                names.add(item[len(prefix) :].split("/", 1)[0])
        return names


write_new = st.tuples(st.just("write_new"), paths, data)
rename = st.tuples(st.just("rename"), paths, paths)
common_ops = [
    write_new,
    st.tuples(st.just("overwrite"), paths, st.integers(0, 400), data),
    st.tuples(st.just("truncate"), paths, st.integers(0, 400)),
    st.tuples(st.just("unlink"), paths),
    st.tuples(st.just("mkdir"), st.sampled_from(DIRS[1:])),
    st.tuples(st.just("rmdir"), st.sampled_from(DIRS[1:])),
    rename,
    st.tuples(st.just("remote_put"), paths, data),
    st.tuples(st.just("remote_delete"), paths),
]
# A clobber's write has a byte at least: the kernel never sends an empty WRITE, and an
# empty one leaves the handle with nothing to commit (hence no ESTALE at release).
ops = st.one_of(*common_ops, st.tuples(st.just("clobber"), paths, data.filter(len), data))
# With write-back: no clobber (see its test), and creates and renames more often, so that
# renames meet files in every state (not uploaded, changed since, in GCS, being moved).
write_back_ops = st.one_of(*common_ops, write_new, write_new, rename, rename, rename)


class Driver:
    """Calls the core the way the kernel would: path walks by lookup, open/write/release."""

    def __init__(self, fs: Filesystem) -> None:
        self.fs = fs

    async def walk(self, path: str) -> int:
        """As the kernel's LOOKUPs are answered (`tierfs.fuse.operations._AT_ONCE`): at
        once when the core can, else by awaiting `lookup`."""
        ino = ROOT_INO
        for part in [p for p in path.split("/") if p]:
            inode = self.fs.lookup_now(ino, part) or await self.fs.lookup(ino, part)
            ino = inode.ino
        return ino

    async def parent_and_name(self, path: str) -> tuple[int, str]:
        parent, _, name = path.rpartition("/")
        return await self.walk(parent), name

    async def read(self, path: str) -> bytes:
        handle = await self.fs.open(await self.walk(path), os.O_RDONLY)
        try:
            return bytes(await self.fs.read(handle.fh, 0, 1 << 20))
        finally:
            await self.fs.release(handle.fh)

    async def write(self, path: str, offset: int, body: bytes, *, create: bool) -> None:
        if create:
            parent, name = await self.parent_and_name(path)
            handle, _ = await self.fs.create(parent, name, os.O_WRONLY)
        else:
            handle = await self.fs.open(await self.walk(path), os.O_WRONLY)
        try:
            await self.fs.write(handle.fh, offset, body)
        finally:
            await self.fs.release(handle.fh)

    async def listing(self, path: str) -> set[str]:
        fh = self.fs.opendir(await self.walk(path))
        try:
            return {name for name, _, _ in await self.fs.readdir(fh, 0)}
        finally:
            self.fs.releasedir(fh)


class Clock:
    """Injected monotonic time: the metadata cache's TTLs pass when a test says so."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def pass_ttls(self) -> None:
        self.now += 3600


async def apply(
    op: tuple, fs: Filesystem, bucket: MemoryBucket, model: Model, clock: Clock
) -> None:
    drive = Driver(fs)
    kind = op[0]
    if kind == "write_new":
        _, path, body = op
        parent = path.rpartition("/")[0]
        if not model.is_dir(parent) or model.is_dir(path) or path in model.files:
            return
        await drive.write(path, 0, body, create=True)
        model.files[path] = body
    elif kind == "overwrite":
        _, path, offset, body = op
        if path not in model.files:
            return
        await drive.write(path, offset, body, create=False)
        old = model.files[path]
        if not body:
            return  # a write of nothing changes nothing, even past the end
        grown = old + b"\0" * max(0, offset - len(old))
        model.files[path] = grown[:offset] + body + grown[offset + len(body) :]
    elif kind == "truncate":
        _, path, size = op
        if path not in model.files:
            return
        await fs.setattr(await drive.walk(path), size=size)
        old = model.files[path]
        model.files[path] = old[:size] + b"\0" * max(0, size - len(old))
    elif kind == "unlink":
        _, path = op
        if path not in model.files:
            return
        parent, name = await drive.parent_and_name(path)
        await fs.unlink(parent, name)
        del model.files[path]
    elif kind == "mkdir":
        _, path = op
        if model.is_dir(path) or path in model.files:
            return
        await fs.mkdir(ROOT_INO, path)
        model.dirs.add(path)
    elif kind == "rmdir":
        _, path = op
        if not model.is_dir(path) or path in model.files:
            return
        if model.children(path):
            with pytest.raises(TierfsError) as info:
                await fs.rmdir(ROOT_INO, path)
            assert errno_of(info.value) == errno.ENOTEMPTY
            return
        await fs.rmdir(ROOT_INO, path)
        model.dirs.discard(path)
    elif kind == "rename":
        _, source, target = op
        target_parent = target.rpartition("/")[0]
        if source not in model.files or not model.is_dir(target_parent) or model.is_dir(target):
            return
        if source == target:
            return
        old_parent, old_name = await drive.parent_and_name(source)
        new_parent, new_name = await drive.parent_and_name(target)
        await fs.rename(old_parent, old_name, new_parent, new_name)
        body = model.files.pop(source)
        model.files[target] = body
    elif kind == "remote_put":
        _, path, body = op
        if model.is_dir(path) or any(model.files.get(p) is not None for p in _ancestors(path)):
            return
        bucket.put(path, body)
        model.files[path] = body
        clock.pass_ttls()  # other clients' changes show once cached metadata expires
    elif kind == "remote_delete":
        _, path = op
        if path not in model.files:
            return
        bucket.remove(path)
        del model.files[path]
        clock.pass_ttls()
    elif kind == "clobber":
        _, path, mine, theirs = op
        if path not in model.files:
            return
        ours = mine + model.files[path][len(mine) :]
        handle = await fs.open(await drive.walk(path), os.O_WRONLY)
        await fs.write(handle.fh, 0, mine)
        bucket.put(path, theirs)
        if ours == theirs:  # the object holds our bytes already: taken as our upload
            await fs.release(handle.fh)
        else:
            with pytest.raises(TierfsError) as info:
                await fs.release(handle.fh)
            assert errno_of(info.value) == errno.ESTALE
        model.files[path] = theirs
        clock.pass_ttls()


def _ancestors(path: str) -> list[str]:
    parts = path.split("/")
    return ["/".join(parts[:i]) for i in range(1, len(parts))]


async def check(fs: Filesystem, bucket: MemoryBucket, model: Model) -> None:
    stored = {n: bucket.get(n) for n in bucket.names() if not n.endswith("/")}
    assert stored == model.files
    await check_view(fs, model)


async def _lingers(fs: Filesystem, model: Model, path: str) -> bool:
    """An implied directory whose last object this mount removed: still there, empty, for
    the metadata TTL (gcsfuse's type cache), though the model has nothing."""
    if model.is_dir(path) or path in model.files:
        return False
    try:
        return (await fs.lookup(ROOT_INO, path)).kind is Kind.DIR
    except TierfsError:
        return False


async def _empty_dir(drive: Driver, path: str) -> bool:
    inode = drive.fs.inodes[await drive.walk(path)]
    return inode.kind is Kind.DIR and not await drive.listing(path)


async def check_view(fs: Filesystem, model: Model, *, lingering: bool = False) -> None:
    """What the mount answers: every file's bytes and every directory's names. With
    ``lingering``, a listing may also name an implied directory whose last object this
    mount removed or renamed away while GCS still has it (its delete or move runs in the
    background: it is empty, as gcsfuse's type cache keeps such a directory)."""
    drive = Driver(fs)
    for path, body in model.files.items():
        assert await drive.read(path) == body, path
    for directory in {"", *model.dirs, *(p.rpartition("/")[0] for p in model.files)}:
        if model.is_dir(directory):
            listed, expected = await drive.listing(directory), model.children(directory)
            extra = listed - expected
            if lingering:
                prefix = directory + "/" if directory else ""
                extra = {name for name in extra if not await _empty_dir(drive, prefix + name)}
            assert listed >= expected and not extra, directory


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(sequence=st.lists(ops, max_size=25))
def test_core_matches_model(sequence: list[tuple], tmp_path: Path) -> None:
    async def main() -> None:
        bucket = MemoryBucket("model")
        clock = Clock()
        fs = Filesystem(
            bucket,
            Settings(implicit_dirs=True, temp_dir=str(tmp_path), rename_dir_limit=1000),
            monotonic_s=clock,
        )
        model = Model()
        try:
            for op in sequence:
                await apply(op, fs, bucket, model, clock)
                await check(fs, bucket, model)
            assert not [i for i in fs.inodes.by_ino.values() if i.staged is not None]
        finally:
            fs.close()

    trio.run(main)


# Derandomized: CI runs the same 100 examples each time (a new random one found in CI
# fails a submission for an old defect); explored at random, 1,500 examples passed at
# the commit that added this test.
@settings(
    max_examples=100,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    sequence=st.lists(write_back_ops, max_size=30),
    sync_every=st.integers(1, 6),
)
def test_write_back_core_matches_model(
    sequence: list[tuple], sync_every: int, tmp_path: Path
) -> None:
    """The same sequences with write-back, its uploader, deleter and background moves
    running. After every step the mount answers as the model (reads, listings), uploads
    and moves under way or not; every ``sync_every`` steps and at the end, after
    `sync_all`, the bucket holds exactly the model's files. So renames meet files not
    uploaded yet (local), changed since their upload (local, the old object deleted), in
    GCS (moved in the background). (Another client's write over a file being written is
    write-back's conflict, kept aside: test_writeback.py, not this model's ESTALE; and in
    a directory this mount made, another client's objects are not seen by design:
    tierfs/core/owned.py. Another client's changes are made only when the mount's are
    all in GCS.)"""
    base = Path(tempfile.mkdtemp(dir=tmp_path))  # one per example: nothing carries over

    async def main() -> None:
        bucket = MemoryBucket("model", latency_s=0.001)  # (moves still under way at checks)
        clock = Clock()
        async with trio.open_nursery() as nursery:
            fs = Filesystem(
                bucket,
                Settings(implicit_dirs=True, temp_dir=str(base)),
                monotonic_s=clock,
                journal=Journal(base / "journal", "model"),
                background=Background(nursery),
            )
            nursery.start_soon(fs.run_uploads, 4, 0.05)
            model = Model()
            try:
                for step, op in enumerate(sequence, 1):
                    if op[0].startswith("remote_"):
                        if op[1].rpartition("/")[0] in model.dirs:
                            continue  # a directory this mount made answers from its own table
                        await fs.sync_all()
                    if op[0] == "mkdir" and await _lingers(fs, model, op[1]):
                        continue  # the kernel's lookup finds it: EEXIST before any mkdir
                    await apply(op, fs, bucket, model, clock)
                    if step % sync_every == 0:
                        await fs.sync_all()
                        await check(fs, bucket, model)
                    else:
                        await check_view(fs, model, lingering=True)
                await fs.sync_all()
                await check(fs, bucket, model)
                assert fs.journal is not None and fs.journal.pending() == []
                assert fs.journal.moves.pending() == []
            finally:
                fs.close()
                nursery.cancel_scope.cancel()

    trio.run(main)


@pytest.mark.parametrize("copy_fails", [False, True])
def test_open_handle_survives_unlink(tmp_path: Path, copy_fails: bool) -> None:
    """An unlinked file's open handles read the copy made at the unlink. When that copy
    fails (GCS, a full temp-dir) the unlink said EIO and the file stayed; gcsfuse copies
    nothing: the unlink goes on, and the handles read ESTALE."""

    async def main() -> None:
        bucket = MemoryBucket("model")
        fs = Filesystem(bucket, Settings(temp_dir=str(tmp_path)))
        bucket.put("f", b"keep me")
        ino = (await fs.lookup(ROOT_INO, "f")).ino
        handle = await fs.open(ino, os.O_RDONLY)
        if copy_fails:
            bucket.fail_next("read", BackendError("503, retries used up"))
        await fs.unlink(ROOT_INO, "f")
        assert "f" not in bucket.names()
        if copy_fails:
            with pytest.raises(PreconditionFailed):
                await fs.read(handle.fh, 0, 100)
        else:
            assert bytes(await fs.read(handle.fh, 0, 100)) == b"keep me"
        await fs.release(handle.fh)
        assert fs.inodes.get(ino) is None or fs.inodes[ino].kind is Kind.FILE
        fs.close()

    trio.run(main)
