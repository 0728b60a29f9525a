"""``tierfs csi --metrics-address``: every volume's Prometheus metrics on the plugin's one
endpoint, labelled with its volume id (a volume with ``disableMetrics`` serves none)."""

from __future__ import annotations

import socket
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.csi_plugin import running_plugin
from tierfs.cli.emulator import Emulator

pytestmark = pytest.mark.mount


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_volumes_metrics_on_the_plugin_endpoint(
    emulator: Emulator, bucket_name: str, tmp_path: Path
) -> None:
    port = free_port()
    with running_plugin(emulator, tmp_path, f"--metrics-address=127.0.0.1:{port}") as plugin:
        first, second = plugin.target(volume="a"), plugin.target(volume="b")
        plugin.publish("vol-a", first, [], attributes={"bucketName": bucket_name})
        plugin.publish(
            "vol-b", second, [], attributes={"bucketName": bucket_name, "disableMetrics": "true"}
        )
        (first / "counted.txt").write_bytes(b"1")
        assert (first / "counted.txt").read_bytes() == b"1"

        url = f"http://127.0.0.1:{port}/metrics"
        with urllib.request.urlopen(url, timeout=30) as answer:
            text = answer.read().decode()
        families = {f.name: f for f in text_string_to_metric_families(text)}
        assert families["tierfs_csi_volumes"].samples[0].value == 2
        restarts = {
            s.labels["volume_id"]: s.value for s in families["tierfs_csi_daemon_restarts"].samples
        }
        assert restarts == {"vol-a": 0, "vol-b": 0}
        ops = [s for s in families["fs_ops_count"].samples if s.value > 0]
        assert ops and {s.labels["volume_id"] for s in ops} == {"vol-a"}
        assert {s.labels["target"] for s in ops} == {str(first)}
        plugin.unpublish("vol-a", first)
        plugin.unpublish("vol-b", second)
