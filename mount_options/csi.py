"""Kubernetes CSI volumes: ``mountOptions`` and ``volumeAttributes``, as GKE's driver reads them.

The GKE gcsfuse CSI driver (``pkg/csi_driver/utils.go``) turns a few volume
attributes into colon-form options (``fileCacheCapacity: 10Gi`` becomes
``file-cache:max-size-mb:10240``), merges them with the volume's
``mountOptions`` and drops options the driver owns (cache and temp
directories, log files, credentials). We read both the same way, so a
PersistentVolume written for gcsfuse mounts tierfs unchanged.

Unlike the GKE driver we refuse an attribute we do not know (with the
nearest valid name) instead of ignoring it: a typo in ``fileCacheCapacity``
should not silently leave the cache off. Attributes the kubelet adds
(``csi.storage.k8s.io/...``) and the driver-only ones are accepted.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from mount_options.config import CSI_ATTRIBUTE, FILE_RANK, MOUNT_OPTION, Assignment, typed
from mount_options.errors import OptionError, unknown
from mount_options.kinds import BOOL, quantity_to_mb
from mount_options.schema import INDEX, loosen
from mount_options.tokens import Parsed, parse_token

# attribute -> (option path, how its text becomes the value)
QUANTITY, BOOLEAN, TTL, TEXT = "quantity", "bool", "ttl", "text"
ATTRIBUTES: Mapping[str, tuple[str, str]] = {
    "fileCacheCapacity": ("file-cache:max-size-mb", QUANTITY),
    "fileCacheForRangeRead": ("file-cache:cache-file-for-range-read", BOOLEAN),
    "metadataStatCacheCapacity": ("metadata-cache:stat-cache-max-size-mb", QUANTITY),
    "metadataTypeCacheCapacity": ("metadata-cache:type-cache-max-size-mb", QUANTITY),
    "metadataCacheTTLSeconds": ("metadata-cache:ttl-secs", TTL),
    "metadataCacheTtlSeconds": ("metadata-cache:ttl-secs", TTL),
    "gcsfuseLoggingSeverity": ("logging:severity", TEXT),
}
# Read by the driver itself, not by the filesystem: accepted, checked where typed, returned apart.
DRIVER_ATTRIBUTES: Mapping[str, str] = {
    "skipCSIBucketAccessCheck": BOOLEAN,
    "disableMetrics": BOOLEAN,
    "hostNetworkPodKSA": BOOLEAN,
    "enableCloudProfilerForSidecar": BOOLEAN,
    "identityProvider": TEXT,
    "identityPool": TEXT,
    "multiNICIndex": TEXT,
    "sharedMount": BOOLEAN,
    "gcsfuseMetadataPrefetchOnMount": BOOLEAN,
}
# The driver owns these; a mountOptions entry naming them is dropped with a warning.
DRIVER_OWNED = frozenset({"log-file", "log-format", "cache-dir", "temp-dir", "config-file",
                          "foreground", "key-file", "token-url", "reuse-token-from-url",
                          "prometheus-port", "kernel-params-file",
                          "write-back-dir"})  # fmt: skip  # (tierfs's: the volume's journal)
# Consumed by the driver, never passed on.
DRIVER_INTERNAL = frozenset({"token-server-identity-provider", "token-server-identity-pool",
                             "hnw-ksa", "enable-sidecar-bucket-access-check", "file-cache-medium",
                             "gcs-fuse-numa-node", "enable-gcsfuse-kernel-params",
                             "enable-auto-gomemlimit", "auto-gomemlimit-ratio",
                             "storage-endpoint-internal", "disable-metrics-for-gke"})  # fmt: skip


@dataclass
class CsiVolume:
    """A CSI volume's options, its bucket and the attributes only the driver reads."""

    parsed: Parsed = field(default_factory=Parsed)
    bucket: str = ""
    driver: dict[str, str | bool] = field(default_factory=dict)


# The same options by their config paths: a colon form (``gcs-auth:key-file:/x``, whose
# first word is the section) is dropped too, not only the flag's name.
OWNED_PATHS = frozenset(INDEX.by_flag[n].path for n in DRIVER_OWNED if n in INDEX.by_flag)


def parse_mount_options(options: Iterable[str]) -> Parsed:
    """A PV's ``spec.mountOptions`` list (each item may itself hold commas)."""
    parsed = Parsed()
    for item in options:
        for token in item.split(","):
            name = loosen(token.strip().partition("=")[0].split(":", 1)[0])
            if name in DRIVER_INTERNAL:
                continue
            one = Parsed() if name in DRIVER_OWNED else parse_token(token, MOUNT_OPTION)
            if name in DRIVER_OWNED or any(a.path in OWNED_PATHS for a in one.assignments):
                parsed.warnings.append(
                    f"mount option '{token.strip()}' is set by the CSI driver; ignored"
                )
                continue
            parsed.extend(one)
    return parsed


def parse_volume(attributes: Mapping[str, str], mount_options: Iterable[str] = ()) -> CsiVolume:
    """``volumeAttributes`` (with ``mountOptions`` and ``bucketName``) plus PV mountOptions."""
    volume = CsiVolume()
    volume.parsed.extend(parse_mount_options(mount_options))
    if "mountOptions" in attributes:
        volume.parsed.extend(parse_mount_options([attributes["mountOptions"]]))
    for name, text in attributes.items():
        if name in ("mountOptions", "bucketName") or name.startswith("csi.storage.k8s.io/"):
            continue
        if name in ATTRIBUTES:
            path, how = ATTRIBUTES[name]
            value = typed(INDEX.by_path[path], _convert(name, text, how))
            volume.parsed.assignments.append(Assignment(path, value, CSI_ATTRIBUTE, FILE_RANK))
        elif name in DRIVER_ATTRIBUTES:
            volume.driver[name] = _convert(name, text, DRIVER_ATTRIBUTES[name])
        else:
            legacy = {"metadataCacheTtlSeconds"}
            pool = [*(a for a in ATTRIBUTES if a not in legacy), *DRIVER_ATTRIBUTES]
            pool += ["mountOptions", "bucketName"]
            raise unknown(name, pool, normalize=str.lower, what="volume attribute")
    if volume.driver.get("disableMetrics") is True:
        port = INDEX.by_path["metrics:prometheus-port"]
        volume.parsed.assignments.append(Assignment(port.path, 0, CSI_ATTRIBUTE, FILE_RANK))
    volume.bucket = attributes.get("bucketName", "")
    return volume


def _convert(name: str, text: str, how: str) -> str | bool:
    try:
        if how == QUANTITY:
            return str(quantity_to_mb(text))
        if how == BOOLEAN:
            return BOOL.parse(text)
        if how == TTL:
            return str(max(-1, int(text.strip())))
    except ValueError as err:
        expected = str(err) if how != TTL else "an integer"
        raise OptionError(
            f"bad value '{text}' for volume attribute '{name}': expected {expected}"
        ) from None
    return text
