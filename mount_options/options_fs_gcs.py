"""Options of the table: file system, writes, GCS connection, retries, auth, logging,
metrics.

Part of `mount_options.schema.SCHEMA` (see `mount_options.option` for the shorthands).
"""

from __future__ import annotations

from mount_options import kinds
from mount_options.option import (
    _A,
    _B,
    _D,
    _F,
    _H,
    _HA,
    _I,
    _P,
    _S,
    ACCEPTED,
    Option,
    _opt,
)

ID_MAX = 2**32 - 2  # the largest uid_t / gid_t (2**32 - 1 is (uid_t) -1: "no id")

OPTIONS: tuple[Option, ...] = (
    # -- file-system ------------------------------------------------------------------------
    _opt(
        "file-system:fuse-options",
        kinds.LIST,
        (),
        "Kernel and FUSE mount options (-o ro,allow_other...).",
        flag="o",
    ),
    _opt("file-system:file-mode", kinds.OCTAL, 0o644, "Permission bits of every file."),
    _opt("file-system:dir-mode", kinds.OCTAL, 0o755, "Permission bits of every directory."),
    _opt(
        "file-system:uid",
        _I,
        -1,
        "Owner of every inode; -1 = the mounting user.",
        minimum=-1,
        maximum=ID_MAX,
    ),
    _opt(
        "file-system:gid",
        _I,
        -1,
        "Group of every inode; -1 = the mounting group.",
        minimum=-1,
        maximum=ID_MAX,
    ),
    _opt(
        "file-system:rename-dir-limit",
        _I,
        0,
        "Most objects a directory rename may copy on a flat bucket (EMFILE beyond).",
        minimum=0,
    ),
    _opt(
        "file-system:kernel-list-cache-ttl-secs",
        _I,
        0,
        "How long the kernel keeps directory listings (own changes drop them); -1 forever, 0 off.",
        minimum=-1,
    ),
    _opt(
        "file-system:ignore-interrupts",
        _B,
        True,
        "A signal to the caller does not cancel its request; false: it cancels lookups, "
        "stats, listings and reads (EINTR). A killed caller is let go either way.",
    ),
    _opt(
        "file-system:disable-parallel-dirops",
        _B,
        False,
        "Serialize lookups and readdirs.",
        hidden=True,
        effect=ACCEPTED,
    ),
    _opt(
        "file-system:temp-dir", _P, "", "Where staged writes live (default: the system temp dir)."
    ),
    _opt(
        "file-system:strong-consistency-on-open",
        _B,
        False,
        "Ask GCS on every open, past every cache; an object another client replaced or"
        " deleted since is ESTALE, and the kernel opens what is there now.",
    ),
    _opt(
        "file-system:enable-kernel-reader", _B, False, "Rely on kernel read-ahead for reads.", **_A
    ),
    _opt(
        "file-system:max-read-ahead-kb",
        _I,
        0,
        "Read-ahead set with the kernel reader.",
        minimum=0,
        **_HA,
    ),
    _opt("file-system:max-background", _I, 0, "FUSE max_background.", minimum=0, **_HA),
    _opt("file-system:congestion-threshold", _I, 0, "FUSE congestion_threshold.", minimum=0, **_HA),
    _opt(
        "file-system:fuse-max-request-size-kb", _I, 16384, "Largest FUSE request.", minimum=4, **_HA
    ),
    _opt(
        "file-system:fuse-max-write-size-kb",
        _I,
        1024,
        "FUSE max_write.",
        minimum=4,
        maximum=1024,
        **_HA,
    ),
    _opt(
        "file-system:experimental-enable-dentry-cache",
        _B,
        False,
        "Kernel entry timeout = metadata TTL.",
        hidden=True,
        effect=ACCEPTED,
    ),
    _opt("file-system:experimental-enable-readdirplus", _B, False, "Use READDIRPLUS.", **_HA),
    _opt(
        "file-system:experimental-o-direct",
        _B,
        False,
        "direct_io on every handle: every read and write goes to the daemon, no page cache"
        " (and no passthrough).",
        hidden=True,
    ),
    _opt("file-system:kernel-params-file", _P, "", "GKE kernel-params file.", **_HA),
    # -- write --------------------------------------------------------------------------------
    _opt(
        "write:enable-streaming-writes",
        _B,
        True,
        "Upload new sequentially written files while they are written.",
    ),
    _opt(
        "write:block-size-mb",
        _F,
        32.0,
        "Streaming upload block in MiB (multiple of 0.25).",
        flag="write-block-size-mb",
        hidden=True,
        minimum=0.25,
    ),
    _opt(
        "write:max-blocks-per-file",
        _I,
        1,
        "Divides write:global-max-blocks: files that stream at once = global / this (each "
        "stream sends one block at a time); -1 or 0: global.",
        flag="write-max-blocks-per-file",
        hidden=True,
        minimum=-1,
    ),
    _opt(
        "write:global-max-blocks",
        _I,
        4,
        "Streaming blocks across files; 0 disables streaming, -1 unlimited.",
        flag="write-global-max-blocks",
        minimum=-1,
    ),
    _opt("write:create-empty-file", _B, False, "Create an empty object at create().", hidden=True),
    _opt("write:enable-rapid-appends", _B, True, "Zonal buckets: appendable objects.", **_A),
    _opt("write:enable-rapid-writes", _B, False, "Zonal buckets: rapid writes.", **_HA),
    _opt("write:finalize-file-for-rapid", _B, False, "Zonal buckets: finalize on close.", **_HA),
    _opt(
        "write:write-back",
        _B,
        False,
        "close() returns once data is durable locally; a background uploader then makes it "
        "durable in GCS.",
        tierfs=True,
    ),
    _opt(
        "write:write-back-dir",
        _P,
        "",
        "With write-back: where the journal and the files not yet in GCS live (default: "
        "cache-dir, else temp-dir). A tmpfs makes it a RAM tier; its size bounds what may wait "
        "for GCS, and a write that does not fit fails with ENOSPC, publishing nothing.",
        flag="write-back-dir",
        tierfs=True,
    ),
    _opt(
        "write:write-back-delay-secs",
        _I,
        0,
        "With write-back: wait this long after a close before uploading (a file closed and "
        "written again meanwhile is uploaded once). 'tierfs sync' never waits.",
        tierfs=True,
        minimum=0,
    ),
    _opt(
        "write:passthrough",
        _B,
        True,
        "With write-back: the kernel writes a new file straight into its staged file (FUSE "
        "passthrough: Linux 6.9+, root); false: every write goes through the daemon.",
        flag="write-passthrough",
        tierfs=True,
    ),
    _opt(
        "write:fsync-to-gcs",
        _B,
        False,
        "With write-back: fsync also waits until the file is in GCS. Without it fsync, like "
        "close, returns once data and journal record are durable on the local tier.",
        tierfs=True,
    ),
    # -- gcs-connection -----------------------------------------------------------------------
    _opt("gcs-connection:custom-endpoint", _S, "", "GCS endpoint URL, e.g. http://127.0.0.1:4443."),
    _opt(
        "gcs-connection:client-protocol",
        kinds.enum("http1", "http2", "grpc", "httpmtls"),
        "http1",
        "Protocol to GCS.",
        effect=ACCEPTED,
    ),
    _opt(
        "gcs-connection:max-conns-per-host",
        _I,
        0,
        "GCS requests (hence connections) in flight at once; 0: tierfs's default of 32.",
        minimum=0,
    ),
    _opt(
        "gcs-connection:max-idle-conns-per-host",
        _I,
        100,
        "Idle connections kept per host.",
        minimum=0,
        effect=ACCEPTED,
    ),
    _opt(
        "gcs-connection:sequential-read-size-mb",
        _I,
        200,
        "How far sequential reads prefetch ahead, in MiB, capped at half the RAM tier "
        "(or one block, if larger); each GCS read is one ram-cache:block-size-mb block.",
        minimum=1,
        maximum=1024,
    ),
    _opt(
        "gcs-connection:limit-ops-per-sec",
        _F,
        -1.0,
        "GCS operations per second; -1 unlimited.",
        minimum=-1,
    ),
    _opt(
        "gcs-connection:limit-bytes-per-sec",
        _F,
        -1.0,
        "GCS read bytes per second; -1 unlimited.",
        minimum=-1,
    ),
    _opt("gcs-connection:billing-project", _S, "", "Project billed for requester-pays buckets."),
    _opt(
        "gcs-connection:http-client-timeout",
        _D,
        0.0,
        "Timeout of one HTTP request; 0: tierfs's default, 60 s.",
    ),
    _opt(
        "gcs-connection:experimental-enable-json-read",
        _B,
        False,
        "Deprecated: JSON API reads.",
        deprecated="has no effect",
        **_A,
    ),
    _opt(
        "gcs-connection:grpc-conn-pool-size",
        _I,
        1,
        "Deprecated: gRPC connection pool.",
        flag="experimental-grpc-conn-pool-size",
        deprecated="has no effect",
        minimum=1,
        **_A,
    ),
    # -- gcs-retries --------------------------------------------------------------------------
    _opt(
        "gcs-retries:max-retry-attempts", _I, 0, "Attempts per GCS request; 0 unlimited.", minimum=0
    ),
    _opt("gcs-retries:max-retry-sleep", _D, 30.0, "Longest backoff between retries."),
    _opt(
        "gcs-retries:multiplier",
        _F,
        2.0,
        "Backoff multiplier (>= 1).",
        flag="retry-multiplier",
        minimum=1,
    ),
    _opt(
        "gcs-retries:request-deadline-secs",
        _I,
        120,
        "Give up on a GCS request, its retries included, after this many seconds: the "
        "operation fails with EIO (write-back uploads are tried again later). 0: retry for "
        "ever, as gcsfuse does.",
        tierfs=True,
        minimum=0,
    ),
    _opt(
        "gcs-retries:read-stall:enable",
        _B,
        True,
        "Cut and retry a read that GCS stops answering, after a timeout that follows the "
        "reads seen (see the read-stall options).",
        flag="enable-read-stall-retry",
        hidden=True,
    ),
    _opt(
        "gcs-retries:read-stall:initial-req-timeout",
        _D,
        20.0,
        "Read-stall timeout before any read was seen.",
        flag="read-stall-initial-req-timeout",
        **_H,
    ),
    _opt(
        "gcs-retries:read-stall:min-req-timeout",
        _D,
        1.5,
        "Lowest read-stall timeout.",
        flag="read-stall-min-req-timeout",
        **_H,
    ),
    _opt(
        "gcs-retries:read-stall:max-req-timeout",
        _D,
        1200.0,
        "Highest read-stall timeout.",
        flag="read-stall-max-req-timeout",
        **_H,
    ),
    _opt(
        "gcs-retries:read-stall:req-increase-rate",
        _F,
        15.0,
        "Read-stall timeout growth: each cut read raises it by e^(1/rate).",
        flag="read-stall-req-increase-rate",
        **_H,
    ),
    _opt(
        "gcs-retries:read-stall:req-target-percentile",
        _F,
        0.99,
        "Share of reads the read-stall timeout lets finish; the rest are cut and retried.",
        flag="read-stall-req-target-percentile",
        minimum=0,
        maximum=1,
        **_H,
    ),
    _opt(
        "gcs-retries:chunk-retry-deadline-secs",
        _I,
        120,
        "Give up on an upload request or chunk, its retries included, after this many "
        "seconds; 0: the request deadline.",
        minimum=0,
        hidden=True,
    ),
    _opt(
        "gcs-retries:chunk-transfer-timeout-secs",
        _I,
        10,
        "Cut and retry an upload request that sends or receives nothing for this many "
        "seconds (its answer, this many per 64 MiB of a one-request upload, at most 120 s); "
        "0: the HTTP client timeout (60 s unless http-client-timeout is set).",
        minimum=0,
        hidden=True,
    ),
    _opt(
        "gcs-retries:enable-mount-retries",
        _B,
        False,
        "Retry the mount-time bucket check.",
        hidden=True,
        effect=ACCEPTED,
    ),
    # -- gcs-auth -----------------------------------------------------------------------------
    _opt(
        "gcs-auth:key-file",
        _P,
        "",
        "Service-account JSON key; else Application Default Credentials.",
    ),
    _opt("gcs-auth:token-url", _S, "", "Token endpoint.", **_A),
    _opt("gcs-auth:reuse-token-from-url", _B, True, "Reuse the token from token-url.", **_A),
    _opt(
        "gcs-auth:anonymous-access", _B, False, "Send no credentials (public buckets, emulators)."
    ),
    # -- logging ------------------------------------------------------------------------------
    _opt(
        "logging:severity",
        kinds.enum("trace", "debug", "info", "warning", "error", "off"),
        "info",
        "Least severe message logged.",
        flag="log-severity",
    ),
    _opt(
        "logging:slow-request-secs",
        _I,
        30,
        "Log a WARNING naming a file-system operation and its path when it has waited this "
        "many seconds, and again each time as long; 0: never.",
        tierfs=True,
        minimum=0,
    ),
    _opt(
        "logging:file-path",
        _P,
        "",
        "Log file (default: stderr in the foreground, syslog in the background; a background "
        "daemon with no /dev/log, as in most containers, logs nothing: set this there).",
        flag="log-file",
    ),
    _opt(
        "logging:format", kinds.enum("text", "json"), "json", "Log line format.", flag="log-format"
    ),
    _opt(
        "logging:log-rotate:max-file-size-mb",
        _I,
        512,
        "Rotate the log file at this size in MiB.",
        flag="log-rotate-max-file-size-mb",
        minimum=1,
    ),
    _opt(
        "logging:log-rotate:backup-file-count",
        _I,
        10,
        "Rotated files kept; 0 keeps all.",
        flag="log-rotate-backup-file-count",
        minimum=0,
    ),
    _opt(
        "logging:log-rotate:compress",
        _B,
        True,
        "Compress rotated log files.",
        flag="log-rotate-compress",
    ),
    # -- metrics ------------------------------------------------------------------------------
    _opt(
        "metrics:prometheus-port",
        _I,
        0,
        "Serve Prometheus /metrics on this port; 0 off.",
        minimum=0,
        maximum=65535,
    ),
    _opt(
        "metrics:prometheus-host",
        _S,
        "127.0.0.1",
        "Address the Prometheus endpoint listens on; 0.0.0.0 for every interface.",
        tierfs=True,
    ),
    _opt(
        "metrics:cloud-metrics-export-interval-secs",
        _I,
        0,
        "Cloud Monitoring export interval; 0 off.",
        minimum=0,
        **_A,
    ),
    _opt(
        "metrics:stackdriver-export-interval",
        _D,
        0.0,
        "Deprecated: cloud-metrics-export-interval-secs.",
        deprecated="use metrics:cloud-metrics-export-interval-secs",
        **_A,
    ),
)
