"""The CSI plugin driven over its socket as the kubelet drives it, on the emulator, mounting for
real. The checks follow csi-sanity's Identity and Node suites (names in the docstrings),
plus the publish round trip csi-sanity cannot make without a controller."""

from __future__ import annotations

import json
import os
import stat
import subprocess
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from google.cloud import storage

from tests.csi_plugin import CHECKPOINTING, Plugin, running_plugin
from tierfs.cli.daemon import daemon_pids
from tierfs.cli.emulator import Emulator
from tierfs.cli.mountpoint import device_of
from tierfs.csi.proto import csi_pb2

pytestmark = pytest.mark.mount

Code = grpc.StatusCode


@pytest.fixture
def plugin(emulator: Emulator, tmp_path: Path) -> Iterator[Plugin]:
    with running_plugin(emulator, tmp_path) as started:
        yield started


def code_of(call: object) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.RpcError) as caught:
        call()  # type: ignore[operator]
    error = caught.value
    return error.code(), error.details()  # type: ignore[attr-defined]


def test_identity_and_node_info(plugin: Plugin) -> None:
    """Identity Service: GetPluginInfo (name and version), GetPluginCapabilities, Probe;
    Node Service: NodeGetInfo, NodeGetCapabilities; ControllerGetCapabilities empty;
    the socket is 0600."""
    info = plugin.identity.GetPluginInfo(csi_pb2.GetPluginInfoRequest())
    assert info.name and "." in info.name and info.vendor_version
    capabilities = plugin.identity.GetPluginCapabilities(csi_pb2.GetPluginCapabilitiesRequest())
    assert all(c.service.type != c.service.CONTROLLER_SERVICE for c in capabilities.capabilities)
    probe = plugin.identity.Probe(csi_pb2.ProbeRequest())
    assert probe.ready.value is True
    assert plugin.node.NodeGetInfo(csi_pb2.NodeGetInfoRequest()).node_id == "node-1"
    node_caps = plugin.node.NodeGetCapabilities(csi_pb2.NodeGetCapabilitiesRequest())
    rpc = csi_pb2.NodeServiceCapability.RPC
    assert [c.rpc.type for c in node_caps.capabilities] == [rpc.VOLUME_MOUNT_GROUP]
    controller = plugin.controller.ControllerGetCapabilities(
        csi_pb2.ControllerGetCapabilitiesRequest()
    )
    assert list(controller.capabilities) == []
    assert stat.S_IMODE(plugin.socket.stat().st_mode) == 0o600
    assert stat.S_IMODE(plugin.state_dir.stat().st_mode) == 0o700


def test_publish_round_trip(plugin: Plugin, bucket_name: str, gcs_client: storage.Client) -> None:
    """Publish a PV with the GKE checkpointing line (one flag per element) and attributes;
    I/O through the target lands in the bucket; publish again is OK, other options on the
    same target ALREADY_EXISTS; unpublish removes the target and keeps the data; unpublish
    again is OK (csi-sanity: "should work" / idempotent unpublish)."""
    gcs_client.bucket(bucket_name).blob("before/a.txt").upload_from_string(b"from gcs")
    target = plugin.target()
    attributes = {
        "fileCacheCapacity": "100Mi",
        "metadataCacheTTLSeconds": "-1",
        "fileCacheForRangeRead": "true",
        "gcsfuseLoggingSeverity": "info",
        "csi.storage.k8s.io/pod.name": "trainer-0",
    }
    flags = CHECKPOINTING.split(",")
    volume_id = f"{bucket_name}:checkpoints"
    plugin.publish(volume_id, target, flags, attributes=attributes)

    assert (target / "before" / "a.txt").read_bytes() == b"from gcs"  # implicit-dirs
    (target / "step-1").mkdir()
    (target / "step-1" / "model.bin").write_bytes(b"x" * 3_000_000)
    blob = gcs_client.bucket(bucket_name).get_blob("step-1/model.bin")
    assert blob is not None and blob.size == 3_000_000
    device = device_of(str(target))
    assert Path(f"/sys/class/bdi/{device}/read_ahead_kb").read_text().strip() == "1024"
    (pid,) = daemon_pids(str(target))
    argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")
    (cache_flag,) = [a for a in argv if a.startswith("--cache-dir=")]
    cache_dir = Path(cache_flag.partition("=")[2])
    assert plugin.state_dir in cache_dir.parents
    assert stat.S_IMODE(cache_dir.parent.stat().st_mode) == 0o700
    attributes_flag = argv[argv.index("--csi-volume-attributes") + 1]
    assert json.loads(attributes_flag)["fileCacheCapacity"] == "100Mi"

    plugin.publish(volume_id, target, flags, attributes=attributes)  # the same again: OK
    assert daemon_pids(str(target)) == [pid]
    code, message = code_of(
        lambda: plugin.publish(volume_id, target, flags, attributes=attributes, readonly=True)
    )
    assert code == Code.ALREADY_EXISTS, message

    plugin.unpublish(volume_id, target)
    assert not target.exists()
    assert plugin.fuse_mounts() == []
    assert daemon_pids(str(target)) == []
    assert not cache_dir.parent.exists()
    blob = gcs_client.bucket(bucket_name).get_blob("step-1/model.bin")
    assert blob is not None and blob.size == 3_000_000
    plugin.unpublish(volume_id, target)  # not mounted: OK


def test_inline_volume_joined_line_read_only(
    plugin: Plugin, bucket_name: str, gcs_client: storage.Client
) -> None:
    """An inline ephemeral volume (bucketName, kubelet's ephemeral flag) with the checkpointing
    line as one comma-joined element, read-only: reads work, writes are refused."""
    gcs_client.bucket(bucket_name).blob("data.txt").upload_from_string(b"dataset")
    target = plugin.target(volume="inline")
    attributes = {"bucketName": bucket_name, "csi.storage.k8s.io/ephemeral": "true"}
    plugin.publish("csi-0123abcd", target, [CHECKPOINTING], attributes=attributes, readonly=True)
    assert (target / "data.txt").read_bytes() == b"dataset"
    with pytest.raises(OSError):
        (target / "new.txt").write_bytes(b"no")
    plugin.unpublish("csi-0123abcd", target)
    assert not target.exists()


def test_a_pod_running_as_another_user_in_its_fs_group_reads_and_writes(
    plugin: Plugin, bucket_name: str, gcs_client: storage.Client
) -> None:
    """A pod with ``runAsUser: 1000`` and ``fsGroup: 3000`` (the kubelet passes the group as
    the volume mount group). Before, the mount had no allow_other: the kernel let only
    root (the plugin, which mounted it) in, and the pod's every access was EACCES. (The
    pod's user reaches the target through a descriptor, as the test's own directories
    above it are root's alone.)"""
    gcs_client.bucket(bucket_name).blob("data.txt").upload_from_string(b"dataset")
    target = plugin.target(volume="nonroot")
    plugin.publish(bucket_name, target, [CHECKPOINTING], mount_group="3000")
    fd = os.open(target, os.O_RDONLY | os.O_DIRECTORY)
    try:
        here = f"/proc/self/fd/{fd}"
        result = subprocess.run(
            ["/bin/sh", "-c", f"cat {here}/data.txt && printf mine > {here}/new.txt"],
            pass_fds=(fd,),
            user=1000,
            group=3000,
            capture_output=True,
            timeout=60,
        )
    finally:
        os.close(fd)
    assert result.returncode == 0 and result.stdout == b"dataset", result.stderr
    assert gcs_client.bucket(bucket_name).blob("new.txt").download_as_bytes() == b"mine"
    plugin.unpublish(bucket_name, target)


def test_bad_requests(plugin: Plugin, bucket_name: str, tmp_path: Path) -> None:
    """csi-sanity's "should fail when no volume id / target path / volume capability is
    provided", plus options and buckets the daemon would refuse, each with one line."""
    target = plugin.target()
    good = plugin.publish_request(bucket_name, target)
    cases = {
        "volume_id": csi_pb2.NodePublishVolumeRequest(
            target_path=str(target), volume_capability=good.volume_capability
        ),
        "target_path": csi_pb2.NodePublishVolumeRequest(
            volume_id=bucket_name, volume_capability=good.volume_capability
        ),
        "volume_capability": csi_pb2.NodePublishVolumeRequest(
            volume_id=bucket_name, target_path=str(target)
        ),
    }
    for field, request in cases.items():
        code, message = code_of(lambda r=request: plugin.node.NodePublishVolume(r))
        assert (code, message) == (Code.INVALID_ARGUMENT, f"{field} is missing")
    block = csi_pb2.VolumeCapability(block=csi_pb2.VolumeCapability.BlockVolume())
    code, _ = code_of(
        lambda: plugin.node.NodePublishVolume(
            csi_pb2.NodePublishVolumeRequest(
                volume_id=bucket_name, target_path=str(target), volume_capability=block
            )
        )
    )
    assert code == Code.INVALID_ARGUMENT
    for request in (
        csi_pb2.NodeUnpublishVolumeRequest(target_path=str(target)),
        csi_pb2.NodeUnpublishVolumeRequest(volume_id=bucket_name),
    ):
        code, _ = code_of(lambda r=request: plugin.node.NodeUnpublishVolume(r))
        assert code == Code.INVALID_ARGUMENT

    code, message = code_of(lambda: plugin.publish(bucket_name, target, ["implicit-dirz"]))
    assert code == Code.INVALID_ARGUMENT and "implicit-dirz" in message and "\n" not in message
    code, message = code_of(
        lambda: plugin.publish(bucket_name, target, ["metadata-cache:ttl-secs:soon"])
    )
    assert code == Code.INVALID_ARGUMENT and "metadata-cache:ttl-secs" in message
    code, message = code_of(
        lambda: plugin.publish(bucket_name, target, attributes={"fileCacheCapacty": "1Gi"})
    )
    assert code == Code.INVALID_ARGUMENT and "fileCacheCapacity" in message
    code, message = code_of(
        lambda: plugin.publish(
            "csi-inline", target, attributes={"csi.storage.k8s.io/ephemeral": "true"}
        )
    )
    assert code == Code.INVALID_ARGUMENT and "bucketName" in message
    code, message = code_of(lambda: plugin.publish("no-such-bucket-tierfs", target))
    assert code == Code.NOT_FOUND and "no-such-bucket-tierfs" in message

    outside = tmp_path / "outside"
    outside.mkdir()
    (plugin.kubelet_root / "pods" / "escape").symlink_to(outside)
    for escaping in (
        f"{plugin.kubelet_root}/pods/../../outside/mount",
        f"{plugin.kubelet_root}/pods/escape/mount",
        "relative/mount",
    ):
        code, message = code_of(lambda t=escaping: plugin.publish(bucket_name, t))
        assert code == Code.PERMISSION_DENIED, message
        code, _ = code_of(lambda t=escaping: plugin.unpublish(bucket_name, t))
        assert code == Code.PERMISSION_DENIED
    assert list(outside.iterdir()) == []
    assert plugin.fuse_mounts() == []
    assert not target.exists()
    assert list(plugin.state_dir.glob("volumes/*")) == []


def test_daemon_restarted_when_killed(
    plugin: Plugin, bucket_name: str, gcs_client: storage.Client
) -> None:
    """A volume's daemon that dies is restarted on the same target, with an ERROR in the log."""
    from tests.mounting import wait_until

    plugin.expect_errors = True
    target = plugin.target()
    plugin.publish(bucket_name, target)
    (first,) = daemon_pids(str(target))
    os.kill(first, 9)

    def served_again() -> bool:
        pids = daemon_pids(str(target))
        return bool(pids) and pids != [first] and "restarted the daemon" in plugin.log_text()

    wait_until(served_again, "the plugin to restart the daemon")
    plugin.publish(bucket_name, target)  # the kubelet's republish of it, served again: OK
    (target / "after.txt").write_bytes(b"back")
    assert gcs_client.bucket(bucket_name).blob("after.txt").download_as_bytes() == b"back"
    assert any("exited with status" in line for line in plugin.errors())
    plugin.unpublish(bucket_name, target)
    assert plugin.fuse_mounts() == []
