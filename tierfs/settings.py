"""The one projection of the options: a `Config` becomes each component's settings here.

Everything below the command line takes plain settings with units in their names
(``_s``, ``_bytes``) and never sees `mount_options`: the option language's
conventions, "-1 means unlimited", "0 turns it off", MiB and seconds, are turned
into numbers here and nowhere else. Rules that join several options (presets,
deprecated names, the file cache turning parallel downloads on) are the option
package's own (`mount_options.derive`); this module only reads their outcome.

`tierfs.mount` (the composition root) calls these and builds the components.
"""

from __future__ import annotations

import math
import tempfile
from typing import Any, NamedTuple

from mount_options import Config
from mount_options.derive import file_cache_enabled
from tierfs.cache.ssd_format import AUTO
from tierfs.core.filesystem import NEVER_S, Settings
from tierfs.storage.gcs import RetrySettings
from tierfs.storage.ratelimit import Throttle
from tierfs.storage.stall import ReadStallSettings


def ttl_s(secs: int) -> float:
    """gcsfuse's TTL convention: -1 = forever, 0 = off."""
    return math.inf if secs < 0 else float(secs)


def size_limit(max_size_mb: int) -> float:
    """gcsfuse's size convention: -1 = unlimited, else MiB (0 = off)."""
    return math.inf if max_size_mb < 0 else float(max_size_mb) * (1 << 20)


def mib(count: float) -> int:
    return int(count * (1 << 20))


def filesystem(config: Config, uid: int, gid: int) -> Settings:
    """The core's settings; ``uid``/``gid``: this process's, unless the options name others."""
    ttl = config["metadata-cache:ttl-secs"]
    attr_timeout = NEVER_S if ttl < 0 else float(ttl)
    return Settings(
        file_mode=config["file-system:file-mode"],
        dir_mode=config["file-system:dir-mode"],
        uid=uid if config["file-system:uid"] < 0 else config["file-system:uid"],
        gid=gid if config["file-system:gid"] < 0 else config["file-system:gid"],
        attr_timeout_s=attr_timeout,
        # The kernel keeps names as long as we keep their metadata (gcsfuse keeps 0
        # unless experimental-enable-dentry-cache; our own changes update the kernel's
        # entries as they happen, so the TTL is the only staleness either way).
        entry_timeout_s=attr_timeout,
        temp_dir=config["file-system:temp-dir"],
        rename_dir_limit=config["file-system:rename-dir-limit"],
        implicit_dirs=config["implicit-dirs"],
        only_dir=config["only-dir"],
        read_only="ro" in config.fuse_options,
        standard_symlinks=config["enable-standard-symlinks"],
        create_empty_file=config["write:create-empty-file"],
        metadata_ttl_s=ttl_s(ttl),
        negative_ttl_s=ttl_s(config["metadata-cache:negative-ttl-secs"]),
        stat_cache_max_bytes=size_limit(config["metadata-cache:stat-cache-max-size-mb"]),
        type_cache_max_bytes=size_limit(config["metadata-cache:type-cache-max-size-mb"]),
        read_ahead_bytes=read_ahead_bytes(config),
        list_ttl_s=ttl_s(config["file-system:kernel-list-cache-ttl-secs"]),
        metadata_prefetch=config["metadata-cache:enable-metadata-prefetch"],
        metadata_prefetch_workers=config["metadata-cache:metadata-prefetch-max-workers"],
        metadata_prefetch_entries=config["metadata-cache:metadata-prefetch-entries-limit"],
        write_back_delay_s=float(config["write:write-back-delay-secs"]),
        fsync_to_gcs=config["write:fsync-to-gcs"],
        # (a file the kernel writes itself goes through its page cache)
        write_passthrough=config["write:passthrough"]
        and not config["file-system:experimental-o-direct"],
        max_streams=max_streams(config),
        stream_chunk_bytes=max(1, int(config["write:block-size-mb"] * 4)) << 18,  # 256 KiB
        file_cache=file_cache_enabled(config.settings) or shared(config).enabled,
        cache_for_range_read=config["file-cache:cache-file-for-range-read"],
        passthrough=config["file-cache:passthrough"],
        slow_request_s=float(config["logging:slow-request-secs"]),
        ignore_interrupts=config["file-system:ignore-interrupts"],
        consistent_open=config["file-system:strong-consistency-on-open"],
        direct_io=config["file-system:experimental-o-direct"],
    )


def max_streams(config: Config) -> float:
    """Streaming uploads at a time: ``global-max-blocks`` / ``max-blocks-per-file`` (-1 is
    unlimited; 0 turns streaming off). Off with write-back, whose close() is local."""
    if not config["write:enable-streaming-writes"] or config["write:write-back"]:
        return 0
    total, per_file = config["write:global-max-blocks"], config["write:max-blocks-per-file"]
    if total < 0:
        return math.inf
    return total // per_file if per_file > 0 else total


def read_ahead_bytes(config: Config) -> int:
    """How far sequential reads prefetch: ``sequential-read-size-mb``, but never more than
    half the RAM tier (prefetched blocks wait there; more would evict them unread). It
    was a quarter; measured with it: `tierfs.core.blocks.DOWNLOAD_COPIES`."""
    wanted = config["gcs-connection:sequential-read-size-mb"] << 20
    ram = config["ram-cache:max-size-mb"] << 20
    block = block_bytes(config)
    return min(wanted, max(block, ram // 2)) if ram else wanted


def retry(config: Config) -> RetrySettings:
    """gcsfuse's gcs-retries options (and tierfs's request deadline) for `GcsBucket`; a
    0 that means "no bound" becomes None."""
    deadline = config["gcs-retries:request-deadline-secs"] or None
    return RetrySettings(
        max_attempts=config["gcs-retries:max-retry-attempts"],
        max_sleep_s=config["gcs-retries:max-retry-sleep"],
        multiplier=config["gcs-retries:multiplier"],
        deadline_s=deadline,
        upload_deadline_s=config["gcs-retries:chunk-retry-deadline-secs"] or deadline,
        upload_stall_s=config["gcs-retries:chunk-transfer-timeout-secs"] or None,
        read_stall=ReadStallSettings(
            enabled=config["gcs-retries:read-stall:enable"],
            initial_s=config["gcs-retries:read-stall:initial-req-timeout"],
            min_s=config["gcs-retries:read-stall:min-req-timeout"],
            max_s=config["gcs-retries:read-stall:max-req-timeout"],
            increase_rate=config["gcs-retries:read-stall:req-increase-rate"],
            target_percentile=config["gcs-retries:read-stall:req-target-percentile"],
        ),
    )


def gcs_connection(config: Config) -> dict[str, Any]:
    """The keyword arguments of `GcsBucket.connect` for this mount's bucket."""
    return {
        "endpoint": config["gcs-connection:custom-endpoint"],
        "key_file": config["gcs-auth:key-file"],
        "anonymous": config["gcs-auth:anonymous-access"],
        "billing_project": config["gcs-connection:billing-project"],
        "app_name": config["app-name"],
        "retry": retry(config),
        "http_timeout_s": config["gcs-connection:http-client-timeout"],
        "max_connections": config["gcs-connection:max-conns-per-host"],
        "throttle": Throttle(
            ops_per_s=config["gcs-connection:limit-ops-per-sec"],
            bytes_per_s=config["gcs-connection:limit-bytes-per-sec"],
        ),
    }


class TierSettings(NamedTuple):
    """The data tiers: RAM bytes (0: none), and the SSD tier if the file cache is on."""

    block_bytes: int
    ram_bytes: int
    ssd: bool
    cache_dir: str
    ssd_bytes: int  # AUTO: as much as the disk has
    include: str
    exclude: str


def block_bytes(config: Config) -> int:
    """The block size of every tier: the shared cache's chunk size when it is on (all nodes
    sharing it must agree; a block index means other bytes under another size)."""
    if config["file-cache:enable-experimental-shared-chunk-cache"]:
        return mib(config["file-cache:shared-cache-chunk-size-mb"])
    return mib(config["ram-cache:block-size-mb"])


class SharedSettings(NamedTuple):
    """The shared tier: on or not, its directory, its cap (AUTO: the volume's free space)."""

    enabled: bool
    directory: str
    max_bytes: int
    in_cache_dir: bool  # cache-dir is the shared directory: no local SSD tier there


def shared(config: Config) -> SharedSettings:
    """gcsfuse's shared chunk cache: in ``file-cache:shared-cache-dir``, else (gcsfuse's
    meaning of the option) in ``cache-dir``, which then holds no local SSD tier."""
    own = config["file-cache:shared-cache-dir"]
    directory = own or config["cache-dir"]
    size_mb = config["file-cache:shared-cache-max-size-mb"]
    on = config["file-cache:enable-experimental-shared-chunk-cache"]
    return SharedSettings(
        enabled=bool(on and directory and size_mb != 0),
        directory=directory,
        max_bytes=AUTO if size_mb < 0 else mib(size_mb),
        in_cache_dir=bool(on and not own),
    )


def tiers(config: Config) -> TierSettings:
    size_mb = config["file-cache:max-size-mb"]
    return TierSettings(
        block_bytes=block_bytes(config),
        ram_bytes=max(0, mib(config["ram-cache:max-size-mb"])),
        ssd=file_cache_enabled(config.settings) and not shared(config).in_cache_dir,
        cache_dir=config["cache-dir"],
        ssd_bytes=AUTO if size_mb < 0 else mib(size_mb),
        include=config["file-cache:include-regex"],
        exclude=config["file-cache:exclude-regex"],
    )


class BlockSettings(NamedTuple):
    block_bytes: int
    downloads: float  # block downloads at a time, across files (inf: no cap)
    per_file: int
    check_crc: bool


def blocks(config: Config) -> BlockSettings:
    downloads = config["file-cache:max-parallel-downloads"]
    parallel = config["file-cache:enable-parallel-downloads"]
    return BlockSettings(
        block_bytes=block_bytes(config),
        downloads=math.inf if downloads < 0 else max(1, downloads),
        per_file=config["file-cache:parallel-downloads-per-file"] if parallel else 1,
        check_crc=config["file-cache:enable-crc"],
    )


def writeback_root(config: Config) -> tuple[str, str]:
    """(option, directory): where write-back keeps its journal and staged files."""
    for option, key in (
        ("write-back-dir", "write:write-back-dir"),
        ("cache-dir", "cache-dir"),
        ("temp-dir", "file-system:temp-dir"),
    ):
        if config[key]:
            return option, config[key]
    return "temp-dir", tempfile.gettempdir()


def local_directories(config: Config) -> list[tuple[str, str]]:
    """(option, directory) of every local directory this mount will write in."""
    wanted = [("temp-dir", config["file-system:temp-dir"] or tempfile.gettempdir())]
    if tiers(config).ssd:  # (a shared directory may be unreachable: the mount goes on)
        wanted.append(("cache-dir", config["cache-dir"]))
    if config["write:write-back"]:
        wanted.append(writeback_root(config))
    return list(dict.fromkeys(wanted))


class MetricsSettings(NamedTuple):
    port: int  # 0: no endpoint
    host: str


def metrics(config: Config) -> MetricsSettings:
    return MetricsSettings(config["metrics:prometheus-port"], config["metrics:prometheus-host"])
