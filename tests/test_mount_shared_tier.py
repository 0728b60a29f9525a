"""The shared tier through real mounts: several mounts of one machine stand for nodes,
sharing one local directory (NFS or Lustre in production), each with its own SSD tier.
GCS media reads (`tierfs stats`) prove where the bytes came from."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from pathlib import Path

import google_crc32c
from google.cloud import storage

from tests.conftest import MountFactory
from tests.mounting import TIERFS, Mount, stats, wait_until
from tests.test_mount_option_effects import free_port, scrape
from tierfs.cache.shared_format import MARKER_SUFFIX, SHARED_MAGIC
from tierfs.cache.ssd_format import _TMP_PREFIX, HEADER

MiB = 1 << 20


def node(mount_factory: MountFactory, tmp_path: Path, name: str, *extra: str) -> Mount:
    share = tmp_path / "share"
    share.mkdir(exist_ok=True)
    return mount_factory(
        f"--cache-dir={tmp_path / ('ssd-' + name)}",
        "--enable-experimental-shared-chunk-cache",
        f"--file-cache-shared-cache-dir={share}",
        "--implicit-dirs",
        *extra,
        name=name,
    )


def upload(client: storage.Client, bucket: str, name: str, data: bytes) -> None:
    client.bucket(bucket).blob(name).upload_from_string(data)


def shared_stats(mount: Mount) -> dict:
    return stats(mount)["data"]["tiers"]["shared"]


def block_files(tmp_path: Path) -> list[Path]:
    root = tmp_path / "share" / "tierfs-shared"
    return [
        p
        for p in root.rglob("*")
        if p.is_file() and not p.name.startswith(_TMP_PREFIX) and not p.name.endswith(MARKER_SUFFIX)
    ]


def whole(path: Path) -> bool:
    """Whether a published block file is complete and its CRC32C right."""
    raw = path.read_bytes()
    if len(raw) < HEADER.size:
        return False
    magic, _v, _r, name_len, _g, _i, _b, length, crc = HEADER.unpack_from(raw)
    payload = raw[HEADER.size + name_len :]
    return magic == SHARED_MAGIC and len(payload) == length and google_crc32c.value(payload) == crc


def test_a_mount_joining_later_reads_a_checkpoint_with_no_gcs_media_read(
    mount_factory: MountFactory, gcs_client: storage.Client, bucket_name: str, tmp_path: Path
) -> None:
    shards = {f"ckpt/shard-{i}": os.urandom(9 * MiB + i * 4097) for i in range(3)}
    for name, data in shards.items():
        upload(gcs_client, bucket_name, name, data)
    first = node(mount_factory, tmp_path, "a")
    for name, data in shards.items():
        assert (first.path / name).read_bytes() == data
    # Two 8 MiB blocks per shard, published off the reader's path (its read returns once
    # the block is downloaded; the slower tiers store it after).
    wait_until(lambda: len(block_files(tmp_path)) == 3 * 2, what="the blocks published")
    published = block_files(tmp_path)
    assert all(whole(p) for p in published)
    modes = {p.stat().st_mode & 0o777 for p in (tmp_path / "share").rglob("*")}
    assert modes <= {0o600, 0o700}, modes
    port = free_port()
    late = node(mount_factory, tmp_path, "b", f"--prometheus-port={port}")
    for name, data in shards.items():
        assert (late.path / name).read_bytes() == data
    numbers = stats(late)
    assert numbers["gcs"]["media_reads"] == 0
    assert numbers["data"]["tiers"]["shared"]["hits"] >= 6
    assert numbers["data"]["tiers"]["shared"]["corrupt"] == 0
    metrics = scrape(port)
    assert metrics['tierfs_tier_hits_total{tier="shared"}'] >= 6
    assert metrics['tierfs_tier_bytes_read_total{tier="shared"}'] >= 27 * MiB
    assert 'tierfs_tier_waits_total{tier="shared"}' in metrics
    assert 'tierfs_tier_evictions_total{tier="shared"}' in metrics


def test_mounts_restoring_at_once_read_equal_bytes_and_fetch_about_once(
    mount_factory: MountFactory, gcs_client: storage.Client, bucket_name: str, tmp_path: Path
) -> None:
    data = os.urandom(64 * MiB + 333)
    upload(gcs_client, bucket_name, "model.bin", data)
    mounts = [node(mount_factory, tmp_path, f"n{i}") for i in range(3)]
    results: dict[int, bytes] = {}

    def restore(i: int) -> None:
        results[i] = (mounts[i].path / "model.bin").read_bytes()

    threads = [threading.Thread(target=restore, args=(i,)) for i in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert [results.get(i) == data for i in range(3)] == [True] * 3
    fetched = sum(stats(m)["data"]["gcs_blocks"] for m in mounts)
    assert fetched <= 9 + 2  # 9 blocks; a claim lost to a race may cost one more
    assert sum(shared_stats(m)["waits"] for m in mounts) > 0


def test_a_torn_block_is_never_served(
    mount_factory: MountFactory, gcs_client: storage.Client, bucket_name: str, tmp_path: Path
) -> None:
    data = os.urandom(20 * MiB)
    upload(gcs_client, bucket_name, "f", data)
    first = node(mount_factory, tmp_path, "a")
    assert (first.path / "f").read_bytes() == data
    # (published after the reader has its bytes, off its path: a reader answered as they
    # came can be done before the last block is published)
    wait_until(lambda: len(block_files(tmp_path)) == 3, "the 3 blocks published")
    files = block_files(tmp_path)
    for path in files:  # torn mid-publish (or by the share): truncated, one to nothing
        os.truncate(path, path.stat().st_size // 2)
    os.truncate(files[0], 0)
    second = node(mount_factory, tmp_path, "b")
    assert (second.path / "f").read_bytes() == data
    numbers = stats(second)
    assert numbers["data"]["tiers"]["shared"]["corrupt"] >= 3
    assert numbers["data"]["tiers"]["shared"]["hits"] == 0
    assert all(whole(p) for p in block_files(tmp_path))  # fetched again and republished


def test_two_nodes_evicting_together_keep_the_cap_and_serve_correct_bytes(
    mount_factory: MountFactory, gcs_client: storage.Client, bucket_name: str, tmp_path: Path
) -> None:
    files = {f"d/f{i}": os.urandom(16 * MiB) for i in range(6)}  # 96 MiB through a 48 MiB cap
    for name, data in files.items():
        upload(gcs_client, bucket_name, name, data)
    cap = ["--file-cache-shared-cache-max-size-mb=48"]
    a, b = node(mount_factory, tmp_path, "a", *cap), node(mount_factory, tmp_path, "b", *cap)
    results: dict[str, bool] = {}

    def read_all(mount: Mount, names: list[str]) -> None:
        for name in names:
            results[f"{mount.path.name}:{name}"] = (mount.path / name).read_bytes() == files[name]

    names = list(files)
    threads = [
        threading.Thread(target=read_all, args=(a, names)),
        threading.Thread(target=read_all, args=(b, names[::-1])),
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(180)
    assert len(results) == 12 and all(results.values()), results
    used = sum(p.stat().st_size for p in block_files(tmp_path))
    # Each node scans after writing a sixteenth of the cap: between scans the share may
    # hold that much more per node.
    assert used <= 48 * MiB + 2 * 3 * MiB + 2 * 8 * MiB, used
    assert shared_stats(a)["evictions"] + shared_stats(b)["evictions"] > 0
    assert all(whole(p) for p in block_files(tmp_path))
    for name, data in files.items():  # what they need is still right, wherever it comes from
        assert (a.path / name).read_bytes() == data


def test_a_kill_9_mid_publish_leaves_no_visible_partial_block(
    mount_factory: MountFactory, gcs_client: storage.Client, bucket_name: str, tmp_path: Path
) -> None:
    data = os.urandom(96 * MiB)
    upload(gcs_client, bucket_name, "big", data)
    victim = node(mount_factory, tmp_path, "victim")
    victim.expect_errors = True
    reader = subprocess.Popen(
        ["cat", str(victim.path / "big")], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        deadline = time.monotonic() + 60
        while len(block_files(tmp_path)) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        for pid in victim.pids():  # in the middle of publishing the next blocks
            os.kill(pid, signal.SIGKILL)
    finally:
        reader.wait(60)
    assert all(whole(p) for p in block_files(tmp_path))
    survivor = node(mount_factory, tmp_path, "survivor")
    assert (survivor.path / "big").read_bytes() == data
    assert shared_stats(survivor)["corrupt"] == 0
    assert all(whole(p) for p in block_files(tmp_path))


def test_an_unreachable_shared_directory_is_a_warning_not_a_failure(
    mount_factory: MountFactory, gcs_client: storage.Client, bucket_name: str, tmp_path: Path
) -> None:
    data = os.urandom(10 * MiB)
    upload(gcs_client, bucket_name, "f", data)
    mount = mount_factory(
        f"--cache-dir={tmp_path / 'ssd'}",
        "--enable-experimental-shared-chunk-cache",
        f"--file-cache-shared-cache-dir={tmp_path / 'not-mounted'}",
    )
    assert (mount.path / "f").read_bytes() == data
    numbers = stats(mount)
    assert numbers["data"]["tiers"]["shared"]["unavailable"] == 1
    assert numbers["data"]["tiers"]["ssd"]["bytes_written"] > 0  # the local tiers go on
    log = mount.log.read_text()
    assert log.count("WARNING") >= 1 and "not-mounted" in log
    assert not (tmp_path / "not-mounted").exists()


def test_a_write_back_upload_is_published_for_the_other_nodes(
    mount_factory: MountFactory, bucket_name: str, tmp_path: Path
) -> None:
    data = os.urandom(12 * MiB + 5)
    writer = node(mount_factory, tmp_path, "writer", "--write-back")
    (writer.path / "ckpt").mkdir()
    (writer.path / "ckpt" / "step-1").write_bytes(data)
    subprocess.run(["sync"], check=True)
    result = subprocess.run(
        [TIERFS, "sync", str(writer.path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    deadline = time.monotonic() + 30
    while stats(writer)["data"]["uploads_cached"] < 1 and time.monotonic() < deadline:
        time.sleep(0.05)
    reader = node(mount_factory, tmp_path, "reader")
    assert (reader.path / "ckpt" / "step-1").read_bytes() == data
    assert stats(reader)["gcs"]["media_reads"] == 0
