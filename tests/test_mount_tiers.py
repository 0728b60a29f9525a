"""The tiers through a real mount, proven by counting GCS media reads (`tierfs stats`)."""

from __future__ import annotations

import concurrent.futures
import os
import subprocess
import time
from pathlib import Path

import pytest
from google.cloud import storage

from tests.conftest import MountFactory
from tests.mounting import Mount, stats, wait_until

MiB = 1 << 20


def media_reads(mount: Mount) -> int:
    return stats(mount)["gcs"]["media_reads"]


def drop_page_cache() -> None:
    subprocess.run(["sync"], check=True)
    Path("/proc/sys/vm/drop_caches").write_text("3\n")


def upload(client: storage.Client, bucket: str, name: str, data: bytes) -> None:
    client.bucket(bucket).blob(name).upload_from_string(data)


def test_second_read_makes_no_media_request(mount: Mount, gcs_client: storage.Client) -> None:
    data = os.urandom(24 * MiB + 123)
    upload(gcs_client, mount.bucket, "f", data)
    assert (mount.path / "f").read_bytes() == data
    first = media_reads(mount)
    assert first > 0
    drop_page_cache()  # the RAM tier, not the kernel, must serve it now
    assert (mount.path / "f").read_bytes() == data
    assert media_reads(mount) == first


def test_remount_serves_from_the_ssd_tier(
    mount_factory: MountFactory, gcs_client: storage.Client, bucket_name: str, tmp_path: Path
) -> None:
    cache = tmp_path / "cache"
    data = os.urandom(20 * MiB + 5)
    upload(gcs_client, bucket_name, "ckpt/shard-0", data)
    mount = mount_factory(f"--cache-dir={cache}", "--implicit-dirs", name="first")
    assert (mount.path / "ckpt" / "shard-0").read_bytes() == data
    assert mount.unmount().returncode == 0
    drop_page_cache()
    again = mount_factory(f"--cache-dir={cache}", "--implicit-dirs", name="second")
    assert (again.path / "ckpt" / "shard-0").read_bytes() == data
    numbers = stats(again)
    assert numbers["gcs"]["media_reads"] == 0
    assert numbers["passthrough"]["opens"] == 1  # the kernel read the SSD tier's file
    modes = {oct(p.stat().st_mode & 0o777) for p in cache.rglob("*")}
    assert modes <= {"0o600", "0o700"}, modes


def test_corrupted_cache_file_is_fetched_again(
    mount_factory: MountFactory, gcs_client: storage.Client, bucket_name: str, tmp_path: Path
) -> None:
    cache = tmp_path / "cache"
    data = os.urandom(17 * MiB)
    upload(gcs_client, bucket_name, "model.bin", data)
    mount = mount_factory(f"--cache-dir={cache}", name="first")
    assert (mount.path / "model.bin").read_bytes() == data
    assert mount.unmount().returncode == 0
    (data_file,) = cache.rglob("*.data")
    blocks = [
        p for p in cache.rglob("*") if p.is_file() and p.suffix not in (".data", ".seal", ".lock")
    ]
    assert len(blocks) == 3
    raw = bytearray(data_file.read_bytes())
    for index in range(len(blocks)):  # flip a byte in the middle of every cached block
        raw[index * 8 * MiB + 1000] ^= 0xFF
    data_file.write_bytes(bytes(raw))
    drop_page_cache()
    again = mount_factory(f"--cache-dir={cache}", name="second")
    assert (again.path / "model.bin").read_bytes() == data
    numbers = stats(again)
    # Two readers (the fill and the kernel read) may both meet one damaged block.
    assert numbers["data"]["tiers"]["ssd"]["corrupt"] >= len(blocks)
    assert numbers["gcs"]["media_reads"] >= len(blocks)


def test_ssd_tier_stays_within_its_limit(
    mount_factory: MountFactory, gcs_client: storage.Client, bucket_name: str, tmp_path: Path
) -> None:
    cache = tmp_path / "cache"
    files = {f"f{i}": os.urandom(9 * MiB) for i in range(4)}
    big = os.urandom(40 * MiB)  # larger than the whole cache
    for name, data in files.items():
        upload(gcs_client, bucket_name, name, data)
    upload(gcs_client, bucket_name, "big", big)
    mount = mount_factory(
        f"--cache-dir={cache}", "--file-cache-max-size-mb=24", "--ram-cache-max-size-mb=0"
    )
    for name, data in files.items():
        assert (mount.path / name).read_bytes() == data
        ssd = stats(mount)["data"]["tiers"]["ssd"]
        assert ssd["used_bytes"] <= 24 * MiB
    assert (mount.path / "big").read_bytes() == big
    ssd = stats(mount)["data"]["tiers"]["ssd"]
    assert ssd["used_bytes"] <= 24 * MiB
    assert ssd["evictions"] > 0
    # What the files really occupy: data files are sparse (evicted blocks are holes).
    on_disk = sum(p.stat().st_blocks * 512 for p in cache.rglob("*") if p.is_file())
    assert on_disk <= 24 * MiB + 64 * 1024


def test_new_generation_is_read_once_metadata_expires(
    mount_factory: MountFactory, gcs_client: storage.Client, bucket_name: str, tmp_path: Path
) -> None:
    mount = mount_factory(f"--cache-dir={tmp_path / 'cache'}", "--metadata-cache-ttl-secs=0")
    upload(gcs_client, bucket_name, "f", b"version one" * 1000)
    assert (mount.path / "f").read_bytes() == b"version one" * 1000
    upload(gcs_client, bucket_name, "f", b"version two!" * 1000)
    assert (mount.path / "f").read_bytes() == b"version two!" * 1000


def test_written_files_are_read_back_from_the_ssd_tier_after_remount(
    mount_factory: MountFactory, gcs_client: storage.Client, bucket_name: str, tmp_path: Path
) -> None:
    """A checkpoint saved through the mount restores from local disk after a remount."""
    cache = tmp_path / "cache"
    mount = mount_factory(f"--cache-dir={cache}", name="save")
    shards = {f"step-1/shard-{i}": os.urandom(9 * MiB + i) for i in range(3)}
    (mount.path / "step-1").mkdir()
    for name, data in shards.items():
        (mount.path / name).write_bytes(data)
    for name, data in shards.items():  # in GCS, byte-identical
        assert gcs_client.bucket(bucket_name).blob(name).download_as_bytes() == data
    assert mount.unmount().returncode == 0  # waits for the daemon, so the cache copy is done
    drop_page_cache()
    again = mount_factory(f"--cache-dir={cache}", name="restore")
    for name, data in shards.items():
        assert (again.path / name).read_bytes() == data
    assert stats(again)["gcs"]["media_reads"] == 0


def test_downloads_reuse_as_many_buffers_as_the_ram_tier_holds(
    mount_factory: MountFactory, gcs_client: storage.Client, bucket_name: str, tmp_path: Path
) -> None:
    """Blocks are downloaded into block buffers (`tierfs.cache.buffers`), reused once the
    RAM tier has let them go: a cold read of 3 times the RAM tier, with a cache dir (the
    SSD tier writes them straight from those buffers) and without, maps no more buffers
    than the RAM tier's blocks and a few, and reads every byte right."""
    data = os.urandom(96 * MiB)
    upload(gcs_client, bucket_name, "ckpt", data)
    for name, extra in (("ssd", [f"--cache-dir={tmp_path / 'cache'}"]), ("ram", [])):
        mount = mount_factory(*extra, "--ram-cache-max-size-mb=32", name=name)
        drop_page_cache()
        assert (mount.path / "ckpt").read_bytes() == data
        numbers = stats(mount)["data"]["block_buffers"]
        # 4 blocks in the RAM tier; the rest: downloads under way, the reader's last block
        assert numbers["made"] <= 8, numbers
        assert numbers["reused"] >= 12 - 8, numbers
        if extra:
            drop_page_cache()
            assert mount.unmount().returncode == 0
            again = mount_factory(*extra, name="again")
            assert (again.path / "ckpt").read_bytes() == data  # what the SSD tier wrote
            assert media_reads(again) == 0
            assert again.unmount().returncode == 0
        else:
            assert mount.unmount().returncode == 0


def test_a_fill_keeps_a_slow_readers_pace(
    mount_factory: MountFactory, gcs_client: storage.Client, bucket_name: str, tmp_path: Path
) -> None:
    """A first read brings the whole object into the SSD tier (a fill), and the fill stays
    near its reader: its blocks wait in the RAM tier for the reader, not evicted unread
    and read back from the SSD tier (`tierfs/core/pace.py`). A RAM tier of 4 blocks and
    an object of 12 stand for 256 MiB and a multi-GiB checkpoint. Unpaced, the fill is
    done long before the reader, and the reader reads most of the object back from disk."""
    data = os.urandom(96 * MiB)
    upload(gcs_client, bucket_name, "ckpt", data)
    mount = mount_factory(f"--cache-dir={tmp_path / 'cache'}", "--ram-cache-max-size-mb=32")
    parts = []
    with open(mount.path / "ckpt", "rb", buffering=0) as handle:
        while chunk := handle.read(MiB):
            parts.append(chunk)
            time.sleep(0.01)  # a consumer slower than GCS (not a wait for a TTL)
    assert b"".join(parts) == data
    numbers = stats(mount)["data"]
    assert numbers["fill_paced"] > 0
    assert numbers["tiers"]["ssd"]["bytes_read"] <= 16 * MiB, numbers["tiers"]


@pytest.mark.parametrize(
    ("size_mib", "blocks"),
    [(384, ()), (64, ("--ram-cache-block-size-mb=1",))],
    ids=["defaults", "1-MiB-blocks"],
)
def test_a_fill_nobody_reads_goes_on_with_a_few_workers(
    mount_factory: MountFactory,
    gcs_client: storage.Client,
    bucket_name: str,
    tmp_path: Path,
    size_mib: int,
    blocks: tuple[str, ...],
) -> None:
    """A reader that reads an object's first bytes and closes it (a loader reading each
    shard's header) leaves its fill to go on in the background with `UNREAD_WORKERS`
    downloads, not all 16, so that it shares the daemon with the other readers; it still
    brings the whole object into the SSD tier, and a remount reads it from there. More
    blocks than workers: 48 of 8 MiB at the defaults (the first 16 start while the reader
    still has the object open, and it may still have it when they end), 64 of 1 MiB."""
    data = os.urandom(size_mib * MiB)
    upload(gcs_client, bucket_name, "shard", data)
    extra = (f"--cache-dir={tmp_path / 'cache'}", *blocks)
    mount = mount_factory(*extra)
    with open(mount.path / "shard", "rb", buffering=0) as handle:
        assert handle.read(4096) == data[:4096]

    def filled() -> bool:
        return bool(stats(mount)["data"]["tiers"]["ssd"]["used_bytes"] >= len(data))

    wait_until(filled, "the fill to bring the object in")
    assert stats(mount)["data"]["fill_unread_waits"] > 0
    assert mount.unmount().returncode == 0
    again = mount_factory(*extra, name="again")
    assert (again.path / "shard").read_bytes() == data
    assert media_reads(again) == 0
    assert again.unmount().returncode == 0


def test_fills_keep_eight_slow_readers_pace_at_the_defaults(
    mount_factory: MountFactory, gcs_client: storage.Client, bucket_name: str, tmp_path: Path
) -> None:
    """The same at the defaults a user gets (256 MiB RAM tier, 8 MiB blocks): eight shards
    restored at once by slow readers, 384 MiB in all, more than the RAM tier holds. Each
    fill keeps its lead small enough that all eight fit (`Paces`), so the readers find
    most of their blocks in RAM. Eight leads of one block fill the RAM tier exactly, so a
    reader that falls behind the others still loses a block or a few: paced, 0-56 MiB
    were read back from the SSD tier over 12 runs (CI once 56, idle or with both CPUs
    busy alike). Unpaced (`Paces.keep` returning at once) the fills finish first and
    256-336 MiB are read back (4 runs): the bound, a quarter of the data, tells them apart."""
    shards = {f"ckpt/shard-{i}": os.urandom(48 * MiB) for i in range(8)}
    for name, data in shards.items():
        upload(gcs_client, bucket_name, name, data)
    mount = mount_factory(f"--cache-dir={tmp_path / 'cache'}", "--implicit-dirs")

    def restore(name: str) -> bytes:
        parts = []
        with open(mount.path / name, "rb", buffering=0) as handle:
            while chunk := handle.read(MiB):
                parts.append(chunk)
                time.sleep(0.02)  # a consumer slower than GCS (not a wait for a TTL)
        return b"".join(parts)

    with concurrent.futures.ThreadPoolExecutor(len(shards)) as pool:
        got = dict(zip(shards, pool.map(restore, shards), strict=True))
    assert got == shards
    numbers = stats(mount)["data"]
    assert numbers["tiers"]["ssd"]["bytes_read"] <= 96 * MiB, numbers["tiers"]
    assert numbers["fill_paced"] > 0


def test_a_second_mount_of_the_bucket_on_the_same_cache_dir_runs_without_it(
    mount_factory: MountFactory, gcs_client: storage.Client, bucket_name: str, tmp_path: Path
) -> None:
    """Two live mounts of one bucket on one cache-dir: the second's start-up scan deleted
    the first's files in progress and its evictions punched holes in blocks the first
    served (zeros). The second now runs without the SSD tier and says so."""
    cache = tmp_path / "cache"
    data = os.urandom(20 * MiB + 7)
    upload(gcs_client, bucket_name, "model.bin", data)
    first = mount_factory(f"--cache-dir={cache}", name="first")
    assert (first.path / "model.bin").read_bytes() == data

    def settled() -> bool:  # (its blocks are written behind the reader)
        ssd = stats(first)["data"]["tiers"]["ssd"]
        return bool(ssd["entries"] == 3 and ssd["pending_bytes"] == 0 and ssd["seals"] == 1)

    wait_until(settled, "the first mount's SSD tier to hold the object")
    held = sorted(p.name for p in cache.rglob("*") if p.is_file())
    second = mount_factory(f"--cache-dir={cache}", "--file-cache-max-size-mb=1", name="second")
    assert (second.path / "model.bin").read_bytes() == data
    log = second.log.read_text(encoding="utf-8")
    assert "is used by another tierfs mount of gs://" in log
    assert stats(second)["data"]["tiers"]["ssd"]["capacity_bytes"] == 0
    # The first one's files are whole, and it still serves them from its tier.
    assert sorted(p.name for p in cache.rglob("*") if p.is_file()) == held
    drop_page_cache()
    reads = media_reads(first)
    assert (first.path / "model.bin").read_bytes() == data
    assert media_reads(first) == reads
    # Once the first is gone, the next mount takes the directory over.
    assert first.unmount().returncode == 0
    assert second.unmount().returncode == 0
    third = mount_factory(f"--cache-dir={cache}", name="third")
    assert (third.path / "model.bin").read_bytes() == data
    assert media_reads(third) == 0
