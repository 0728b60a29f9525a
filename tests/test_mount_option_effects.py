"""Options that change how tierfs talks to GCS, through real mounts on the emulator:
``max-conns-per-host`` caps requests in flight, ``limit-ops-per-sec`` makes requests
wait their turn, an option accepted without effect is named in one WARNING."""

from __future__ import annotations

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
    assert after["gcs_request_count_total"] > before["gcs_request_count_total"]
