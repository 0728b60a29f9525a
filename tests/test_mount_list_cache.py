"""The kernel's list cache (``file-system:kernel-list-cache-ttl-secs``) through a real mount.

The kernel answers a repeated readdir itself (FOPEN_CACHE_DIR, kept with FOPEN_KEEP_CACHE),
which needs the pyfuse3 that tierfs builds (deploy/pyfuse3/). The daemon's own counters
(`tierfs stats`, "directories") show which listings it served; changes made through the
mount show at once, as with gcsfuse."""

from __future__ import annotations

import os
import subprocess

import pytest
from google.cloud import storage

from tests.conftest import MountFactory
from tests.mounting import TIERFS, Mount, stats
from tierfs.fuse.operations import KERNEL_LIST_CACHE, kernel_drops_listings


@pytest.fixture
def cached(mount_factory: MountFactory, gcs_client: storage.Client, bucket_name: str) -> Mount:
    if not KERNEL_LIST_CACHE:
        pytest.fail(
            "this pyfuse3 cannot ask the kernel to cache listings: install the one "
            "deploy/pyfuse3/build builds (make does)"
        )
    for name in ("d/a", "d/b", "d/sub/c"):
        gcs_client.bucket(bucket_name).blob(name).upload_from_string(b"x")
    return mount_factory("--implicit-dirs", "--kernel-list-cache-ttl-secs=-1")


def served(mount: Mount) -> int:
    return stats(mount)["directories"]["listings_served"]


def test_the_kernel_answers_a_repeated_listing_itself(
    cached: Mount, gcs_client: storage.Client
) -> None:
    d = cached.path / "d"
    assert sorted(os.listdir(d)) == ["a", "b", "sub"]
    first = served(cached)
    gcs_client.bucket(cached.bucket).blob("d/e").upload_from_string(b"x")  # another client
    for _ in range(3):
        assert sorted(os.listdir(d)) == ["a", "b", "sub"]  # the kernel's copy, within the TTL
    numbers = stats(cached)["directories"]
    assert numbers["listings_served"] == first
    assert numbers["kept"] >= 3
    human = subprocess.run(
        [TIERFS, "stats", str(cached.path)], capture_output=True, text=True, timeout=60
    )
    assert f"listings    served {first}   opens {numbers['opens']}" in human.stdout


def test_changes_through_the_mount_show_at_once(cached: Mount) -> None:
    d = cached.path / "d"
    assert sorted(os.listdir(d)) == ["a", "b", "sub"]
    (d / "new").write_bytes(b"1")
    assert sorted(os.listdir(d)) == ["a", "b", "new", "sub"]
    os.mkdir(d / "made")
    assert sorted(os.listdir(d)) == ["a", "b", "made", "new", "sub"]
    os.rename(d / "a", d / "sub" / "a")
    assert sorted(os.listdir(d)) == ["b", "made", "new", "sub"]
    assert sorted(os.listdir(d / "sub")) == ["a", "c"]
    os.unlink(d / "b")
    os.rmdir(d / "made")
    assert sorted(os.listdir(d)) == ["new", "sub"]
    before = served(cached)
    assert sorted(os.listdir(d)) == ["new", "sub"]
    assert served(cached) == before  # and the new listing is cached again


def test_list_cache_off_asks_the_daemon_every_time(
    mount_factory: MountFactory, gcs_client: storage.Client, bucket_name: str
) -> None:
    gcs_client.bucket(bucket_name).blob("d/a").upload_from_string(b"x")
    mount = mount_factory("--implicit-dirs", "--kernel-list-cache-ttl-secs=0")
    d = mount.path / "d"
    assert os.listdir(d) == ["a"]
    first = served(mount)
    gcs_client.bucket(bucket_name).blob("d/b").upload_from_string(b"x")
    assert sorted(os.listdir(d)) == ["a", "b"]
    assert served(mount) == first + 1


@pytest.mark.parametrize(
    ("release", "drops"),
    [
        ("6.18.44-fc-v782", True),
        ("6.13.0", True),
        ("6.12.9-amd64", False),
        ("6.9-rc1", False),
        ("6.8.0-45-generic", True),
        ("5.15.0", True),
        ("weird", True),
    ],
)
def test_kernels_that_keep_listings_past_their_ttl_are_known(release: str, drops: bool) -> None:
    assert kernel_drops_listings(release) is drops
