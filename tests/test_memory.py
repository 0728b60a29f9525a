"""The daemon's memory: allocator settings (tierfs.cli.memory) that must take on glibc, and
what it loads."""

from __future__ import annotations

import importlib.util
import platform
import subprocess
import sys

import pytest
from google.cloud import storage

from tests.mounting import Mount
from tierfs.cli.memory import (
    MMAP_THRESHOLD_MAX,
    TRIM_MAX_BYTES,
    TRIM_MIN_BYTES,
    daemon_environment,
    mmap_threshold,
    trim_threshold,
    tune_allocator,
)


def test_threshold_sits_just_above_a_block_and_below_glibcs_limit() -> None:
    assert mmap_threshold(8 << 20) == 9 << 20  # 8 MiB blocks from the heap, 1 MiB callocs not
    assert mmap_threshold(1 << 20) == 2 << 20
    assert mmap_threshold(64 << 20) == MMAP_THRESHOLD_MAX


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="mallopt is glibc's")
def test_tuning_takes_on_glibc() -> None:
    assert tune_allocator(8 << 20) is True


def test_trim_threshold_is_the_ram_tiers_size_within_bounds() -> None:
    assert trim_threshold(256 << 20) == 512 << 20
    assert trim_threshold(0) == TRIM_MIN_BYTES  # no RAM tier: downloads still come and go
    assert trim_threshold(64 << 30) == TRIM_MAX_BYTES


# A RAM tier's worth of 8 MiB blocks made, all freed at once (a fill's reservation emptying
# the tier), then made again: the second round must reuse the heap, not fault it in anew.
_REFILL = """
import resource, sys
from tierfs.cli.memory import tune_allocator
assert tune_allocator(8 << 20, 256 << 20)
def fill():
    return [b'x' * (8 << 20) for _ in range(32)]
blocks = fill()
del blocks
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
blocks = fill()
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="mallopt is glibc's")
def test_a_ram_tier_emptied_at_once_is_refilled_without_page_faults() -> None:
    result = subprocess.run(
        [sys.executable, "-c", _REFILL], capture_output=True, text=True, check=True
    )
    faults = int(result.stdout)
    # 256 MiB faulted in again would be 65,536 faults (4 KiB pages).
    assert faults < 4096, f"{faults} page faults refilling a freed RAM tier"


def test_the_mount_daemon_does_not_load_grpc(mount: Mount, gcs_client: storage.Client) -> None:
    """grpc is installed (for the CSI plugin) and google-api-core imports it when it can:
    9 MiB of resident memory the daemon never uses (tierfs/__main__.py keeps it out)."""
    assert importlib.util.find_spec("grpc") is not None, "grpcio is part of the stack"
    gcs_client.bucket(mount.bucket).blob("a.txt").upload_from_string(b"hello")
    assert (mount.path / "a.txt").read_bytes() == b"hello"  # the GCS client is in use
    (pid,) = mount.pids()
    with open(f"/proc/{pid}/maps", encoding="utf-8") as maps:
        loaded = [line.split()[-1] for line in maps if "grpc" in line]
    assert loaded == [], f"the daemon mapped {sorted(set(loaded))}"


def test_a_daemon_starts_with_its_heap_on_huge_pages_unless_told_otherwise() -> None:
    assert daemon_environment({"HOME": "/root"}) == {
        "HOME": "/root",
        "GLIBC_TUNABLES": "glibc.malloc.hugetlb=1",
    }
    other = {"GLIBC_TUNABLES": "glibc.malloc.arena_max=2"}
    assert daemon_environment(other)["GLIBC_TUNABLES"] == (
        "glibc.malloc.arena_max=2:glibc.malloc.hugetlb=1"
    )
    for mine in ("glibc.malloc.hugetlb=0", "glibc.malloc.arena_max=2:glibc.malloc.hugetlb=2"):
        assert daemon_environment({"GLIBC_TUNABLES": mine})["GLIBC_TUNABLES"] == mine


def _huge_pages_offered() -> bool:
    try:
        with open("/sys/kernel/mm/transparent_hugepage/enabled", encoding="ascii") as setting:
            return "[never]" not in setting.read()
    except OSError:
        return False


def test_the_mount_daemons_heap_is_on_huge_pages(mount: Mount, gcs_client: storage.Client) -> None:
    """`daemon_environment`, through ``tierfs mount``: the daemon runs with the tunable,
    and where the kernel offers huge pages, a read of 64 MiB puts its heap on them."""
    gcs_client.bucket(mount.bucket).blob("big").upload_from_string(b"h" * (64 << 20))
    assert (mount.path / "big").read_bytes() == b"h" * (64 << 20)
    (pid,) = mount.pids()
    with open(f"/proc/{pid}/environ", "rb") as environ:
        variables = environ.read().split(b"\0")
    tunables = [v.split(b"=", 1)[1] for v in variables if v.startswith(b"GLIBC_TUNABLES=")]
    assert tunables and b"glibc.malloc.hugetlb=1" in tunables[0].split(b":"), tunables
    if not _huge_pages_offered():
        return  # (the kernel has them off: the tunable does nothing, and harms nothing)
    with open(f"/proc/{pid}/smaps_rollup", encoding="ascii") as rollup:
        huge = [int(line.split()[1]) for line in rollup if line.startswith("AnonHugePages:")]
    assert huge and huge[0] >= 2048, f"no huge pages in the daemon's memory: {huge}"
