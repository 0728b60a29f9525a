"""Options that change how tierfs talks to GCS, through real mounts on the emulator:
``max-conns-per-host`` caps requests in flight, ``limit-ops-per-sec`` makes requests
wait their turn, ``limit-bytes-per-sec`` makes reads wait, ``type-cache-max-size-mb``
bounds the directories kept, ``log-rotate:compress`` gzips a rotated log, and an option
accepted without effect is named in one WARNING."""

from __future__ import annotations

import gzip
import os
import socket
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import requests
from google.cloud import storage
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import MountFactory
from tests.faults import MEDIA, Action, FaultProxy, Rule
from tests.mounting import stats

pytestmark = pytest.mark.mount

FILES = 16


def many_files(gcs_client: storage.Client, bucket_name: str) -> list[str]:
    bucket = gcs_client.bucket(bucket_name)
    names = [f"f{i:02d}" for i in range(FILES)]
    for name in names:
        bucket.blob(name).upload_from_string(os.urandom(256 << 10))
    return names


def read_all_at_once(root: Path, names: list[str]) -> None:
    with ThreadPoolExecutor(FILES) as pool:
        sizes = list(pool.map(lambda n: len((root / n).read_bytes()), names))
    assert sizes == [256 << 10] * FILES


@pytest.mark.parametrize(("cap", "most"), [(2, 2), (0, None)])
def test_max_conns_per_host_caps_requests_in_flight(
    mount_factory: MountFactory,
    fault_proxy: FaultProxy,
    gcs_client: storage.Client,
    bucket_name: str,
    cap: int,
    most: int | None,
) -> None:
    """Every media read is held 0.5 s by the proxy, so 16 readers' requests overlap for
    certain: the cap shows as a peak at most the cap, no cap as a peak above it."""
    names = many_files(gcs_client, bucket_name)
    fault_proxy.faults.add(Rule(Action(stall_s=0.5), target=MEDIA))
    mount = mount_factory(fault_proxy.option, f"--max-conns-per-host={cap}")
    read_all_at_once(mount.path, names)
    peak = stats(mount)["gcs"]["in_flight_peak"]
    print(f"cap {cap}: peak {peak}")
    if most is not None:
        assert 1 <= peak <= most, peak
    else:
        assert peak > 2, peak  # without the cap, 16 readers do run side by side


def test_limit_ops_per_sec_makes_requests_wait(
    mount_factory: MountFactory, gcs_client: storage.Client, bucket_name: str
) -> None:
    names = many_files(gcs_client, bucket_name)
    mount = mount_factory("--limit-ops-per-sec=20", "--stat-cache-ttl=0s", "--type-cache-ttl=0s")
    for name in names * 2:
        assert (mount.path / name).stat().st_size == 256 << 10
    gcs = stats(mount)["gcs"]
    assert gcs["throttled"] > 0 and gcs["throttled_ms"] > 0, gcs


def test_an_option_without_effect_is_named_in_one_warning(mount_factory: MountFactory) -> None:
    mount = mount_factory("--experimental-enable-dentry-cache", "--client-protocol=http2")
    warnings = [
        line for line in mount.log.read_text().splitlines() if "accepted without effect" in line
    ]
    assert len(warnings) == 1, warnings
    assert "gcs-connection:client-protocol" in warnings[0]
    assert "file-system:experimental-enable-dentry-cache" in warnings[0]


@pytest.mark.parametrize("asked", [True, False])
def test_strong_consistency_on_open_opens_what_gcs_has_now(
    mount_factory: MountFactory, gcs_client: storage.Client, bucket_name: str, asked: bool
) -> None:
    """``--strong-consistency-on-open`` (gcsfuse's): each open asks GCS, past the metadata
    cache (60 s at the defaults), so a file another client replaced opens with its new
    bytes at once, and one it deleted is gone. Without it the mount keeps what it knew for
    the TTL, as gcsfuse does. (It was accepted without effect.)"""
    blob = gcs_client.bucket(bucket_name).blob("weights.bin")
    blob.upload_from_string(b"first version")
    mount = mount_factory(*(["--strong-consistency-on-open"] if asked else []))
    path = mount.path / "weights.bin"
    assert path.read_bytes() == b"first version"
    blob.upload_from_string(b"the second version, longer")
    with open(path, "rb") as handle:
        got = handle.read()
    assert got == (b"the second version, longer" if asked else b"first version")
    if asked:
        blob.delete()
        with pytest.raises(FileNotFoundError):
            open(path, "rb").close()


@pytest.mark.parametrize("asked", [True, False])
def test_experimental_o_direct_sends_every_read_to_the_daemon(
    mount_factory: MountFactory, gcs_client: storage.Client, bucket_name: str, asked: bool
) -> None:
    """``--experimental-o-direct`` (gcsfuse's): direct_io on every handle, so a file read
    twice is read from the daemon twice; without it the page cache answers the second
    read. (It was accepted without effect.)"""
    data = os.urandom(3 << 20)
    gcs_client.bucket(bucket_name).blob("shard").upload_from_string(data)
    mount = mount_factory(*(["--experimental-o-direct"] if asked else []))
    assert (mount.path / "shard").read_bytes() == data
    first = stats(mount)["requests"]["operations"]["read"]["count"]
    assert (mount.path / "shard").read_bytes() == data
    again = stats(mount)["requests"]["operations"]["read"]["count"] - first
    assert again >= 3 if asked else again == 0


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def scrape(port: int) -> dict[str, float]:
    """``name{labels}`` -> value of every sample on the endpoint."""
    text = requests.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
    samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = ",".join(f'{k}="{v}"' for k, v in sorted(sample.labels.items()))
            samples[f"{sample.name}{{{labels}}}" if labels else sample.name] = sample.value
    return samples


def test_prometheus_port_serves_the_counters_and_they_move(
    mount_factory: MountFactory, gcs_client: storage.Client, bucket_name: str
) -> None:
    port = free_port()
    mount = mount_factory(f"--prometheus-port={port}")
    before = scrape(port)
    (mount.path / "saved").write_bytes(os.urandom(3 << 20))
    gcs_client.bucket(bucket_name).blob("remote").upload_from_string(os.urandom(2 << 20))
    assert len((mount.path / "remote").read_bytes()) == 2 << 20
    after = scrape(port)
    assert after['fs_ops_count_total{fs_op="write"}'] > before.get(
        'fs_ops_count_total{fs_op="write"}', 0
    )
    assert after['fs_ops_latency_count{fs_op="read"}'] >= 1
    assert (
        after['fs_ops_latency_bucket{fs_op="read",le="+Inf"}']
        == after['fs_ops_latency_count{fs_op="read"}']
    )
    assert after["gcs_read_bytes_count_total"] - before["gcs_read_bytes_count_total"] >= 2 << 20
    assert after["tierfs_gcs_bytes_written_total"] >= 3 << 20
    assert after['tierfs_tier_bytes_written_total{tier="ram"}'] >= 2 << 20  # the read filled it
    assert after["tierfs_data_gcs_blocks_total"] >= 1  # `tierfs stats`'s data counters
    assert after["gcs_request_count_total"] > before["gcs_request_count_total"]
    # The daemon's own: prometheus-client's process and collector families, and the pauses
    # of Python's collector (`tierfs.fuse.collector`), the startup objects kept out of them.
    assert after["process_resident_memory_bytes"] > 10 << 20
    assert after['python_gc_collections_total{generation="0"}'] >= 1
    assert after["tierfs_python_gc_frozen_objects"] > 10_000
    assert after["tierfs_python_gc_paused_s_total"] > 0


def test_limit_bytes_per_sec_makes_reads_wait(
    mount_factory: MountFactory, gcs_client: storage.Client, bucket_name: str
) -> None:
    """Three 512 KiB files under a 512 KiB/s limit (a burst of one second's worth): the
    first read spends the burst, the next ones wait for their tokens, counted as
    throttled; the bytes are whole."""
    files = {f"part{i}": os.urandom(512 << 10) for i in range(3)}
    for name, data in files.items():
        gcs_client.bucket(bucket_name).blob(name).upload_from_string(data)
    mount = mount_factory(f"--limit-bytes-per-sec={512 << 10}")
    for name, data in files.items():
        assert (mount.path / name).read_bytes() == data
    gcs = stats(mount)["gcs"]
    assert gcs["media_reads"] == 3 and gcs["throttled"] >= 1 and gcs["throttled_ms"] > 0, gcs


@pytest.mark.parametrize(("type_cache_mb", "asks_again"), [(0, True), (None, False)])
def test_type_cache_max_size_mb_bounds_the_directories_kept(
    mount_factory: MountFactory,
    gcs_client: storage.Client,
    bucket_name: str,
    type_cache_mb: int | None,
    asks_again: bool,
) -> None:
    """Directories are kept in the type cache: with it at 0 MiB every lookup of a
    directory asks GCS again; at the default (4 MiB) the second and third do not. (The
    kernel's own entries are dropped between lookups, so each reaches tierfs.)"""
    gcs_client.bucket(bucket_name).blob("d/").upload_from_string(b"")
    args = [] if type_cache_mb is None else [f"--type-cache-max-size-mb={type_cache_mb}"]
    mount = mount_factory(*args, "--metadata-cache-negative-ttl-secs=0")
    assert (mount.path / "d").is_dir()
    before = stats(mount)["gcs"]["requests"]
    for _ in range(2):
        Path("/proc/sys/vm/drop_caches").write_text("2")  # the kernel forgets "d"
        assert (mount.path / "d").is_dir()
    asked = stats(mount)["gcs"]["requests"] - before
    assert (asked > 0) == asks_again, asked
    entries = stats(mount)["metadata_cache"]["type_entries"]
    assert (entries == 0) == asks_again, entries


@pytest.mark.parametrize("compress", [True, False])
def test_log_rotate_compress_gzips_the_rotated_file(
    mount_factory: MountFactory, tmp_path: Path, compress: bool
) -> None:
    """The daemon's log file is already at the size limit (1 MiB): its first line
    rotates it to ``LOG.1.gz`` (gzipped, the default) or ``LOG.1``, the old lines kept."""
    log = tmp_path / "mnt.log"
    old = "an earlier daemon's line\n" * ((1 << 20) // 25 + 1)
    log.write_text(old)
    mount_factory("--log-rotate-max-file-size-mb=1", f"--log-rotate-compress={compress}")
    rotated = tmp_path / ("mnt.log.1.gz" if compress else "mnt.log.1")
    assert rotated.exists(), sorted(p.name for p in tmp_path.iterdir())
    raw = rotated.read_bytes()
    assert (gzip.decompress(raw) if compress else raw).decode() == old
    assert "mounted gs://" in log.read_text()
