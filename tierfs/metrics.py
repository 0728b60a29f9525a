"""``metrics:prometheus-port``: what `tierfs stats` shows, as a Prometheus endpoint.

Nothing is counted twice: the file system already keeps its counters (GCS requests
and bytes, per-tier hits and bytes, metadata cache, write-back, and per-operation
counts and latencies in `tierfs.fuse.watchdog.InFlight`). A scrape asks the trio thread for
one snapshot of them (``trio.from_thread``, so no counter is read while it changes)
and renders it; the core never imports prometheus-client.

Names follow gcsfuse's where one maps (``fs_ops_count``, ``fs_ops_error_count``,
``fs_ops_latency`` in microseconds, ``gcs_request_count``, ``gcs_read_bytes_count``,
``file_cache_read_count``, ``file_cache_read_bytes_count``), so a gcsfuse dashboard
finds them; the rest are ``tierfs_*``, labelled by tier where they are per tier.

The server is prometheus-client's own (a thread), bound to
``metrics:prometheus-host`` (127.0.0.1 unless set: a pod that is scraped from
outside sets 0.0.0.0), and shut down with the mount.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Iterator
from typing import Any

import trio
from prometheus_client import CollectorRegistry, GCCollector, ProcessCollector, start_http_server
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from tierfs.fuse.watchdog import LATENCY_BOUNDS_S, OpLatency

log = logging.getLogger("tierfs.metrics")

# Counters of `GcsBucket.statistics` (the rest are gauges), and gcsfuse's name for some.
GAUGES = {"in_flight_peak"}
GCSFUSE_NAMES = {"requests": "gcs_request_count", "bytes_read": "gcs_read_bytes_count"}
# Values that go down are gauges: exported as counters, each fall read as a reset and
# rate() showed a spike (pooled, reserved and pending bytes; the metadata cache's size;
# the write-back files copying or deleting now).
TIER_GAUGES = {
    "used_bytes",
    "capacity_bytes",
    "entries",
    "files",
    "known_blocks",
    "unavailable",
    "pooled_bytes",
    "reserved_bytes",
    "reserved_peak_bytes",
    "pending_bytes",
}
METADATA_GAUGES = {"entries", "used_bytes", "type_entries", "type_used_bytes"}
WRITEBACK_GAUGES = {"enabled", "pending", "failing", "moving", "deleting", "copying"}

Snapshot = tuple[dict[str, Any], dict[str, OpLatency]]


def _number(value: Any) -> float | None:
    if isinstance(value, bool):
        return float(value)
    if isinstance(value, int | float) and math.isfinite(value):
        return float(value)
    return None


class StatsCollector(Collector):
    """Turns one snapshot of the mount's statistics into metric families."""

    def __init__(self, snapshot: Callable[[], Snapshot]) -> None:
        self._snapshot = snapshot

    def collect(self) -> Iterator[Metric]:
        try:
            stats, ops = self._snapshot()
        except Exception as err:  # the mount is going away: an empty scrape, not a 500
            log.debug("metrics snapshot failed: %s", err)
            return
        yield from _operations(ops)
        yield from _gcs(stats.get("gcs", {}))
        yield from _tiers(stats.get("data", {}).get("tiers", {}))
        yield from _flat("tierfs_data", stats.get("data", {}), set())  # (fills, read-ahead)
        yield from _flat("tierfs_metadata_cache", stats.get("metadata_cache", {}), METADATA_GAUGES)
        yield from _flat("tierfs_writeback", stats.get("writeback", {}), WRITEBACK_GAUGES)
        yield from _flat(
            "tierfs_python_gc", stats.get("python_gc", {}), {"longest_pause_s", "frozen_objects"}
        )
        for key in ("inodes", "open_files"):
            yield GaugeMetricFamily(f"tierfs_{key}", f"tierfs {key}", value=stats.get(key, 0))


def _operations(ops: dict[str, OpLatency]) -> Iterator[Metric]:
    count = CounterMetricFamily("fs_ops_count", "FUSE operations served", labels=["fs_op"])
    errors = CounterMetricFamily("fs_ops_error_count", "FUSE operations failed", labels=["fs_op"])
    latency = HistogramMetricFamily(
        "fs_ops_latency", "FUSE operation latency in microseconds", labels=["fs_op"]
    )
    for op, seen in sorted(ops.items()):
        count.add_metric([op], seen.count)
        errors.add_metric([op], seen.errors)
        running, buckets = 0, []
        for bound, number in zip(LATENCY_BOUNDS_S, seen.buckets, strict=True):
            running += number
            buckets.append(("+Inf" if math.isinf(bound) else f"{bound * 1e6:g}", running))
        latency.add_metric([op], buckets, seen.total_s * 1e6)
    yield from (count, errors, latency)


def _gcs(gcs: dict[str, Any]) -> Iterator[Metric]:
    for key, value in sorted(gcs.items()):
        number = _number(value)
        if number is None:
            continue
        if key in GAUGES:
            yield GaugeMetricFamily(f"tierfs_gcs_{key}", f"GCS {key}", value=number)
        else:
            name = GCSFUSE_NAMES.get(key, f"tierfs_gcs_{key}")
            yield CounterMetricFamily(name, f"GCS {key}", value=number)


def _tiers(tiers: dict[str, dict[str, Any]]) -> Iterator[Metric]:
    families: dict[str, CounterMetricFamily | GaugeMetricFamily] = {}
    for tier, values in sorted(tiers.items()):
        for key, value in sorted(values.items()):
            number = _number(value)
            if number is None:
                continue
            family = families.get(key)
            if family is None:
                kind = GaugeMetricFamily if key in TIER_GAUGES else CounterMetricFamily
                family = families[key] = kind(
                    f"tierfs_tier_{key}", f"per-tier {key}", labels=["tier"]
                )
            family.add_metric([tier], number)
    yield from families.values()
    ssd = tiers.get("ssd")
    if ssd is not None:  # gcsfuse's file cache is tierfs's SSD tier
        reads = CounterMetricFamily(
            "file_cache_read_count", "file cache reads", labels=["cache_hit"]
        )
        reads.add_metric(["true"], ssd.get("hits", 0))
        reads.add_metric(["false"], ssd.get("misses", 0))
        yield reads
        yield CounterMetricFamily(
            "file_cache_read_bytes_count", "bytes read from the file cache",
            value=ssd.get("bytes_read", 0),
        )  # fmt: skip


def _flat(prefix: str, values: dict[str, Any], gauges: set[str]) -> Iterator[Metric]:
    for key, value in sorted(values.items()):
        number = _number(value)
        if number is None:
            continue
        kind = GaugeMetricFamily if key in gauges else CounterMetricFamily
        yield kind(f"{prefix}_{key}", f"{prefix} {key}", value=number)


class MetricsServer:
    """The endpoint of one mount: started in the trio thread, closed at unmount."""

    def __init__(self, port: int, host: str, snapshot: Callable[[], Snapshot]) -> None:
        token = trio.lowlevel.current_trio_token()
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(
            StatsCollector(lambda: trio.from_thread.run_sync(snapshot, trio_token=token))
        )
        # prometheus-client's own: the daemon's memory and CPU (process_*), and Python's
        # collections by generation (python_gc_*), under the names dashboards know.
        ProcessCollector(registry=self.registry)
        GCCollector(registry=self.registry)
        self._server, self._thread = start_http_server(port, host, registry=self.registry)
        self.port = self._server.server_port
        log.info("Prometheus metrics on http://%s:%d/metrics", host, self.port)

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)
