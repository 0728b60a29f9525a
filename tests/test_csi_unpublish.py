"""Unpublish never drops written data: past ``--upload-timeout-s`` it answers DEADLINE_EXCEEDED
and leaves the volume mounted; the kubelet's retry, once the upload is through, unmounts."""

from __future__ import annotations

import contextlib
import os
import signal
from pathlib import Path

import grpc
import pytest
from google.cloud import storage

from tests.csi_plugin import running_plugin
from tests.faults import UPLOADS, Action, FaultProxy, Rule
from tests.mounting import wait_until
from tierfs.cli.daemon import daemon_pids
from tierfs.cli.emulator import Emulator

pytestmark = pytest.mark.mount


def test_unpublish_waits_for_uploads_within_its_timeout(
    emulator: Emulator,
    bucket_name: str,
    gcs_client: storage.Client,
    fault_proxy: FaultProxy,
    tmp_path: Path,
) -> None:
    with running_plugin(emulator, tmp_path, "--upload-timeout-s=1") as plugin:
        target = plugin.target()
        flags = ["write:write-back:true"]
        plugin.publish(bucket_name, target, flags, endpoint=fault_proxy.endpoint)
        stall = fault_proxy.faults.add(
            Rule(Action(stall_s=4), method="POST", target=UPLOADS, times=1)
        )
        (target / "late.bin").write_bytes(b"y" * 100_000)  # write-back: close() returns first

        with pytest.raises(grpc.RpcError) as caught:
            plugin.unpublish(bucket_name, target)
        assert caught.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED  # type: ignore[attr-defined]
        assert "still uploading after 1 s" in caught.value.details()  # type: ignore[attr-defined]
        assert stall.fired == 1
        assert plugin.fuse_mounts() == [str(target)]  # still mounted, data still there
        assert (target / "late.bin").stat().st_size == 100_000

        for _attempt in range(30):  # as the kubelet does: retry (each waits up to 1 s)
            try:
                plugin.unpublish(bucket_name, target)
                break
            except grpc.RpcError as err:
                assert err.code() == grpc.StatusCode.DEADLINE_EXCEEDED  # type: ignore[attr-defined]
        assert not target.exists()
        assert plugin.fuse_mounts() == []
        blob = gcs_client.bucket(bucket_name).get_blob("late.bin")
        assert blob is not None and blob.size == 100_000


def test_data_an_unpublish_left_behind_is_uploaded_by_the_volumes_next_publish(
    emulator: Emulator, bucket_name: str, gcs_client: storage.Client, tmp_path: Path
) -> None:
    """A write-back volume's daemon stops answering with a closed file not in GCS yet (its
    upload waits an hour): unpublish kills it and keeps the journal. The volume's next
    publish is for a new pod, on a new target: its daemon uploads that file. Before, the
    journal was left in the old target's directory, where no daemon ever looked."""
    flags = ["write:write-back:true", "write:write-back-delay-secs:3600"]
    with running_plugin(emulator, tmp_path) as plugin:
        plugin.expect_errors = True  # (the stuck daemon killed: an ERROR line)
        first = plugin.target(pod="pod-1")
        plugin.publish(bucket_name, first, flags)
        (first / "closed.bin").write_bytes(b"closed before the daemon stuck")
        (pid,) = daemon_pids(str(first))
        os.kill(pid, signal.SIGSTOP)
        try:
            plugin.unpublish(bucket_name, first)
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        assert gcs_client.bucket(bucket_name).get_blob("closed.bin") is None
        second = plugin.target(pod="pod-2")
        plugin.publish(bucket_name, second, flags)
        blob = gcs_client.bucket(bucket_name).blob("closed.bin")
        wait_until(blob.exists, "the left data to be uploaded")
        assert blob.download_as_bytes() == b"closed before the daemon stuck"
        plugin.unpublish(bucket_name, second)
        assert list(plugin.state_dir.glob("volumes/*")) == []
