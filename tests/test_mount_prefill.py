"""A cold stat storm through a real mount: the daemon reads each directory the storm is
in through the mount, so the kernel learns all its names and the rest of the stats never
reach the daemon (`tierfs.core.prefill`). Counted in LOOKUPs and GCS requests (`tierfs
stats`); times are measured by `benchmarks` (meta), never asserted here."""

from __future__ import annotations

import os
import random
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
from google.cloud import storage

from tests.conftest import MountFactory
from tests.faults import Action, FaultProxy, Rule
from tests.mounting import Mount, stats, wait_until
from tests.test_options_forms import CHECKPOINT_LINE
from tierfs.core.lookups import CHILD_ENTRIES, LISTING_WAIT_S
from tierfs.core.prefill import ENTRIES_PER_LOOKUP

DIRS = 4
FILES = 64  # per directory: 2 lookups would do for 64 names (32 entries per lookup)


def make_dirs(client: storage.Client, bucket: str, *, placeholders: bool) -> dict[str, int]:
    """``DIRS`` directories of ``FILES`` files each; the files and their sizes."""
    blobs = client.bucket(bucket)
    files: dict[str, int] = {}
    for d in range(DIRS):
        if placeholders:
            blobs.blob(f"d{d}/").upload_from_string(b"")
        for f in range(FILES):
            name = f"d{d}/f{f:03d}"
            size = (d * 31 + f * 7) % 50 + 1
            blobs.blob(name).upload_from_string(b"s" * size)
            files[name] = size
    return files


def storm(mount: Mount, files: dict[str, int]) -> None:
    """Stat every file once, in a random order across the directories; check each size."""
    names = sorted(files)
    random.Random(7).shuffle(names)
    for name in names:
        assert os.stat(mount.path / name).st_size == files[name], name


def lookups(mount: Mount) -> int:
    return int(stats(mount)["requests"]["operations"].get("lookup", {}).get("count", 0))


def prefilled(mount: Mount) -> int:
    return int(stats(mount)["directories"]["prefilled"])


@pytest.mark.parametrize(
    "options",
    [(), ("-o", CHECKPOINT_LINE)],
    ids=["defaults", "checkpoint-line"],
)
def test_after_two_stats_in_a_directory_the_kernel_knows_all_its_names(
    mount_factory: MountFactory,
    gcs_client: storage.Client,
    bucket_name: str,
    options: tuple[str, ...],
) -> None:
    placeholders = not options  # (the checkpoint line has implicit-dirs: none needed)
    files = make_dirs(gcs_client, bucket_name, placeholders=placeholders)
    mount = mount_factory(*options)
    before = stats(mount)
    first = {name: size for name, size in files.items() if name.endswith(("f000", "f001"))}
    storm(mount, first)  # two names per directory of 64: a storm begins
    wait_until(lambda: prefilled(mount) >= DIRS, "every directory read for the kernel")
    looked_up = lookups(mount)
    storm(mount, files)  # the rest of it: the kernel knows every name
    assert lookups(mount) == looked_up
    after = stats(mount)
    # Each directory was read for the kernel once, from the listing the metadata prefetch
    # made: GCS listed each directory and the root once, nothing more.
    assert after["gcs"]["lists"] - before["gcs"]["lists"] == DIRS + 1
    assert after["directories"]["prefill_failed"] == 0
    assert after["directories"]["prefilled_entries"] >= DIRS * FILES


def test_with_a_ttl_of_0_the_kernel_keeps_no_names_so_no_directory_is_read(
    mount_factory: MountFactory, gcs_client: storage.Client, bucket_name: str
) -> None:
    files = make_dirs(gcs_client, bucket_name, placeholders=True)
    mount = mount_factory("-o", "metadata-cache:ttl-secs:0")
    storm(mount, files)
    numbers = stats(mount)
    assert numbers["directories"]["prefilled"] == 0
    assert lookups(mount) >= len(files)  # every stat a LOOKUP, as the TTL asks


def test_a_stat_of_one_file_reads_nothing_two_in_64_do(
    mount_factory: MountFactory, gcs_client: storage.Client, bucket_name: str
) -> None:
    files = make_dirs(gcs_client, bucket_name, placeholders=True)
    mount = mount_factory()
    for name in ("d0/f000", "d0/f001", "d1/f000"):  # 64 entries: 2 lookups make a storm
        assert os.stat(mount.path / name).st_size == files[name]
    wait_until(lambda: prefilled(mount) >= 2, "d0 and the root read for the kernel")
    numbers = stats(mount)["directories"]
    # d0 (64 names) and the root (4: two of them looked up), not d1 (one lookup).
    assert (numbers["prefilled"], numbers["prefilled_entries"]) == (2, FILES + DIRS)


def test_the_first_stat_in_a_cold_bucket_is_not_queued_behind_listings_made_ahead(
    mount_factory: MountFactory, gcs_client: storage.Client, bucket_name: str
) -> None:
    """The root's listing names 150 directories and they are listed ahead, 10 at a time;
    the one a stat needs is listed next (urged, `tierfs.core.slots`), not after the 75 or
    so queued before it. (What it saves is time, measured by `benchmarks`: the first stat
    of the meta workload's storm took 233-455 ms before, 136-166 ms after.)"""
    blobs = gcs_client.bucket(bucket_name)
    for d in range(150):
        blobs.blob(f"d{d:03d}/").upload_from_string(b"")
        blobs.blob(f"d{d:03d}/f").upload_from_string(b"x" * (d + 1))
    mount = mount_factory()
    assert os.stat(mount.path / "d075" / "f").st_size == 76
    assert stats(mount)["directories"]["listings_urged"] >= 1


@pytest.mark.parametrize(
    "extra", [(), ("--metadata-prefetch-entries-limit=-1",)], ids=["defaults", "list-all"]
)
def test_a_stat_is_not_held_by_a_listing_that_does_not_come(
    mount_factory: MountFactory,
    fault_proxy: FaultProxy,
    gcs_client: storage.Client,
    bucket_name: str,
    extra: tuple[str, ...],
) -> None:
    """The metadata prefetch of the directory a stat is in does not come (the proxy holds
    every listing: a directory of a million names listed whole, with ``-1``). The stat is
    answered all the same, from a request of its own once the listing has taken
    `LISTING_WAIT_S`; it waited for the whole listing, as long as it took."""
    gcs_client.bucket(bucket_name).blob("f").upload_from_string(b"abc")
    mount = mount_factory(fault_proxy.option, *extra)  # (which lists the bucket once)
    release = threading.Event()
    held = fault_proxy.faults.add(
        Rule(Action(hold_after=1, release=release), method="GET", target=r"/o\?")
    )
    got: dict[str, int] = {}

    def stat() -> None:
        got["size"] = os.stat(mount.path / "f").st_size

    try:
        asker = threading.Thread(target=stat, daemon=True)
        asker.start()
        asker.join(30 * LISTING_WAIT_S)
        assert not asker.is_alive(), "the stat waited for the listing"
        assert got["size"] == 3 and held.fired >= 1  # (the listing was held meanwhile)
    finally:
        release.set()
    assert sorted(os.listdir(mount.path)) == ["f"]


@pytest.fixture
def stormed(
    mount_factory: MountFactory, gcs_client: storage.Client, bucket_name: str
) -> tuple[Mount, dict[str, int]]:
    """A mount at the defaults that has just been through a stat storm; its files."""
    files = make_dirs(gcs_client, bucket_name, placeholders=True)
    mount = mount_factory()
    storm(mount, files)
    return mount, files


def test_changes_after_a_directory_was_read_for_the_kernel_show(
    stormed: tuple[Mount, dict[str, int]],
) -> None:
    mount, files = stormed
    wait_until(lambda: prefilled(mount) >= DIRS, "every directory read for the kernel")
    (mount.path / "d0" / "new").write_bytes(b"new file")
    os.rename(mount.path / "d0" / "f000", mount.path / "d0" / "moved")
    os.unlink(mount.path / "d0" / "f001")
    assert os.stat(mount.path / "d0" / "new").st_size == 8
    assert os.stat(mount.path / "d0" / "moved").st_size == files["d0/f000"]
    for gone in ("f000", "f001"):
        assert not (mount.path / "d0" / gone).exists()
    listed = sorted(os.listdir(mount.path / "d0"))
    want = sorted({n.split("/")[1] for n in files if n.startswith("d0/")} - {"f000", "f001"})
    assert listed == sorted([*want, "moved", "new"])


def test_unmount_right_after_a_storm_succeeds(stormed: tuple[Mount, dict[str, int]]) -> None:
    mount, _ = stormed
    result = mount.unmount()  # (the last directory's read may still hold it open)
    assert result.returncode == 0, result.stderr
    assert not mount.is_mounted()


def test_a_directory_larger_than_the_prefetchs_page_is_read_whole(
    mount_factory: MountFactory, gcs_client: storage.Client, bucket_name: str
) -> None:
    """The metadata prefetch lists a subdirectory one page deep (1,000 names): a storm
    there is one lookup per 32 of those, and the read lists the whole directory."""
    blobs = gcs_client.bucket(bucket_name)
    blobs.blob("big/").upload_from_string(b"")
    names = [f"big/f{i:04}" for i in range(CHILD_ENTRIES + 100)]
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda name: blobs.blob(name).upload_from_string(name.encode()), names))
    blobs.blob("other/").upload_from_string(b"")
    mount = mount_factory()
    os.stat(mount.path / "other")  # the root's listing lists big/ ahead, one page of it
    needed = CHILD_ENTRIES // ENTRIES_PER_LOOKUP + 1
    for name in names[:needed]:
        assert os.stat(mount.path / name).st_size == len(name)
    wait_until(lambda: prefilled(mount) >= 1, "big read for the kernel")
    looked_up = lookups(mount)
    for name in reversed(names):  # the last hundred were past the prefetch's page
        assert os.stat(mount.path / name).st_size == len(name)
    assert lookups(mount) == looked_up
    assert stats(mount)["directories"]["prefilled_entries"] >= len(names)
