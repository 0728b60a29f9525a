"""Which statistics are counters and which gauges (`tierfs.metrics`): a value that goes
down exported as a counter reads as a reset, and rate() shows a spike."""

from __future__ import annotations

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from tierfs.metrics import StatsCollector

SNAPSHOT = {
    "gcs": {"requests": 5, "in_flight_peak": 2},
    "data": {
        "gcs_blocks": 3,
        "tiers": {
            "ram": {"hits": 1, "used_bytes": 9, "pooled_bytes": 8, "reserved_bytes": 4},
            "ssd": {"hits": 2, "pending_bytes": 7},
        },
    },
    "metadata_cache": {"hits": 4, "entries": 3, "used_bytes": 300, "type_entries": 1},
    "writeback": {"uploaded": 6, "pending": 1, "deleting": 2, "copying": 1, "enabled": True},
    "inodes": 2,
    "open_files": 0,
}


def kinds() -> dict[str, str]:
    found = {}
    for family in StatsCollector(lambda: (SNAPSHOT, {})).collect():
        if isinstance(family, CounterMetricFamily | GaugeMetricFamily):
            found[family.name] = family.type
    return found


def test_values_that_go_down_are_gauges_and_totals_counters() -> None:
    found = kinds()
    for name in (
        "tierfs_tier_used_bytes",
        "tierfs_tier_pooled_bytes",
        "tierfs_tier_reserved_bytes",
        "tierfs_tier_pending_bytes",
        "tierfs_metadata_cache_entries",
        "tierfs_metadata_cache_used_bytes",
        "tierfs_metadata_cache_type_entries",
        "tierfs_writeback_pending",
        "tierfs_writeback_deleting",
        "tierfs_writeback_copying",
        "tierfs_writeback_enabled",
        "tierfs_gcs_in_flight_peak",
        "tierfs_inodes",
    ):
        assert found[name] == "gauge", name
    for name in (
        "tierfs_tier_hits",
        "gcs_request_count",
        "tierfs_metadata_cache_hits",
        "tierfs_writeback_uploaded",
        "tierfs_data_gcs_blocks",
    ):
        assert found[name] == "counter", name
