"""A NodePublishVolume request, read as the GKE gcsfuse driver reads it, into a daemon's argv.

The request is turned into the command line of ``tierfs mount`` that will serve
the volume, and that same command line is parsed here by the same code the
daemon runs (`tierfs.cli.main.effective_config`), so the plugin refuses exactly what
the daemon would refuse, with its one-line message, before anything is mounted.

What goes where, following the GKE driver (reference ``gcsfuse.md`` §2.1):

* the bucket: ``bucketName`` in the volume context (inline volumes), else the
  volume handle up to its first ``:`` (so several PVs can share a bucket);
* the volume capability's ``mount_flags`` (a PV's ``mountOptions``; each may
  hold several comma-joined options) and the ``mountOptions`` attribute, in
  that order, then the other attributes, through `mount_options.csi`;
* ``readonly`` (or a reader-only access mode) adds ``ro``; the pod's fsGroup
  (``volume_mount_group``) adds ``gid=G,file-mode=664,dir-mode=775`` before the
  user's options, so the user's own win;
* what the driver owns is forced as flags, which rank above attributes: the
  per-volume cache, temp and write-back directories, the key file, the log
  (JSON on the plugin's stderr) and the metrics port. The cache directory, as
  GKE's, only for a volume that sets ``file-cache:max-size-mb`` (or
  ``fileCacheCapacity``) to other than 0: the file cache is off by default.

``fingerprint`` is what makes a request "the same" for idempotency: everything
the user chose, and nothing the kubelet varies between republishes (pod
information, service-account tokens) or that is a secret.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import mount_options
from mount_options import Config, OptionError
from tierfs import settings
from tierfs.cli.main import MOUNT_EXTRAS, UsageError, effective_config

KUBELET_PREFIX = "csi.storage.k8s.io/"
EPHEMERAL = KUBELET_PREFIX + "ephemeral"
# Access modes (csi.proto VolumeCapability.AccessMode.Mode) that only read.
READER_ONLY_MODES = frozenset({2, 3})  # SINGLE_NODE_READER_ONLY, MULTI_NODE_READER_ONLY
KEY_FILE_NAME = "key.json"


class BadRequest(ValueError):
    """The request cannot be served as given: INVALID_ARGUMENT, with this one line."""


@dataclass(frozen=True)
class Request:
    """The parts of a NodePublishVolumeRequest that decide the mount (plain data, no proto)."""

    volume_id: str
    target: str
    mount_flags: tuple[str, ...] = ()
    context: tuple[tuple[str, str], ...] = ()
    readonly: bool = False
    access_mode: int = 0
    mount_group: str = ""

    @property
    def attributes(self) -> dict[str, str]:
        return dict(self.context)


@dataclass(frozen=True)
class Plan:
    """What the plugin needs to start a volume's daemon, from the config it will run with."""

    args: list[str]
    bucket: str
    connection: dict[str, object]  # GcsBucket.connect's keywords, for the plugin's own check
    check_bucket: bool  # not skipCSIBucketAccessCheck
    warnings: tuple[str, ...]


@dataclass(frozen=True)
class Layout:
    """Where one volume's local files go (all under its 0700 volume directory)."""

    root: Path

    @property
    def cache_dir(self) -> Path:
        return self.root / "cache"

    @property
    def temp_dir(self) -> Path:
        return self.root / "temp"

    @property
    def write_back_dir(self) -> Path:
        return self.root / "write-back"

    @property
    def key_file(self) -> Path:
        return self.root / KEY_FILE_NAME


KERNEL_OPTIONS = "allow_other,nodev,nosuid"  # every CSI mount's (default_permissions: pyfuse3's)


def bucket_of(request: Request) -> str:
    """The volume's bucket, checked as a bucket name: it goes into the daemon's argv, where
    a "bucket" that reads as a flag (an inline volume's ``bucketName`` is the pod author's
    to write) would be taken as one, by the plugin itself (root) first."""
    attributes = request.attributes
    if attributes.get("bucketName"):
        bucket = attributes["bucketName"]
    elif attributes.get(EPHEMERAL) == "true":
        raise BadRequest("an inline volume needs the volume attribute 'bucketName'")
    else:
        bucket = request.volume_id.partition(":")[0]
        if not bucket:
            raise BadRequest(f"volume handle '{request.volume_id}' names no bucket")
    try:
        mount_options.check_bucket_name(bucket)
    except OptionError as err:
        raise BadRequest(str(err)) from None
    return bucket


def mount_option_text(request: Request) -> str:
    """All the volume's mount options as one comma-joined string, in the order they rank."""
    items: list[str] = []
    if request.mount_group:
        items.append(f"gid={request.mount_group},file-mode=664,dir-mode=775")
    items.extend(request.mount_flags)
    if request.attributes.get("mountOptions"):
        items.append(request.attributes["mountOptions"])
    if request.readonly or request.access_mode in READER_ONLY_MODES:
        items.append("ro")
    return ",".join(token.strip() for item in items for token in item.split(",") if token.strip())


def user_attributes(request: Request) -> dict[str, str]:
    """The volume attributes the filesystem reads (kubelet's own and the bucket left out)."""
    return {
        name: value
        for name, value in request.context
        if not name.startswith(KUBELET_PREFIX) and name not in ("bucketName", "mountOptions")
    }


def daemon_args(
    request: Request,
    layout: Layout,
    *,
    key_file: bool,
    metrics_port: int = 0,
) -> list[str]:
    """``tierfs mount ...`` for this volume (without ``--foreground --ready-fd``)."""
    attributes = {**user_attributes(request), "mountOptions": mount_option_text(request)}
    forced = [
        # As GKE's driver mounts: a pod runs as any user (runAsUser, fsGroup), and the
        # kernel lets only the mounting user (root, here) in without allow_other.
        f"-o{KERNEL_OPTIONS}",
        f"--temp-dir={layout.temp_dir}",
        "--log-file=/dev/fd/2",
        "--log-format=json",
    ]
    if key_file:
        forced.append(f"--key-file={layout.key_file}")
    if metrics_port:
        forced += [f"--prometheus-port={metrics_port}", "--prometheus-host=127.0.0.1"]
    args = ["mount", "--csi-volume-attributes", json.dumps(attributes, sort_keys=True), *forced]
    args += [bucket_of(request), request.target]
    config = load(args)
    local = []
    if file_cache_asked(config):
        local.append(f"--cache-dir={layout.cache_dir}")
    if config["write:write-back"]:
        local.append(f"--write-back-dir={layout.write_back_dir}")
    args[-2:-2] = local
    return args


def file_cache_asked(config: Config) -> bool:
    """Whether the volume gets a cache directory, hence an SSD file cache: as with the GKE
    driver, only when it sets ``file-cache:max-size-mb`` (``fileCacheCapacity``) to other
    than 0. tierfs's own default, -1 (the free space), would fill the node's state volume."""
    return "file-cache:max-size-mb" in config.assigned and config["file-cache:max-size-mb"] != 0


def load(args: Sequence[str]) -> Config:
    """The config the daemon will run with: `BadRequest` (its one line) if it would refuse it."""
    try:
        return effective_config(mount_options.parse_flags(list(args[1:]), MOUNT_EXTRAS))
    except (OptionError, UsageError) as err:
        raise BadRequest(str(err)) from None


def driver_attributes(request: Request) -> dict[str, str | bool]:
    """The attributes only the driver reads (``skipCSIBucketAccessCheck``, ``disableMetrics``)."""
    try:
        return mount_options.parse_volume(user_attributes(request)).driver
    except OptionError as err:
        raise BadRequest(str(err)) from None


def plan(request: Request, layout: Layout, *, key_file: bool, metrics_port: int = 0) -> Plan:
    """The daemon's argv and what the plugin checks first; `BadRequest` for a bad request."""
    driver = driver_attributes(request)
    port = 0 if driver.get("disableMetrics") is True else metrics_port
    args = daemon_args(request, layout, key_file=key_file, metrics_port=port)
    config = load(args)
    _check_endpoint(config, key_file=key_file)
    return Plan(
        args=args,
        bucket=config.bucket,
        connection=dict(settings.gcs_connection(config)),
        check_bucket=driver.get("skipCSIBucketAccessCheck") is not True,
        warnings=(*config.warnings, *_without_effect(driver)),
    )


def _check_endpoint(config: Config, *, key_file: bool) -> None:
    """A custom endpoint is the volume author's to choose; without a key secret of the
    volume's own, or anonymous access, the plugin's credentials (the node's, or its
    Workload Identity) would go there with every request: only Google's hosts get them."""
    endpoint = config["gcs-connection:custom-endpoint"]
    if not endpoint or key_file or config["gcs-auth:anonymous-access"]:
        return
    host = (urlsplit(endpoint if "//" in endpoint else f"//{endpoint}").hostname or "").lower()
    if host != "googleapis.com" and not host.endswith(".googleapis.com"):
        raise BadRequest(
            f"custom-endpoint {endpoint} would be sent the plugin's own credentials: give "
            "the volume a key secret (nodePublishSecretRef) or anonymous-access"
        )


USED_DRIVER_ATTRIBUTES = frozenset({"skipCSIBucketAccessCheck", "disableMetrics"})


def _without_effect(driver: Mapping[str, str | bool]) -> list[str]:
    """A warning for each GKE driver attribute given that this plugin reads and ignores
    (per-pod identity, sidecar and shared-mount settings: docs/kubernetes.md): a PV that
    asks for the pod's own identity gets the node's, which its log says at each mount."""
    return [
        f"volume attribute '{name}' is accepted without effect by this driver"
        for name in sorted(driver)
        if name not in USED_DRIVER_ATTRIBUTES
    ]


def fingerprint(request: Request) -> str:
    """Equal for requests that must give the same mount (the idempotency rule of the spec)."""
    chosen = {
        "volume_id": request.volume_id,
        "bucket": bucket_of(request),
        "options": mount_option_text(request),
        "attributes": user_attributes(request),
    }
    return hashlib.sha256(json.dumps(chosen, sort_keys=True).encode()).hexdigest()


def key_from_secrets(secrets: Mapping[str, str]) -> str | None:
    """The service-account key among ``nodePublishSecretRef``'s entries: ``key.json``, or the
    only entry there is; `BadRequest` when there are several and none is ``key.json``."""
    if not secrets:
        return None
    if KEY_FILE_NAME in secrets:
        return secrets[KEY_FILE_NAME]
    if len(secrets) == 1:
        return next(iter(secrets.values()))
    names = ", ".join(sorted(secrets))
    raise BadRequest(
        f"nodePublishSecretRef has several keys ({names}): name the key '{KEY_FILE_NAME}'"
    )
