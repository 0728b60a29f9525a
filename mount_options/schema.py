"""The one table of options.

Every option tierfs understands is declared here exactly once: its colon path
(the YAML config key and the CSI colon form, ``metadata-cache:ttl-secs``), its
command-line flag (``metadata-cache-ttl-secs``), its kind, default, limits and
help. The CLI, ``-o``/fstab, CSI and config-file parsers, the help text and
the generated docs table all read this table, so they cannot disagree.

gcsfuse's names, defaults and meanings are kept as gcsfuse defines them, so a
gcsfuse option line means the same here. tierfs's own options carry
``tierfs=True`` and live under their own keys (``ram-cache:*``,
``write:write-back``, ``read-ahead-kb``, ``file-cache:passthrough``).

Options that gcsfuse accepts but that have no effect in tierfs (gRPC tuning,
Cloud Profiler, zonal buckets...) are still declared, so that a pasted gcsfuse
line never fails; ``effect`` says what tierfs does with them.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from mount_options import kinds
from mount_options.kinds import Kind

# What tierfs does with an option that gcsfuse has.
USED = "used"  # tierfs implements it
ACCEPTED = "accepted"  # parsed and validated; no effect in tierfs (yet)


@dataclass(frozen=True)
class Option:
    """One option: its names, its type and what it means."""

    path: str
    kind: Kind
    default: Any
    help: str
    flag: str = ""
    hidden: bool = False
    deprecated: str = ""
    in_config: bool = True
    tierfs: bool = False
    effect: str = USED
    minimum: float | None = None
    maximum: float | None = None

    @property
    def section(self) -> str:
        return self.path.split(":", 1)[0] if ":" in self.path else ""

    @property
    def attr(self) -> str:
        """The snake_case field name inside its section (``ttl_secs``)."""
        key = self.path.split(":", 1)[1] if ":" in self.path else self.path
        return key.replace(":", "_").replace("-", "_")


def _opt(
    path: str,
    kind: Kind,
    default: Any,
    help: str,
    *,
    flag: str | None = None,
    **extra: Any,
) -> Option:
    key = path.split(":", 1)[1] if ":" in path else path
    return Option(path, kind, default, help, flag=flag or key.replace(":", "-"), **extra)


_H: dict[str, Any] = {"hidden": True}
_A: dict[str, Any] = {"effect": ACCEPTED}
_HA: dict[str, Any] = {"hidden": True, "effect": ACCEPTED}
_B, _I, _F, _S, _P, _D = (
    kinds.BOOL,
    kinds.INT,
    kinds.FLOAT,
    kinds.STRING,
    kinds.PATH,
    kinds.DURATION,
)
_ANY_SIZE: dict[str, Any] = {"minimum": -1}

SCHEMA: tuple[Option, ...] = (
    # -- top level -------------------------------------------------------------------------
    _opt(
        "config-file", _P, "", "YAML file with options; unknown keys are rejected.", in_config=False
    ),
    _opt(
        "implicit-dirs",
        _B,
        False,
        "Infer directories from object names (an extra list per lookup).",
    ),
    _opt(
        "only-dir", _S, "", "Mount only this prefix of the bucket (a/b, no leading or trailing /)."
    ),
    _opt(
        "cache-dir",
        _P,
        "",
        "Directory of the SSD file cache; with file-cache:max-size-mb != 0 it turns the cache on.",
    ),
    _opt(
        "foreground",
        _B,
        False,
        "Stay attached to the terminal instead of running in the background.",
    ),
    _opt("app-name", _S, "", "Appended to the user agent of GCS requests."),
    _opt(
        "profile",
        kinds.enum("", "aiml-training", "aiml-serving", "aiml-checkpointing"),
        "",
        "Preset defaults for a workload; applies only to options left unset.",
    ),
    _opt("machine-type", _S, "", "Machine type used to pick optimized defaults.", **_H),
    _opt("disable-autoconfig", _B, False, "Turn off machine-type optimizations.", **_H),
    _opt("enable-hns", _B, True, "Use folder APIs on hierarchical-namespace buckets.", **_HA),
    _opt(
        "enable-atomic-rename-object",
        _B,
        True,
        "Rename files with one atomic move where GCS can.",
        **_H,
        effect=ACCEPTED,
    ),
    _opt(
        "enable-standard-symlinks",
        _B,
        True,
        "Write symlinks in the new object format (target as content).",
        **_H,
    ),
    _opt(
        "enable-type-cache-deprecation",
        _B,
        True,
        "Ignore the type-cache options (as gcsfuse v3).",
        **_HA,
    ),
    _opt(
        "enable-unsupported-path-support",
        _B,
        True,
        "Hide objects whose names contain //, /./ or /../ from listings.",
        **_H,
        effect=ACCEPTED,
    ),
    _opt("enable-new-reader", _B, True, "gcsfuse's reader implementation switch.", **_HA),
    _opt("enable-google-lib-auth", _B, True, "gcsfuse's auth library switch.", **_HA),
    _opt("mount-id", _S, "", "Identifier of this mount in logs.", **_HA),
    _opt(
        "read-ahead-kb",
        _I,
        1024,
        "Kernel read-ahead of the mount (read_ahead_kb), for 1 MiB reads; 0 keeps the kernel's.",
        tierfs=True,
        minimum=0,
        maximum=1 << 20,
    ),
    # -- deprecated top-level flags that gcsfuse accepts and ignores -----------------------
    _opt(
        "debug_fs",
        _B,
        False,
        "Deprecated; ignored.",
        in_config=False,
        deprecated="has no effect",
        **_HA,
    ),
    _opt(
        "debug_fuse_errors",
        _B,
        True,
        "Deprecated; ignored.",
        in_config=False,
        deprecated="has no effect",
        **_HA,
    ),
    _opt(
        "debug_http",
        _B,
        False,
        "Deprecated; ignored.",
        in_config=False,
        deprecated="has no effect",
        **_HA,
    ),
    _opt(
        "max-retry-duration",
        _D,
        0.0,
        "Deprecated; ignored.",
        in_config=False,
        deprecated="has no effect",
        **_HA,
    ),
    # -- debug --------------------------------------------------------------------------------
    _opt(
        "debug:fuse",
        _B,
        False,
        "Deprecated: sets logging:severity to trace.",
        flag="debug_fuse",
        deprecated="use logging:severity:trace",
    ),
    _opt(
        "debug:gcs",
        _B,
        False,
        "Deprecated: sets logging:severity to trace.",
        flag="debug_gcs",
        deprecated="use logging:severity:trace",
    ),
    _opt(
        "debug:log-mutex",
        _B,
        False,
        "Log long-held locks (sets logging:severity to trace).",
        flag="debug_mutex",
        **_A,
    ),
    _opt(
        "debug:exit-on-invariant-violation",
        _B,
        False,
        "Exit when an internal invariant breaks.",
        flag="debug_invariants",
        effect=ACCEPTED,
    ),
    # -- metadata-cache -------------------------------------------------------------------
    _opt(
        "metadata-cache:ttl-secs",
        _I,
        60,
        "TTL of cached metadata and kernel attributes; -1 never expires, 0 disables.",
        flag="metadata-cache-ttl-secs",
        minimum=-1,
    ),
    _opt(
        "metadata-cache:negative-ttl-secs",
        _I,
        5,
        "TTL of cached 'not found'; -1 never expires, 0 disables.",
        flag="metadata-cache-negative-ttl-secs",
        minimum=-1,
    ),
    _opt(
        "metadata-cache:stat-cache-max-size-mb",
        _I,
        34,
        "Size of the stat cache in MiB; -1 unlimited, 0 disables.",
        **_ANY_SIZE,
    ),
    _opt(
        "metadata-cache:type-cache-max-size-mb",
        _I,
        4,
        "Size of the per-directory type cache in MiB; -1 unlimited.",
        **_ANY_SIZE,
    ),
    _opt(
        "metadata-cache:enable-nonexistent-type-cache",
        _B,
        False,
        "Deprecated: use metadata-cache:negative-ttl-secs.",
        deprecated="use metadata-cache:negative-ttl-secs",
        **_A,
    ),
    _opt(
        "metadata-cache:deprecated-stat-cache-ttl",
        _D,
        60.0,
        "Deprecated: stat TTL, used only when ttl-secs is unset.",
        flag="stat-cache-ttl",
        deprecated="use metadata-cache:ttl-secs",
    ),
    _opt(
        "metadata-cache:deprecated-type-cache-ttl",
        _D,
        60.0,
        "Deprecated: type TTL, used only when ttl-secs is unset.",
        flag="type-cache-ttl",
        deprecated="use metadata-cache:ttl-secs",
    ),
    _opt(
        "metadata-cache:deprecated-stat-cache-capacity",
        _I,
        20460,
        "Deprecated: stat cache entries, used only when stat-cache-max-size-mb is unset.",
        flag="stat-cache-capacity",
        deprecated="use metadata-cache:stat-cache-max-size-mb",
        minimum=0,
    ),
    _opt(
        "metadata-cache:enable-metadata-prefetch",
        _B,
        True,
        "List a directory in the background on first open to fill the stat cache.",
    ),
    _opt(
        "metadata-cache:metadata-prefetch-entries-limit",
        _I,
        5000,
        "Most entries one prefetch lists; -1 unlimited.",
        minimum=-1,
    ),
    _opt(
        "metadata-cache:metadata-prefetch-max-workers",
        _I,
        10,
        "Prefetches running at once.",
        minimum=1,
    ),
    _opt(
        "metadata-cache:experimental-metadata-prefetch-on-mount",
        kinds.enum("disabled", "sync", "async"),
        "disabled",
        "List the whole bucket at mount (deprecated in gcsfuse).",
        **_A,
    ),
    _opt(
        "metadata-cache:experimental-enable-optimized-metadata-cache",
        _B,
        False,
        "gcsfuse's radix-tree metadata cache switch.",
        **_A,
    ),
    # -- file-cache -----------------------------------------------------------------------
    _opt(
        "file-cache:max-size-mb",
        _I,
        -1,
        "SSD cache size in MiB; -1 = free space of the cache-dir volume, 0 disables.",
        flag="file-cache-max-size-mb",
        **_ANY_SIZE,
    ),
    _opt(
        "file-cache:cache-file-for-range-read",
        _B,
        False,
        "Cache the whole object even when the first read starts past offset 0.",
        flag="file-cache-cache-file-for-range-read",
    ),
    _opt(
        "file-cache:passthrough",
        _B,
        True,
        "Let the kernel read a whole cached, sealed object straight from its cache file "
        "(FUSE passthrough: Linux 6.9+, root); false: every read goes through the daemon, "
        "each block checked against its CRC32C.",
        flag="file-cache-passthrough",
        tierfs=True,
    ),
    _opt(
        "file-cache:enable-parallel-downloads",
        _B,
        False,
        "Download into the cache with parallel ranged reads (on by default with the cache).",
        flag="file-cache-enable-parallel-downloads",
    ),
    _opt(
        "file-cache:parallel-downloads-per-file",
        _I,
        16,
        "Parallel ranged reads per file.",
        flag="file-cache-parallel-downloads-per-file",
        minimum=1,
    ),
    _opt(
        "file-cache:max-parallel-downloads",
        _I,
        0,
        "Parallel ranged reads across all files; -1 unlimited (default max(16, 2 x CPUs)).",
        flag="file-cache-max-parallel-downloads",
        minimum=-1,
    ),
    _opt(
        "file-cache:download-chunk-size-mb",
        _I,
        200,
        "Size of one parallel ranged read in MiB (tierfs reads in ram-cache:block-size-mb blocks).",
        flag="file-cache-download-chunk-size-mb",
        minimum=1,
        effect=ACCEPTED,
    ),
    _opt(
        "file-cache:enable-crc",
        _B,
        False,
        "Check the CRC32C of whole downloads.",
        flag="file-cache-enable-crc",
        hidden=True,
    ),
    _opt(
        "file-cache:enable-o-direct",
        _B,
        False,
        "Write the cache with O_DIRECT.",
        flag="file-cache-enable-o-direct",
        **_HA,
    ),
    _opt(
        "file-cache:write-buffer-size",
        _I,
        4194304,
        "Aligned write buffer in bytes (multiple of 4096).",
        flag="file-cache-write-buffer-size",
        minimum=4096,
        **_HA,
    ),
    _opt(
        "file-cache:experimental-parallel-downloads-default-on",
        _B,
        True,
        "Turn parallel downloads on with the cache unless set.",
        flag="file-cache-experimental-parallel-downloads-default-on",
        hidden=True,
    ),
    _opt(
        "file-cache:include-regex",
        _S,
        "",
        "Cache only objects whose bucket/name matches.",
        flag="file-cache-include-regex",
    ),
    _opt(
        "file-cache:exclude-regex",
        _S,
        "",
        "Never cache objects whose bucket/name matches.",
        flag="file-cache-exclude-regex",
    ),
    _opt(
        "file-cache:experimental-enable-chunk-cache",
        _B,
        False,
        "Download only the chunks read.",
        flag="file-cache-experimental-enable-chunk-cache",
        **_HA,
    ),
    _opt(
        "file-cache:enable-experimental-shared-chunk-cache",
        _B,
        False,
        "Share one cache dir between mounts.",
        flag="enable-experimental-shared-chunk-cache",
        **_A,
    ),
    _opt(
        "file-cache:shared-cache-chunk-size-mb",
        _I,
        8,
        "Chunk size of the shared cache in MiB.",
        flag="file-cache-shared-cache-chunk-size-mb",
        minimum=1,
        **_HA,
    ),
    # -- ram-cache (tierfs) ------------------------------------------------------------------
    _opt(
        "ram-cache:max-size-mb",
        _I,
        256,
        "Size of the RAM tier in MiB; 0 disables it.",
        flag="ram-cache-max-size-mb",
        tierfs=True,
        minimum=0,
    ),
    _opt(
        "ram-cache:block-size-mb",
        _I,
        8,
        "Block size of the RAM tier in MiB.",
        flag="ram-cache-block-size-mb",
        tierfs=True,
        minimum=1,
        maximum=64,
    ),
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
    _opt("file-system:uid", _I, -1, "Owner of every inode; -1 = the mounting user.", minimum=-1),
    _opt("file-system:gid", _I, -1, "Group of every inode; -1 = the mounting group.", minimum=-1),
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
        "Check GCS on every open; ESTALE if the object changed.",
        effect=ACCEPTED,
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
    _opt("file-system:experimental-o-direct", _B, False, "direct_io on every handle.", **_HA),
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
        "Streaming blocks in flight per file; -1 unlimited.",
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
        "gcs-connection:max-conns-per-host", _I, 0, "Connections per host; 0 unlimited.", minimum=0
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
        "Range of one sequential GCS read in MiB.",
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
        "GCS bytes per second; -1 unlimited.",
        minimum=-1,
    ),
    _opt("gcs-connection:billing-project", _S, "", "Project billed for requester-pays buckets."),
    _opt("gcs-connection:http-client-timeout", _D, 0.0, "Timeout of one HTTP request; 0 none."),
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
        "seconds; 0: the HTTP client timeout.",
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
        "Log file (default: stderr in the foreground, syslog in the background).",
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


class _Index:
    """Lookups into SCHEMA by path, by flag and by the loose names of ``-o`` strings."""

    def __init__(self, options: tuple[Option, ...]) -> None:
        self.by_path: Mapping[str, Option] = MappingProxyType({o.path: o for o in options})
        self.by_flag: Mapping[str, Option] = MappingProxyType({o.flag: o for o in options})
        loose: dict[str, Option] = {}
        for option in options:
            loose.setdefault(loosen(option.flag), option)
            loose.setdefault(loosen(option.path), option)
        self.by_loose: Mapping[str, Option] = MappingProxyType(loose)
        if len(self.by_path) != len(options) or len(self.by_flag) != len(options):
            raise AssertionError("duplicate option path or flag in SCHEMA")

    def names(self) -> Iterator[str]:
        """Every name a user may type, for 'did you mean' hints."""
        yield from self.by_path
        yield from self.by_flag


def loosen(name: str) -> str:
    """``-o``/fstab names treat ``_`` and ``-`` as the same character."""
    return name.strip().replace("_", "-")


INDEX = _Index(SCHEMA)
