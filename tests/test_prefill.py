"""`DirPrefill`: when a stat storm has the daemon read a directory through the mount, and
what that read answers (`tierfs.core.prefill`). A kernel stand-in records the reads;
time is injected. Through a real mount: tests/test_mount_prefill.py."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import trio
import trio.testing
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.test_metadata import Clock
from tierfs.core.background import Background
from tierfs.core.filesystem import Filesystem, Settings
from tierfs.core.inodes import ROOT_INO
from tierfs.core.kernel import NoKernel
from tierfs.core.listahead import FRESH_S
from tierfs.core.namespace import DirListing
from tierfs.core.prefill import (
    ENTRIES_PER_LOOKUP,
    MAX_ENTRIES,
    MAX_FAILURES,
    MIN_LOOKUPS,
    DirPrefill,
)
from tierfs.storage import ObjectInfo
from tierfs.storage.memory import MemoryBucket


class ReadingKernel(NoKernel):
    """A kernel whose mountpoint the daemon can read: records each directory read."""

    reads_dirs = True  # type: ignore[assignment]

    def __init__(self, fail: OSError | None = None) -> None:
        self.read: list[str] = []
        self.fail = fail

    def read_dir(self, path: str) -> int:
        if self.fail is not None:
            raise self.fail
        self.read.append(path)
        return 7


def listing(entries: int, *, complete: bool = True) -> DirListing:
    info = ObjectInfo(name="x", size=1, generation=1, metageneration=1)
    return DirListing(
        files=tuple((f"f{i}", info) for i in range(entries)), dirs=(), complete=complete
    )


async def settle() -> None:
    """Until the reads started have run: their tasks started, their threads done."""
    await trio.testing.wait_all_tasks_blocked()
    await trio.testing.wait_all_threads_completed()
    await trio.testing.wait_all_tasks_blocked()


async def run_prefill(
    events: list[tuple[str, str, int]],
    *,
    kernel: ReadingKernel | None = None,
    keeps_names: bool = True,
) -> tuple[ReadingKernel, DirPrefill]:
    """Feed ``events`` ("listed", dir, entries) / ("found", dir, 0) to a `DirPrefill`;
    the kernel and the prefill once every read it started is done."""
    kernel = kernel or ReadingKernel()
    async with trio.open_nursery() as nursery:
        prefill = DirPrefill(kernel, Background(nursery), keeps_names)
        for kind, path, entries in events:
            if kind == "listed":
                prefill.listed(path, listing(entries))
            else:
                prefill.found(path)
            await settle()
    return kernel, prefill


def storm(path: str, entries: int, lookups: int) -> list[tuple[str, str, int]]:
    return [("listed", path, entries)] + [("found", path, 0)] * lookups


async def test_a_directory_is_read_once_lookups_found_one_name_per_32_entries() -> None:
    entries = 4 * ENTRIES_PER_LOOKUP  # 128: 4 lookups
    kernel, prefill = await run_prefill(storm("a", entries, 3))
    assert kernel.read == []
    kernel, prefill = await run_prefill(storm("a", entries, 4))
    assert kernel.read == ["a"]
    assert prefill.counts == {"dirs": 1, "entries": 7, "failed": 0}


async def test_a_small_directory_waits_for_two_lookups_and_is_read_once() -> None:
    kernel, _ = await run_prefill(storm("a", 10, 1))
    assert kernel.read == []
    kernel, _ = await run_prefill(storm("a", 10, 50))  # the storm goes on: read once
    assert kernel.read == ["a"]
    kernel, _ = await run_prefill(storm("a", 10, 2) + storm("a", 10, 2))  # listed again
    assert kernel.read == ["a", "a"]


@pytest.mark.parametrize(
    ("what", "events", "options"),
    [
        ("never listed", [("found", "a", 0)] * 100, {}),
        ("one or two names", storm("a", MIN_LOOKUPS, 100), {}),
        ("too large", storm("a", MAX_ENTRIES + 1, MAX_ENTRIES), {}),
        ("the kernel keeps no names", storm("a", 10, 100), {"keeps_names": False}),
        ("lookups elsewhere", storm("a", 10, 0) + [("found", "b", 0)] * 100, {}),
    ],
)
async def test_no_read(what: str, events: list[tuple[str, str, int]], options: dict) -> None:
    kernel, _ = await run_prefill(events, **options)
    assert kernel.read == [], what


async def test_a_cut_listing_counts_as_at_least_its_entries_and_a_blind_mount_reads_none() -> None:
    kernel = ReadingKernel()
    async with trio.open_nursery() as nursery:
        prefill = DirPrefill(kernel, Background(nursery), True)
        prefill.listed("a", listing(1000, complete=False))  # (the prefetch's one page)
        blind = DirPrefill(NoKernel(), Background(nursery), True)
        blind.listed("a", listing(10))
        for _ in range(1000 // ENTRIES_PER_LOOKUP):
            prefill.found("a")
            blind.found("a")
        await settle()
        assert kernel.read == []  # 31 lookups: fewer than one per 32 of 1,000+ entries
        prefill.found("a")
        blind.found("a")
        await settle()
    assert kernel.read == ["a"]


async def test_reads_that_fail_stop_the_prefill_for_the_mount_with_one_line(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, "tierfs.fs")
    events = [e for d in range(MAX_FAILURES + 2) for e in storm(f"d{d}", 10, 2)]
    kernel = ReadingKernel(fail=PermissionError(13, "Permission denied"))
    _, prefill = await run_prefill(events, kernel=kernel)
    assert prefill.off
    assert prefill.counts["failed"] == MAX_FAILURES
    lines = [r for r in caplog.records if r.levelno >= logging.INFO]
    assert len(lines) == 1
    assert "Permission denied" in lines[0].getMessage()


async def test_directories_removed_before_their_read_do_not_stop_the_prefill() -> None:
    events = [e for d in range(MAX_FAILURES + 2) for e in storm(f"d{d}", 10, 2)]
    kernel = ReadingKernel(fail=FileNotFoundError(2, "No such file or directory"))
    _, prefill = await run_prefill(events, kernel=kernel)
    assert not prefill.off
    assert prefill.counts["failed"] == MAX_FAILURES + 2


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["listed", "found"]),
            st.sampled_from(["a", "b", "c"]),
            st.integers(min_value=0, max_value=200),
        ),
        max_size=60,
    )
)
def test_model_each_read_follows_a_listing_and_enough_lookups_in_it(
    events: list[tuple[str, str, int]],
) -> None:
    """A model: per directory, the entries of its last listing and the lookups found since;
    a read happens exactly when the model says, and at most once per listing."""
    kernel, _ = trio.run(lambda: run_prefill(events))
    expected: list[str] = []
    watched: dict[str, list[int]] = {}
    for kind, path, entries in events:
        if kind == "listed":
            if MIN_LOOKUPS < entries <= MAX_ENTRIES:
                watched[path] = [entries, 0]
            else:
                watched.pop(path, None)  # (not watched: an older listing's count is moot)
            continue
        counts = watched.get(path)
        if counts is None:
            continue
        counts[1] += 1
        if counts[1] >= MIN_LOOKUPS and counts[1] * ENTRIES_PER_LOOKUP >= counts[0]:
            expected.append(path)
            del watched[path]
    assert kernel.read == expected


# -- the prefill's own readdir, in the core ----------------------------------------------


async def test_the_prefill_readdir_answers_from_the_listing_made_ahead(
    tmp_path: Path,
) -> None:
    bucket = MemoryBucket("prefill")
    clock = Clock()
    for d in ("a", "b"):
        bucket.put(f"{d}/", b"")
        for i in range(40):
            bucket.put(f"{d}/f{i:02}", b"x" * i)
    kernel = ReadingKernel()
    async with trio.open_nursery() as nursery:
        fs = Filesystem(
            bucket,
            Settings(temp_dir=str(tmp_path), metadata_ttl_s=60.0, entry_timeout_s=60.0),
            monotonic_s=clock,
            background=Background(nursery),
            kernel=kernel,
        )
        dirs = {d: await fs.lookup(ROOT_INO, d) for d in ("a", "b")}
        await trio.testing.wait_all_tasks_blocked()
        for i in range(2):  # 40 entries: two lookups make a storm
            await fs.lookup(dirs["a"].ino, f"f{i:02}")
            await fs.lookup(dirs["b"].ino, f"f{i:02}")
        await settle()
        assert sorted(kernel.read) == ["a", "b"]  # (not the root: two names are no storm)
        lists = bucket.statistics()["lists"]

        fh = fs.opendir(dirs["a"].ino, prefill=True)  # the kernel's READDIRPLUS of it
        names = [name for name, _, _ in await fs.readdir(fh, 0)]
        fs.releasedir(fh)
        assert names == [f"f{i:02}" for i in range(40)]
        assert bucket.statistics()["lists"] == lists  # (the listing made ahead answered)
        clock.now += FRESH_S + 1  # b's listing is too old to answer a readdir now: its own
        fh = fs.opendir(dirs["b"].ino, prefill=True)
        assert len(await fs.readdir(fh, 0)) == 40
        fs.releasedir(fh)
        assert bucket.statistics()["lists"] == lists + 1
        numbers = fs.statistics()["directories"]
        assert isinstance(numbers, dict)
        assert (numbers["opens"], numbers["listings_served"]) == (0, 0)  # not the user's
        nursery.cancel_scope.cancel()


async def test_the_prefill_readdir_of_a_directory_too_large_answers_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("tierfs.core.directories.PREFILL_MAX_ENTRIES", 30)
    bucket = MemoryBucket("prefill")
    bucket.put("a/", b"")
    for i in range(40):
        bucket.put(f"a/f{i:02}", b"x")
    fs = Filesystem(
        bucket, Settings(temp_dir=str(tmp_path), metadata_ttl_s=60.0, entry_timeout_s=60.0)
    )
    a = await fs.lookup(ROOT_INO, "a")
    fh = fs.opendir(a.ino, prefill=True)
    assert await fs.readdir(fh, 0) == []  # a listing of 30 was cut: the kernel learns nothing
    fs.releasedir(fh)
    fh = fs.opendir(a.ino)  # a user's readdir lists it all
    assert len(await fs.readdir(fh, 0)) == 40
    fs.releasedir(fh)
