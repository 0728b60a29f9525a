"""Requests answered at once, without a wait (`tierfs.fuse.operations._AT_ONCE` and
`_NEVER_WAIT`). A lookup the metadata cache answers (`Lookups.lookup_now`) gives what
`lookup` would; everything else is left to `lookup`. (The model tests walk paths the
same way: tests/test_model.py.)"""

from __future__ import annotations

import errno
from pathlib import Path
from typing import Any

import pyfuse3
import pytest
import trio

from tests.test_metadata import make, requests
from tierfs.core.background import Background
from tierfs.core.inodes import ROOT_INO, Inode
from tierfs.core.namespace import SYMLINK_TARGET_KEY, Found
from tierfs.errors import NotADirectory, NotFound
from tierfs.fuse.operations import INTERRUPTS, Operations


async def test_a_name_the_metadata_cache_holds_is_answered_at_once(tmp_path: Path) -> None:
    fs, bucket, clock = make(tmp_path, metadata_ttl_s=60.0)
    bucket.put("d/", b"")
    bucket.put("d/f", b"data")
    assert fs.lookup_now(ROOT_INO, "d") is None  # never asked: `lookup` asks GCS
    d = await fs.lookup(ROOT_INO, "d")
    f = await fs.lookup(d.ino, "f")
    sent, held = requests(bucket), f.lookups
    assert fs.lookup_now(ROOT_INO, "d") is d
    assert fs.lookup_now(d.ino, "f") is f
    assert f.lookups == held + 1  # the kernel holds one more reference, as after `lookup`
    assert requests(bucket) == sent
    clock.now += 61  # past the metadata TTL: `lookup` asks GCS again
    assert fs.lookup_now(d.ino, "f") is None
    assert await fs.lookup(d.ino, "f") is f and requests(bucket) > sent


async def test_a_new_generation_the_cache_holds_makes_the_inode_lookup_would(
    tmp_path: Path,
) -> None:
    """Another client replaced the file and the metadata cache learnt of it (as from a
    listing): at once, the file's inode is replaced, as `lookup` replaces it."""
    fs, bucket, _clock = make(tmp_path, metadata_ttl_s=60.0)
    bucket.put("f", b"one")
    before = await fs.lookup(ROOT_INO, "f")
    new = bucket.put("f", b"two, longer")
    cache = fs.names.cache
    asked = cache.asking()
    cache.put_answer("f", Found(False, new), asked)
    cache.answered(asked)
    now = fs.lookup_now(ROOT_INO, "f")
    assert now is not None and now is not before and fs.inodes.current("f") is now
    assert (now.generation, now.size, now.lookups) == (new.generation, len(b"two, longer"), 1)
    assert now.generation > before.generation


async def test_what_is_left_to_lookup(tmp_path: Path) -> None:
    fs, bucket, _clock = make(tmp_path, metadata_ttl_s=60.0, negative_ttl_s=60.0)
    bucket.put("f", b"data")
    bucket.put("link", b"", metadata={SYMLINK_TARGET_KEY: "f"})
    f = await fs.lookup(ROOT_INO, "f")
    link = await fs.lookup(ROOT_INO, "link")
    with pytest.raises(NotFound):
        await fs.lookup(ROOT_INO, "nothing")
    cache = fs.names.cache
    counted = (cache.hits, cache.negative_hits, cache.misses)
    assert fs.lookup_now(ROOT_INO, "nothing") is None  # cached as absent: ENOENT is lookup's
    assert fs.lookup_now(ROOT_INO, "unknown") is None  # not cached
    assert fs.lookup_now(f.ino, "x") is None  # not a directory: lookup says so
    assert fs.lookup_now(12345, "x") is None  # no such inode
    assert (cache.hits, cache.negative_hits, cache.misses) == counted  # counted once, by lookup
    with pytest.raises(NotADirectory):
        await fs.lookup(f.ino, "x")
    fs.inodes.detach(link)  # a new symlink: its target is read first, by lookup
    assert fs.lookup_now(ROOT_INO, "link") is None
    again = await fs.lookup(ROOT_INO, "link")
    assert again.target == "f"
    assert fs.lookup_now(ROOT_INO, "link") is again  # known now: at once


async def test_the_kernels_lookup_is_answered_at_once_once_cached(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Through the pyfuse3 handler: the second LOOKUP of a name never reaches the
    awaited path (no cancel scope, no wait), and answers the same entry."""
    async with trio.open_nursery() as nursery:
        fs, bucket, _clock = make(tmp_path, metadata_ttl_s=60.0)
        fs.background = Background(nursery)
        bucket.put("f", b"data")
        ops = Operations(fs)
        awaited: list[str] = []
        lookup = fs.lookup

        async def counted(parent: int, name: str) -> Inode:
            awaited.append(name)
            return await lookup(parent, name)

        monkeypatch.setattr(fs, "lookup", counted)
        first = await ops.lookup(ROOT_INO, b"f")
        second = await ops.lookup(ROOT_INO, b"f")
        assert awaited == ["f"]
        assert (second.st_ino, second.st_size, second.st_mtime_ns) == (
            first.st_ino,
            4,
            first.st_mtime_ns,
        )
        nursery.cancel_scope.cancel()


def _answered_without_a_wait(coro: Any) -> Any:
    """Run a handler's coroutine outside any event loop: it must finish on its first step
    (an await that suspends would yield here instead)."""
    with pytest.raises(StopIteration) as done:
        coro.send(None)
    return done.value.value


async def test_requests_that_never_wait_finish_in_one_step(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """... and skip the machinery that lets a waiting request be interrupted."""
    fs, bucket, _clock = make(tmp_path, metadata_ttl_s=60.0)
    bucket.put("f", b"data")
    bucket.put("link", b"", metadata={SYMLINK_TARGET_KEY: "f"})
    ops = Operations(fs)
    interruptible: list[str] = []
    run = ops.interrupts.run

    async def spied(op: str, *args: Any) -> Any:
        interruptible.append(op)
        return await run(op, *args)

    monkeypatch.setattr(ops.interrupts, "run", spied)
    f = await ops.lookup(ROOT_INO, b"f")
    link = await ops.lookup(ROOT_INO, b"link")
    assert interruptible == (["lookup", "lookup"] if INTERRUPTS else [])  # GCS was asked
    assert _answered_without_a_wait(ops.lookup(ROOT_INO, b"f")).st_ino == f.st_ino
    assert _answered_without_a_wait(ops.getattr(f.st_ino, None)).st_size == 4
    assert _answered_without_a_wait(ops.readlink(link.st_ino, None)) == b"f"
    assert _answered_without_a_wait(ops.statfs(None)).f_bsize > 0
    fh = _answered_without_a_wait(ops.opendir(ROOT_INO, None))
    await ops.releasedir(fh if isinstance(fh, int) else fh.fh)
    assert interruptible == (["lookup", "lookup"] if INTERRUPTS else [])


async def test_answers_at_once_are_counted_never_in_flight(tmp_path: Path) -> None:
    """Per-operation counts (`tierfs stats`, the metrics) include requests answered at once,
    and their errors; the watchdog never sees them (they cannot wait)."""
    fs, bucket, _clock = make(tmp_path, metadata_ttl_s=60.0)
    bucket.put("f", b"data")
    ops = Operations(fs)
    await ops.lookup(ROOT_INO, b"f")  # asks GCS: counted by the awaited path
    _answered_without_a_wait(ops.lookup(ROOT_INO, b"f"))
    _answered_without_a_wait(ops.getattr(ROOT_INO, None))
    with pytest.raises(pyfuse3.FUSEError) as bad:  # not UTF-8: refused at once, counted
        _answered_without_a_wait(ops.lookup(ROOT_INO, b"\xff"))
    assert bad.value.errno == errno.EINVAL
    seen = ops.inflight.latencies()
    assert (seen["lookup"].count, seen["lookup"].errors) == (3, 1)
    assert seen["getattr"].count == 1 and len(ops.inflight) == 0
    assert seen["lookup"].total_s < 1.0  # seconds, not a clock's absolute reading
