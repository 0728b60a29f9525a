"""The CSI Node service: NodePublishVolume mounts a bucket at the pod's target, Unpublish undoes it.

Every RPC answers with a gRPC status the spec names and one line: a bad request
is INVALID_ARGUMENT (naming the option or field), a target outside the kubelet
root PERMISSION_DENIED, a missing bucket NOT_FOUND, the same target asked for
with another volume or other options ALREADY_EXISTS. Anything unexpected is
logged with its traceback and answered INTERNAL with its one line.

Publish is idempotent by `volume.fingerprint`: the same request again answers
OK without touching the mount (kubelet republishes every sync period, since the
CSIDriver sets ``requiresRepublish``); one whose daemon died is remounted. A
target that a previous plugin process mounted (its record in the volume
directory) is recognised by the same fingerprint.

Unpublish first asks the daemon to put everything written into GCS (``tierfs
sync``), bounded by ``upload_timeout_s``: past it, or on an upload error, it
answers DEADLINE_EXCEEDED / INTERNAL and leaves the volume mounted, so the
kubelet retries and no written data is dropped. Then it unmounts, waits for the
daemon, removes the target directory and the volume directory (key included).

Requests for one target are serialised by a lock per target; different
targets proceed in parallel.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import threading
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, NoReturn

import grpc
import trio

from tierfs.cli import control, daemon
from tierfs.cli.mountpoint import ALIVE, HUNG, MountError, mounted_here, probe, unmount
from tierfs.csi import paths
from tierfs.csi.daemons import Daemon, StartError, is_fuse_mounted
from tierfs.csi.metrics import VolumeView
from tierfs.csi.proto import csi_pb2, csi_pb2_grpc
from tierfs.csi.volume import BadRequest, Layout, Request, fingerprint, key_from_secrets, plan
from tierfs.errors import AccessDenied, NotFound, TierfsError

log = logging.getLogger("tierfs.csi.node")
Code = grpc.StatusCode


class Failure(Exception):
    """An RPC's answer other than OK."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True)
class NodeSettings:
    node_id: str
    kubelet_root: Path
    state_dir: Path
    start_timeout_s: float = 120.0
    upload_timeout_s: float = 90.0
    exit_timeout_s: float = 60.0


@dataclass
class Published:
    fingerprint: str
    daemon: Daemon
    directory: Path
    metrics_port: int


class Node(csi_pb2_grpc.NodeServicer):
    def __init__(self, config: NodeSettings, *, metrics: bool = False) -> None:
        self.config = config
        self.metrics = metrics
        self.volumes: dict[Path, Published] = {}
        self._guard = threading.Lock()
        self._locks: dict[Path, threading.Lock] = {}

    # --- RPCs -------------------------------------------------------------------------------

    def NodeGetInfo(self, request: Any, context: grpc.ServicerContext) -> Any:
        return csi_pb2.NodeGetInfoResponse(node_id=self.config.node_id)

    def NodeGetCapabilities(self, request: Any, context: grpc.ServicerContext) -> Any:
        rpc = csi_pb2.NodeServiceCapability.RPC
        return csi_pb2.NodeGetCapabilitiesResponse(
            capabilities=[
                csi_pb2.NodeServiceCapability(rpc=rpc(type=rpc.VOLUME_MOUNT_GROUP)),
            ]
        )

    def NodePublishVolume(self, request: Any, context: grpc.ServicerContext) -> Any:
        with self._answer(context, "NodePublishVolume", request.volume_id):
            wanted = publish_request(request)
            target = self._target(wanted.target)
            with self._lock_for(target):
                self._publish(replace(wanted, target=str(target)), dict(request.secrets))
        return csi_pb2.NodePublishVolumeResponse()

    def NodeUnpublishVolume(self, request: Any, context: grpc.ServicerContext) -> Any:
        with self._answer(context, "NodeUnpublishVolume", request.volume_id):
            if not request.volume_id:
                raise Failure(Code.INVALID_ARGUMENT, "volume_id is missing")
            if not request.target_path:
                raise Failure(Code.INVALID_ARGUMENT, "target_path is missing")
            target = self._target(request.target_path)
            with self._lock_for(target):
                self._unpublish(request.volume_id, target)
        return csi_pb2.NodeUnpublishVolumeResponse()

    # --- publish ----------------------------------------------------------------------------

    def _publish(self, wanted: Request, secrets: dict[str, str]) -> None:
        target = Path(wanted.target)
        print_ = fingerprint(wanted)
        known = self.volumes.get(target)
        if known is not None:
            if known.fingerprint != print_:
                raise Failure(Code.ALREADY_EXISTS, f"{target} is published with other options")
            # The same request again: the kubelet's republish, with the secret read anew.
            # A rotated key is written for the daemon's next start (its watcher restarts
            # it with the file): kept, the old key, revoked, failed every restart.
            self._renew_key(known, key_from_secrets(secrets))
            if known.daemon.restarting():
                raise Failure(Code.UNAVAILABLE, f"{target}: its daemon is being restarted")
            return
        directory = paths.volume_dir(self.config.state_dir, wanted.volume_id, target)
        entry = mounted_here(str(target))
        if entry is not None:
            record = paths.read_record(directory) or {}
            if not entry.fstype.startswith("fuse") or record.get("fingerprint") != print_:
                raise Failure(
                    Code.ALREADY_EXISTS, f"{target} already has another mount ({entry.source})"
                )
            state = probe(str(target))
            if state == ALIVE:
                return  # mounted by an earlier plugin process for this very request
            if state == HUNG:
                # Alive but not answering: killed first, or it keeps its journal's lock and
                # the new daemon, refused it, fails every republish.
                self._kill_stuck(wanted.volume_id, target, None, directory)
            unmount(str(target), lazy=True)  # its daemon died with that process: mount again
        self._mount(wanted, print_, directory, secrets)

    @staticmethod
    def _renew_key(known: Published, key: str | None) -> None:
        if key is None:
            return
        path = Layout(paths.private_dir(known.directory)).key_file
        try:
            if path.read_text(encoding="utf-8") == key:
                return
        except OSError:
            pass
        paths.write_private(path, key)
        log.warning("%s: the volume's key secret changed; the daemon's next start uses it", path)

    def _mount(
        self, wanted: Request, print_: str, directory: Path, secrets: dict[str, str]
    ) -> None:
        key = key_from_secrets(secrets)
        layout = Layout(paths.private_dir(directory))
        try:
            if key is not None:
                paths.write_private(layout.key_file, key)
            port = self._metrics_port()
            daemon_plan = plan(wanted, layout, key_file=key is not None, metrics_port=port)
            for warning in daemon_plan.warnings:
                log.warning("volume %s: %s", wanted.volume_id, warning)
            if daemon_plan.check_bucket:
                check_bucket(daemon_plan.bucket, daemon_plan.connection)
            Path(wanted.target).mkdir(mode=0o750, parents=True, exist_ok=True)
            if any(a.startswith("--write-back-dir=") for a in daemon_plan.args):
                left = paths.adopt_left_journal(self.config.state_dir, wanted.volume_id, directory)
                if left is not None:
                    log.warning(
                        "volume %s: the write-back data an unpublish left in %s (not in GCS "
                        "yet) is uploaded by this mount's daemon",
                        wanted.volume_id,
                        left,
                    )
            record = {"fingerprint": print_, "volume_id": wanted.volume_id, "target": wanted.target}
            paths.write_record(directory, record)
            volume = Daemon(wanted.volume_id, daemon_plan.args, self.config.start_timeout_s)
            volume.start()
        except BaseException:
            paths.remove_volume_dir(directory, keep_write_back=paths.has_pending_writes(directory))
            raise
        metrics_port = (
            port if any(a.startswith("--prometheus-port") for a in daemon_plan.args) else 0
        )
        self.volumes[Path(wanted.target)] = Published(print_, volume, directory, metrics_port)
        log.info(
            "published volume %s (gs://%s) on %s, daemon pid %s",
            wanted.volume_id,
            daemon_plan.bucket,
            wanted.target,
            volume.pid,
        )

    def _metrics_port(self) -> int:
        if not self.metrics:
            return 0
        with socket.socket() as probe:  # a free port for this volume's daemon, on loopback
            probe.bind(("127.0.0.1", 0))
            return int(probe.getsockname()[1])

    # --- unpublish --------------------------------------------------------------------------

    def _unpublish(self, volume_id: str, target: Path) -> None:
        known = self.volumes.get(target)
        directory = (
            known.directory if known else paths.volume_dir(self.config.state_dir, volume_id, target)
        )
        if is_fuse_mounted(target):
            state = probe(str(target))
            if state == ALIVE:
                self._upload_pending(target)
            elif state == HUNG:  # (nothing restarts a daemon that lives on, stuck)
                self._kill_stuck(volume_id, target, known, directory)
            elif known is not None:
                raise Failure(Code.UNAVAILABLE, "its daemon died and is being restarted; retry")
            try:
                if known is not None:
                    known.daemon.stop(self.config.exit_timeout_s)
                else:  # mounted by an earlier plugin process
                    daemon.stop(str(target), timeout_s=self.config.exit_timeout_s)
            except MountError as err:
                raise Failure(Code.INTERNAL, str(err)) from None
            except TimeoutError as err:
                raise Failure(Code.DEADLINE_EXCEEDED, str(err)) from None
        elif known is not None:
            with contextlib.suppress(TimeoutError):
                known.daemon.stop(self.config.exit_timeout_s)
        with contextlib.suppress(FileNotFoundError):
            target.rmdir()
        # Kept whatever ran it (a daemon that died left its journal: the data not in GCS).
        pending = paths.has_pending_writes(directory)
        if pending:
            log.error("volume %s: write-back data not in GCS kept in %s", volume_id, directory)
        paths.remove_volume_dir(directory, keep_write_back=pending)
        self.volumes.pop(target, None)
        log.info("unpublished volume %s from %s", volume_id, target)

    def _kill_stuck(
        self, volume_id: str, target: Path, known: Published | None, directory: Path
    ) -> None:
        """A daemon that does not answer (stopped, deadlocked): killed, so that the unmount
        goes on; what it had closed and not uploaded stays in its journal."""
        pids = [known.daemon.pid] if known is not None else daemon.daemon_pids(str(target))
        log.error(
            "volume %s: the daemon on %s (pid %s) does not answer; killed (write-back data "
            "not in GCS, if any, is kept in %s)",
            volume_id,
            target,
            ", ".join(str(pid) for pid in pids if pid is not None) or "?",
            directory,
        )
        if known is not None:
            known.daemon.kill()
            return
        for pid in pids:
            if pid is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)

    def _upload_pending(self, target: Path) -> None:
        timeout_s = self.config.upload_timeout_s
        try:
            answer = control.request(str(target), "sync", timeout_s, {"path": ""})
        except TimeoutError:
            raise Failure(
                Code.DEADLINE_EXCEEDED,
                f"written data is still uploading after {timeout_s:.0f} s; the volume stays "
                "mounted until it is in GCS (the kubelet retries)",
            ) from None
        except OSError as err:
            raise Failure(Code.UNAVAILABLE, f"its daemon does not answer: {err}") from None
        if "error" in answer:
            raise Failure(
                Code.INTERNAL,
                f"cannot upload written data: {answer['error']}; the volume stays mounted",
            )

    def metrics_volumes(self) -> list[VolumeView]:
        """The published volumes, for the plugin's metrics endpoint."""
        return [
            VolumeView(v.daemon.volume_id, str(target), v.metrics_port, v.daemon.restarts)
            for target, v in list(self.volumes.items())
        ]

    # --- helpers ----------------------------------------------------------------------------

    def _target(self, target: str) -> Path:
        try:
            return paths.resolve_target(target, self.config.kubelet_root)
        except paths.OutsideRoot as err:
            raise Failure(Code.PERMISSION_DENIED, str(err)) from None

    def _lock_for(self, target: Path) -> threading.Lock:
        with self._guard:
            return self._locks.setdefault(target, threading.Lock())

    @contextlib.contextmanager
    def _answer(self, context: grpc.ServicerContext, rpc: str, volume_id: str) -> Iterator[None]:
        """Turn what the body raises into the RPC's status and one line."""
        code, message = Code.OK, ""
        try:
            yield
        except Failure as err:
            code, message = err.code, str(err)
        except BadRequest as err:
            code, message = Code.INVALID_ARGUMENT, str(err)
        except StartError as err:
            code, message = Code.INTERNAL, f"cannot mount: {err}"
        except NotFound as err:
            code, message = Code.NOT_FOUND, str(err)
        except AccessDenied as err:
            code, message = Code.PERMISSION_DENIED, str(err)
        except TierfsError as err:
            code, message = Code.UNAVAILABLE, str(err)
        except Exception as err:
            log.error("%s of volume %s failed: %s", rpc, volume_id, err, exc_info=err)
            code, message = Code.INTERNAL, f"{type(err).__name__}: {err}"
        if code != Code.OK:
            log.info("%s of volume %s: %s: %s", rpc, volume_id, code.name, message)
            abort(context, code, message)


def abort(context: grpc.ServicerContext, code: grpc.StatusCode, message: str) -> NoReturn:
    context.abort(code, " ".join(message.split()))
    raise AssertionError("unreachable")  # context.abort raises


def publish_request(request: Any) -> Request:
    """The plain `Request` of a NodePublishVolumeRequest; `Failure` for what the spec calls
    INVALID_ARGUMENT (missing ids or capability, a block volume)."""
    if not request.volume_id:
        raise Failure(Code.INVALID_ARGUMENT, "volume_id is missing")
    if not request.target_path:
        raise Failure(Code.INVALID_ARGUMENT, "target_path is missing")
    if not request.HasField("volume_capability"):
        raise Failure(Code.INVALID_ARGUMENT, "volume_capability is missing")
    capability = request.volume_capability
    if capability.HasField("block"):
        raise Failure(Code.INVALID_ARGUMENT, "block volumes are not supported: use a mount volume")
    if not capability.HasField("mount"):  # (the spec requires one access type)
        raise Failure(Code.INVALID_ARGUMENT, "volume_capability has no access type: use mount")
    mount = capability.mount
    return Request(
        volume_id=request.volume_id,
        target=request.target_path,
        mount_flags=tuple(mount.mount_flags),
        context=tuple(sorted(request.volume_context.items())),
        readonly=request.readonly,
        access_mode=capability.access_mode.mode,
        mount_group=mount.volume_mount_group,
    )


def check_bucket(name: str, connection: dict[str, Any]) -> None:
    """NotFound / AccessDenied / BackendError unless the bucket answers a one-object list, with
    the credentials and endpoint the daemon will use (the daemon checks again itself)."""
    from tierfs.storage.gcs import GcsBucket

    bucket = GcsBucket.connect(name, **connection)
    try:
        trio.run(bucket.check)
    finally:
        bucket.close()
