"""Values that follow from other values, computed in this one place.

This mirrors gcsfuse's ``cfg/optimize.go`` and ``cfg/rationalize.go``:

* presets: ``profile`` (aiml-training, aiml-serving, aiml-checkpointing) and a
  high-performance ``machine-type`` change defaults of options the user left
  unset;
* deprecated options feed their replacements when those are unset
  (``stat-cache-ttl`` -> ``metadata-cache:ttl-secs`` as ceil(min(stat, type)),
  ``stat-cache-capacity`` -> ``stat-cache-max-size-mb`` at 1720 B an entry);
* ``debug_fuse``/``debug_gcs``/``debug_mutex`` force trace logging;
* the file cache (``cache-dir`` set and ``file-cache:max-size-mb`` != 0)
  turns parallel downloads on unless the user said otherwise;
* streaming writes turn ``create-empty-file`` off (a warning if it was given);
* options that mean something only while write-back or the shared chunk cache is
  on are named in one warning when given without it;
* cross-option checks that no single option can make.

A derived value carries the source of the option that caused it, so
``--dry-run`` shows why a value is what it is. Values keep the user's meaning
(-1 stays -1 = unlimited); consumers interpret -1, not this module.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping, MutableMapping
from typing import Any, Protocol
from urllib.parse import urlsplit

from mount_options.errors import OptionError


class _Setting(Protocol):
    value: Any
    source: str


Settings = MutableMapping[str, Any]
Make = Callable[[Any, str], Any]

_AIML = {
    "implicit-dirs": True,
    "metadata-cache:ttl-secs": -1,
    "metadata-cache:negative-ttl-secs": 0,
    "metadata-cache:stat-cache-max-size-mb": -1,
    "metadata-cache:type-cache-max-size-mb": -1,
}
PROFILES: dict[str, dict[str, Any]] = {
    "aiml-training": dict(_AIML),
    "aiml-serving": {
        **_AIML,
        "file-system:kernel-list-cache-ttl-secs": -1,
        "file-cache:cache-file-for-range-read": True,
    },
    "aiml-checkpointing": {
        **_AIML,
        "file-cache:cache-file-for-range-read": True,
        "file-system:rename-dir-limit": 200000,
    },
}
HIGH_PERFORMANCE_MACHINE = re.compile(r"^(a2-(mega|ultra)gpu|a3-|a4-|a4x-|ct5l?p?-|ct6e-|tpu7x-)")
HIGH_PERFORMANCE: dict[str, Any] = {
    "implicit-dirs": True,
    "metadata-cache:ttl-secs": -1,
    "metadata-cache:negative-ttl-secs": 0,
    "metadata-cache:stat-cache-max-size-mb": 1024,
    "metadata-cache:type-cache-max-size-mb": 128,
    "file-system:rename-dir-limit": 200000,
    "write:global-max-blocks": 1600,
}
STAT_CACHE_ENTRY_BYTES = 1720
# Options that only mean something while another (a bool) is on: given without it, one
# warning names them.
ONLY_WITH: dict[str, tuple[str, ...]] = {
    "write:write-back": (
        "write:write-back-dir",
        "write:write-back-delay-secs",
        "write:fsync-to-gcs",
        "write:passthrough",
    ),
    "file-cache:enable-experimental-shared-chunk-cache": (
        "file-cache:shared-cache-dir",
        "file-cache:shared-cache-max-size-mb",
        "file-cache:shared-cache-chunk-size-mb",
    ),
}


def apply(settings: Settings, explicit: frozenset[str], *, cpu_count: int, make: Make) -> list[str]:
    """Fill in derived values in place and check across options; return warnings."""
    warnings: list[str] = []
    touched = set(explicit)

    def put(path: str, value: Any, source: str) -> None:
        settings[path] = make(value, source)
        touched.add(path)

    _presets(settings, explicit, put)
    _metadata_from_deprecated(settings, explicit, put)
    _severity_from_debug(settings, put)
    _file_cache(settings, explicit, put, cpu_count, warnings)
    if (
        settings["write:enable-streaming-writes"].value
        and settings["write:create-empty-file"].value
    ):
        put("write:create-empty-file", False, settings["write:create-empty-file"].source)
        if "write:create-empty-file" in explicit:
            warnings.append(
                "write:create-empty-file has no effect while write:enable-streaming-writes is on"
            )
    if (
        "metrics:cloud-metrics-export-interval-secs" not in explicit
        and "metrics:stackdriver-export-interval" in explicit
    ):
        old = settings["metrics:stackdriver-export-interval"]
        put("metrics:cloud-metrics-export-interval-secs", int(old.value), old.source)
    for switch, paths in ONLY_WITH.items():
        _idle_without(settings, explicit, switch, paths, warnings)
    _normalize(settings, put)
    _check(settings, explicit)
    return warnings


def _idle_without(
    settings: Settings,
    explicit: frozenset[str],
    switch: str,
    paths: tuple[str, ...],
    warnings: list[str],
) -> None:
    """One warning naming the options given that do nothing while ``switch`` is off."""
    idle = [path for path in paths if path in explicit]
    if idle and not settings[switch].value:
        verb = "has" if len(idle) == 1 else "have"
        warnings.append(f"{', '.join(idle)} {verb} no effect without {switch}")


def _presets(settings: Settings, explicit: frozenset[str], put: Callable[..., None]) -> None:
    machine = settings["machine-type"]
    if machine.value and not settings["disable-autoconfig"].value:
        if HIGH_PERFORMANCE_MACHINE.match(machine.value):
            for path, value in HIGH_PERFORMANCE.items():
                if path not in explicit:
                    put(path, value, machine.source)
    profile = settings["profile"]
    for path, value in PROFILES.get(profile.value, {}).items():
        if path not in explicit:
            put(path, value, profile.source)


def _metadata_from_deprecated(
    settings: Settings, explicit: frozenset[str], put: Callable[..., None]
) -> None:
    stat_ttl = settings["metadata-cache:deprecated-stat-cache-ttl"]
    type_ttl = settings["metadata-cache:deprecated-type-cache-ttl"]
    old_ttl = {
        "metadata-cache:deprecated-stat-cache-ttl",
        "metadata-cache:deprecated-type-cache-ttl",
    }
    if "metadata-cache:ttl-secs" not in explicit and old_ttl & explicit:
        source = (stat_ttl if stat_ttl.source != "default" else type_ttl).source
        put("metadata-cache:ttl-secs", math.ceil(min(stat_ttl.value, type_ttl.value)), source)
    capacity = settings["metadata-cache:deprecated-stat-cache-capacity"]
    size_path = "metadata-cache:stat-cache-max-size-mb"
    if size_path not in explicit and capacity.source != "default":
        size_mb = math.ceil(capacity.value * STAT_CACHE_ENTRY_BYTES / 2**20)
        put(size_path, size_mb, capacity.source)


def _severity_from_debug(settings: Settings, put: Callable[..., None]) -> None:
    for path in ("debug:fuse", "debug:gcs", "debug:log-mutex"):
        if settings[path].value:
            put("logging:severity", "trace", settings[path].source)
            return


def file_cache_enabled(settings: Mapping[str, Any]) -> bool:
    return bool(settings["cache-dir"].value) and settings["file-cache:max-size-mb"].value != 0


def _file_cache(
    settings: Settings,
    explicit: frozenset[str],
    put: Callable[..., None],
    cpu_count: int,
    warnings: list[str],
) -> None:
    downloads = "file-cache:max-parallel-downloads"
    if downloads not in explicit:
        settings[downloads] = type(settings[downloads])(max(16, 2 * cpu_count), "default")
    if not file_cache_enabled(settings):
        if not settings["cache-dir"].value and any(p.startswith("file-cache:") for p in explicit):
            warnings.append(
                "file-cache options are set but cache-dir is not: the SSD file cache is off"
            )
        return
    parallel = "file-cache:enable-parallel-downloads"
    if (
        parallel not in explicit
        and settings["file-cache:experimental-parallel-downloads-default-on"].value
    ):
        put(parallel, True, settings["cache-dir"].source)
    if settings["read:enable-buffered-read"].value:
        warnings.append("read:enable-buffered-read is ignored while the file cache is on")


def _normalize(settings: Settings, put: Callable[..., None]) -> None:
    only_dir = settings["only-dir"]
    trimmed = "/".join(part for part in only_dir.value.split("/") if part)
    if trimmed != only_dir.value:
        put("only-dir", trimmed, only_dir.source)


def _check(settings: Settings, explicit: frozenset[str]) -> None:
    endpoint = settings["gcs-connection:custom-endpoint"].value
    if endpoint:
        parts = urlsplit(endpoint)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise OptionError(
                f"bad value '{endpoint}' for option 'gcs-connection:custom-endpoint': "
                "expected a URL such as http://127.0.0.1:4443"
            )
    block = settings["write:block-size-mb"].value
    if not (block * 4).is_integer():
        raise OptionError(
            f"bad value '{block}' for option 'write:block-size-mb': expected a multiple of 0.25"
        )
    if settings["file-cache:write-buffer-size"].value % 4096:
        raise OptionError(
            "bad value for option 'file-cache:write-buffer-size': expected a multiple of 4096"
        )
    if settings["file-cache:enable-parallel-downloads"].value and (
        settings["file-cache:max-parallel-downloads"].value == 0
    ):
        raise OptionError(
            "option 'file-cache:max-parallel-downloads' must not be 0 "
            "while parallel downloads are on"
        )
    if {
        "metrics:cloud-metrics-export-interval-secs",
        "metrics:stackdriver-export-interval",
    } <= explicit:
        raise OptionError(
            "options 'metrics:cloud-metrics-export-interval-secs' and "
            "'metrics:stackdriver-export-interval' exclude each other"
        )
    for path in ("file-cache:include-regex", "file-cache:exclude-regex"):
        pattern = settings[path].value
        if pattern:
            try:
                re.compile(pattern)
            except re.error as err:
                raise OptionError(f"bad value '{pattern}' for option '{path}': {err}") from None
    if settings["gcs-auth:anonymous-access"].value and settings["gcs-auth:key-file"].value:
        raise OptionError(
            "options 'gcs-auth:anonymous-access' and 'gcs-auth:key-file' exclude each other"
        )
