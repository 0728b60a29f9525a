"""Options of the table: gcsfuse's read tuning, and what tierfs accepts for compatibility
only (no effect).

Part of `mount_options.schema.SCHEMA` (see `mount_options.option` for the shorthands).
"""

from __future__ import annotations

from mount_options import kinds
from mount_options.option import (
    _A,
    _B,
    _D,
    _F,
    _HA,
    _I,
    _P,
    _S,
    ACCEPTED,
    Option,
    _opt,
)

OPTIONS: tuple[Option, ...] = (
    # -- read ---------------------------------------------------------------------------------
    _opt(
        "read:enable-buffered-read",
        _B,
        False,
        "gcsfuse prefetch of sequential reads (tierfs always reads ahead into its RAM tier).",
        effect=ACCEPTED,
    ),
    _opt(
        "read:global-max-blocks",
        _I,
        40,
        "Buffered-read blocks across handles.",
        flag="read-global-max-blocks",
        minimum=-1,
        effect=ACCEPTED,
    ),
    _opt(
        "read:block-size-mb",
        _I,
        16,
        "Buffered-read block in MiB.",
        flag="read-block-size-mb",
        minimum=1,
        hidden=True,
        effect=ACCEPTED,
    ),
    _opt(
        "read:max-blocks-per-handle",
        _I,
        20,
        "Buffered-read blocks per handle.",
        flag="read-max-blocks-per-handle",
        minimum=1,
        hidden=True,
        effect=ACCEPTED,
    ),
    _opt(
        "read:min-blocks-per-handle",
        _I,
        4,
        "Buffered-read minimum blocks per handle.",
        flag="read-min-blocks-per-handle",
        minimum=1,
        hidden=True,
        effect=ACCEPTED,
    ),
    _opt(
        "read:start-blocks-per-handle",
        _I,
        1,
        "Buffered-read blocks at start.",
        flag="read-start-blocks-per-handle",
        minimum=1,
        hidden=True,
        effect=ACCEPTED,
    ),
    _opt(
        "read:random-seek-threshold",
        _I,
        3,
        "Seeks before a handle counts as random.",
        flag="read-random-seek-threshold",
        minimum=0,
        hidden=True,
        effect=ACCEPTED,
    ),
    _opt(
        "read:inactive-stream-timeout",
        _D,
        10.0,
        "Close an idle GCS read stream after this.",
        flag="read-inactive-stream-timeout",
        hidden=True,
        effect=ACCEPTED,
    ),
    # -- accepted for compatibility; no effect in tierfs -----------------------------------
    _opt(
        "file-system:precondition-errors",
        _B,
        True,
        "Removed in gcsfuse: ESTALE on clobber is always on.",
        flag="precondition-errors",
        deprecated="has no effect",
        **_HA,
    ),
    _opt(
        "file-system:unused-mrd-cache-size",
        _I,
        0,
        "gcsfuse multi-range reader cache.",
        flag="unused-mrd-cache-size",
        minimum=0,
        **_HA,
    ),
    _opt(
        "gcs-connection:enable-http-dns-cache",
        _B,
        True,
        "DNS cache for HTTP/1.",
        flag="enable-http-dns-cache",
        **_HA,
    ),
    _opt(
        "gcs-connection:experimental-local-socket-address",
        _S,
        "",
        "Local address to bind to.",
        flag="experimental-local-socket-address",
        **_HA,
    ),
    _opt(
        "mrd:pool-size",
        _I,
        4,
        "gcsfuse multi-range downloader pool.",
        flag="mrd-pool-size",
        minimum=1,
        **_HA,
    ),
    _opt(
        "cloud-profiler:enabled", _B, False, "Cloud Profiler.", flag="enable-cloud-profiler", **_HA
    ),
    _opt("cloud-profiler:cpu", _B, True, "Cloud Profiler CPU.", flag="cloud-profiler-cpu", **_HA),
    _opt(
        "cloud-profiler:heap", _B, True, "Cloud Profiler heap.", flag="cloud-profiler-heap", **_HA
    ),
    _opt(
        "cloud-profiler:allocated-heap",
        _B,
        True,
        "Cloud Profiler allocations.",
        flag="cloud-profiler-allocated-heap",
        **_HA,
    ),
    _opt(
        "cloud-profiler:goroutines",
        _B,
        False,
        "Cloud Profiler goroutines.",
        flag="cloud-profiler-goroutines",
        **_HA,
    ),
    _opt(
        "cloud-profiler:mutex",
        _B,
        False,
        "Cloud Profiler mutex.",
        flag="cloud-profiler-mutex",
        **_HA,
    ),
    _opt(
        "cloud-profiler:label", _S, "", "Cloud Profiler label.", flag="cloud-profiler-label", **_HA
    ),
    _opt(
        "dummy-io:enable", _B, False, "gcsfuse dummy I/O test mode.", flag="enable-dummy-io", **_HA
    ),
    _opt(
        "dummy-io:per-mb-latency",
        _D,
        0.0,
        "Dummy I/O latency per MiB.",
        flag="dummy-io-per-mb-latency",
        **_HA,
    ),
    _opt(
        "dummy-io:reader-latency",
        _D,
        0.0,
        "Dummy I/O reader latency.",
        flag="dummy-io-reader-latency",
        **_HA,
    ),
    _opt(
        "metrics:buffer-size",
        _I,
        256,
        "Queued histogram updates.",
        flag="metrics-buffer-size",
        minimum=1,
        **_HA,
    ),
    _opt(
        "metrics:workers", _I, 3, "Metric update workers.", flag="metrics-workers", minimum=1, **_HA
    ),
    _opt(
        "metrics:use-new-names", _B, False, "New metric names.", flag="metrics-use-new-names", **_HA
    ),
    _opt(
        "metrics:enable-grpc-metrics", _B, False, "gRPC metrics.", flag="enable-grpc-metrics", **_A
    ),
    _opt(
        "monitoring:experimental-tracing-mode",
        _S,
        "",
        "Tracing mode.",
        flag="experimental-tracing-mode",
        **_HA,
    ),
    _opt(
        "monitoring:experimental-tracing-project-id",
        _S,
        "",
        "Tracing project.",
        flag="experimental-tracing-project-id",
        **_HA,
    ),
    _opt(
        "monitoring:experimental-tracing-sampling-ratio",
        _F,
        0.0,
        "Tracing sampling ratio.",
        flag="experimental-tracing-sampling-ratio",
        minimum=0,
        maximum=1,
        **_HA,
    ),
    _opt("trace:exporters", kinds.LIST, (), "Trace exporters.", flag="trace-exporters", **_HA),
    _opt("trace:project-id", _S, "", "Trace project.", flag="trace-project-id", **_HA),
    _opt(
        "trace:sampling-ratio",
        _F,
        0.0,
        "Trace sampling ratio.",
        flag="trace-sampling-ratio",
        minimum=0,
        maximum=1,
        **_HA,
    ),
    _opt(
        "workload-insight:visualize",
        _B,
        False,
        "Workload visualization.",
        flag="visualize-workload-insight",
        **_HA,
    ),
    _opt(
        "workload-insight:output-file",
        _P,
        "",
        "Workload insight output.",
        flag="workload-insight-output-file",
        **_HA,
    ),
    _opt(
        "workload-insight:forward-merge-threshold-mb",
        _I,
        0,
        "Workload insight merge threshold.",
        flag="workload-insight-forward-merge-threshold-mb",
        minimum=0,
        **_HA,
    ),
    # -- list ---------------------------------------------------------------------------------
    _opt("list:enable-empty-managed-folders", _B, False, "List empty managed folders.", **_HA),
)
