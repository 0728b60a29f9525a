"""``--metrics-address``: every volume's Prometheus metrics on one endpoint of the plugin.

Each volume's daemon serves its own metrics (`tierfs.metrics`) on a loopback port
the plugin picked for it; nothing outside the node's network namespace can reach
those. A scrape of the plugin's endpoint fetches each of them, parses it with
prometheus-client's own parser, adds ``volume_id`` and ``target`` labels and
answers the union, one family per name (so a gcsfuse dashboard's queries work
with ``sum by (volume_id)``). The plugin's own gauges come with it: volumes
published and daemon restarts per volume.

A daemon that does not answer (restarting, unmounting) is left out of that
scrape, logged at debug: a scrape never fails because one volume is down.
"""

from __future__ import annotations

import logging
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Protocol

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector
from prometheus_client.samples import Sample

log = logging.getLogger("tierfs.csi.metrics")
SCRAPE_TIMEOUT_S = 5.0


@dataclass(frozen=True)
class VolumeView:
    volume_id: str
    target: str
    metrics_port: int  # 0: this volume serves none (disableMetrics)
    restarts: int


class Volumes(Protocol):
    def metrics_volumes(self) -> list[VolumeView]: ...


def scrape(port: int) -> str:
    url = f"http://127.0.0.1:{port}/metrics"
    with urllib.request.urlopen(url, timeout=SCRAPE_TIMEOUT_S) as answer:
        return str(answer.read().decode("utf-8"))


class VolumesCollector(Collector):
    def __init__(self, volumes: Volumes) -> None:
        self._volumes = volumes

    def collect(self) -> Iterator[Metric]:
        volumes = self._volumes.metrics_volumes()
        published = GaugeMetricFamily(
            "tierfs_csi_volumes", "volumes published on this node", value=len(volumes)
        )
        restarts = CounterMetricFamily(
            "tierfs_csi_daemon_restarts",
            "times the plugin restarted a volume's daemon after it died",
            labels=["volume_id", "target"],
        )
        merged: dict[str, Metric] = {}
        for volume in volumes:
            restarts.add_metric([volume.volume_id, volume.target], volume.restarts)
            if not volume.metrics_port:
                continue
            try:
                text = scrape(volume.metrics_port)
            except OSError as err:
                log.debug("no metrics from volume %s: %s", volume.volume_id, err)
                continue
            extra = {"volume_id": volume.volume_id, "target": volume.target}
            for family in text_string_to_metric_families(text):
                into = merged.setdefault(
                    family.name, Metric(family.name, family.documentation, family.type)
                )
                into.samples.extend(
                    Sample(s.name, {**s.labels, **extra}, s.value, s.timestamp, s.exemplar)
                    for s in family.samples
                )
        yield published
        yield restarts
        yield from merged.values()


class Exporter:
    """The plugin's metrics endpoint (prometheus-client's server thread)."""

    def __init__(self, address: str, volumes: Volumes) -> None:
        host, port = parse_address(address)
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(VolumesCollector(volumes))
        self._server, self._thread = start_http_server(port, host, registry=self.registry)
        self.port = self._server.server_port
        log.info("Prometheus metrics of every volume on http://%s:%d/metrics", host, self.port)

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)


def serve_metrics(address: str, volumes: Volumes) -> Exporter:
    return Exporter(address, volumes)


def parse_address(text: str) -> tuple[str, int]:
    """``HOST:PORT`` or ``:PORT`` (every interface); ValueError with one line otherwise."""
    host, colon, port = text.rpartition(":")
    if not colon or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"expected HOST:PORT, not '{text}'")
    return host.strip("[]") or "0.0.0.0", int(port)
