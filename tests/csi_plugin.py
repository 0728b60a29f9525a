"""The real CSI plugin for tests: ``tierfs csi`` on a socket in a temporary directory.

`Plugin` starts the console script exactly as the DaemonSet does (its socket,
kubelet root and state directory under the test's tmp_path), talks to it with
the generated gRPC client, as the kubelet would, and on the way out stops the
plugin by its PID and then, whatever happened, unmounts every FUSE mount left
below the kubelet root and kills its daemons by PID. An ERROR in the plugin's
log (its stderr, which its daemons share) fails the test unless expected.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import grpc
import pytest

from tests.mounting import TIERFS, require_fuse
from tierfs.cli.daemon import daemon_pids
from tierfs.cli.emulator import Emulator
from tierfs.cli.mountpoint import mounts
from tierfs.csi.proto import csi_pb2, csi_pb2_grpc

CHECKPOINTING = (
    "implicit-dirs,metadata-cache:negative-ttl-secs:0,metadata-cache:ttl-secs:-1,"
    "metadata-cache:stat-cache-max-size-mb:-1,metadata-cache:type-cache-max-size-mb:-1,"
    "file-cache:max-size-mb:-1,file-cache:cache-file-for-range-read:true,"
    "file-system:kernel-list-cache-ttl-secs:0,file-cache:enable-parallel-downloads:true,"
    "read_ahead_kb=1024,write:enable-streaming-writes:true"
)
MULTI_WRITER = csi_pb2.VolumeCapability.AccessMode.MULTI_NODE_MULTI_WRITER
START_TIMEOUT_S = 60.0


class Plugin:
    def __init__(self, emulator: Emulator, base: Path, extra_args: Sequence[str] = ()) -> None:
        self.emulator = emulator
        self.kubelet_root = base / "kubelet"
        self.state_dir = base / "state"
        self.socket = base / "csi" / "csi.sock"
        self.log = base / "plugin.log"
        self.extra_args = list(extra_args)
        self.expect_errors = False
        self.process: subprocess.Popen[bytes] | None = None
        self.channel: grpc.Channel | None = None

    def start(self) -> Plugin:
        require_fuse()
        self.kubelet_root.mkdir(parents=True, exist_ok=True)
        with open(self.log, "ab") as log:
            self.process = subprocess.Popen(
                [
                    TIERFS,
                    "csi",
                    f"--endpoint=unix://{self.socket}",
                    "--node-id=node-1",
                    f"--kubelet-root={self.kubelet_root}",
                    f"--state-dir={self.state_dir}",
                    "--log-severity=debug",
                    "--upload-timeout-s=60",
                    *self.extra_args,
                ],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=log,
            )
        deadline = time.monotonic() + START_TIMEOUT_S
        while not self.socket.exists():
            if self.process.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"tierfs csi did not start: {self.log.read_text()[-2000:]}")
            time.sleep(0.05)
        self.channel = grpc.insecure_channel(f"unix://{self.socket}")
        grpc.channel_ready_future(self.channel).result(timeout=START_TIMEOUT_S)
        return self

    @property
    def identity(self) -> csi_pb2_grpc.IdentityStub:
        return csi_pb2_grpc.IdentityStub(self.channel)

    @property
    def node(self) -> csi_pb2_grpc.NodeStub:
        return csi_pb2_grpc.NodeStub(self.channel)

    @property
    def controller(self) -> csi_pb2_grpc.ControllerStub:
        return csi_pb2_grpc.ControllerStub(self.channel)

    def target(self, pod: str = "pod-1", volume: str = "vol") -> Path:
        """A target path as the kubelet makes it (the parent exists, the target not yet)."""
        parent = self.kubelet_root / "pods" / pod / "volumes" / "kubernetes.io~csi" / volume
        parent.mkdir(parents=True, exist_ok=True)
        return parent / "mount"

    def publish_request(
        self,
        volume_id: str,
        target: Path | str,
        flags: Sequence[str] = (CHECKPOINTING,),
        *,
        attributes: dict[str, str] | None = None,
        readonly: bool = False,
        secrets: dict[str, str] | None = None,
        emulator_flags: Sequence[str] = ("anonymous-access",),
        endpoint: str = "",
        mount_group: str = "",
    ) -> csi_pb2.NodePublishVolumeRequest:
        endpoint = endpoint or self.emulator.endpoint
        mount = csi_pb2.VolumeCapability.MountVolume(
            mount_flags=[*flags, f"custom-endpoint={endpoint}", *emulator_flags],
            volume_mount_group=mount_group,
        )
        capability = csi_pb2.VolumeCapability(
            mount=mount, access_mode=csi_pb2.VolumeCapability.AccessMode(mode=MULTI_WRITER)
        )
        return csi_pb2.NodePublishVolumeRequest(
            volume_id=volume_id,
            target_path=str(target),
            volume_capability=capability,
            readonly=readonly,
            volume_context=attributes or {},
            secrets=secrets or {},
        )

    def publish(self, *args: object, **kwargs: object) -> csi_pb2.NodePublishVolumeResponse:
        request = self.publish_request(*args, **kwargs)  # type: ignore[arg-type]
        return self.node.NodePublishVolume(request, timeout=120)

    def unpublish(self, volume_id: str, target: Path | str) -> object:
        request = csi_pb2.NodeUnpublishVolumeRequest(volume_id=volume_id, target_path=str(target))
        return self.node.NodeUnpublishVolume(request, timeout=120)

    def fuse_mounts(self) -> list[str]:
        root = str(self.kubelet_root)
        return [
            m.mountpoint
            for m in mounts()
            if m.fstype.startswith("fuse") and m.mountpoint.startswith(root + "/")
        ]

    def log_text(self) -> str:
        return self.log.read_text(encoding="utf-8", errors="replace")

    def errors(self) -> list[str]:
        return [line for line in self.log_text().splitlines() if '"severity": "ERROR"' in line]

    def stop(self) -> None:
        """Stop the plugin by PID, then every mount and daemon it left (always)."""
        if self.channel is not None:
            self.channel.close()
        process = self.process
        if process is not None and process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        for mountpoint in self.fuse_mounts():
            pids = daemon_pids(mountpoint)
            subprocess.run(["fusermount3", "-u", "-z", mountpoint], check=False)
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)


@contextlib.contextmanager
def running_plugin(emulator: Emulator, base: Path, *extra_args: str) -> Iterator[Plugin]:
    plugin = Plugin(emulator, base, extra_args)
    try:
        yield plugin.start()
    finally:
        plugin.stop()
    errors = plugin.errors()
    if errors and not plugin.expect_errors:
        pytest.fail(f"unexpected errors in the plugin's log: {errors[:3]}")
