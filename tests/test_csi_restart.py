"""The plugin restarted (an upgrade, a crash): the kubelet republishes (requiresRepublish) and
the new plugin recognises each target by its record: a live mount is left alone, a dead one
(its daemon gone with the old plugin's container) is mounted again; unpublish works on both."""

from __future__ import annotations

import contextlib
import os
import signal
from pathlib import Path

import pytest
from google.cloud import storage

from tests.csi_plugin import Plugin, running_plugin
from tests.mounting import wait_until
from tierfs.cli.daemon import daemon_pids
from tierfs.cli.emulator import Emulator
from tierfs.cli.mountpoint import is_stale

pytestmark = pytest.mark.mount


def test_a_new_plugin_takes_over_its_mounts(
    emulator: Emulator, bucket_name: str, gcs_client: storage.Client, tmp_path: Path
) -> None:
    leftovers = Plugin(emulator, tmp_path)  # unmounts and kills what is left, by PID
    try:
        with running_plugin(emulator, tmp_path) as first:
            alive, dead = first.target(volume="alive"), first.target(volume="dead")
            first.publish("vol-alive", alive, [], attributes={"bucketName": bucket_name})
            first.publish("vol-dead", dead, [], attributes={"bucketName": bucket_name})
            (kept,) = daemon_pids(str(alive))
            (killed,) = daemon_pids(str(dead))
            # The old plugin goes (its daemons run in their own sessions; in a container they
            # would die with it: one of them does here).
            assert first.process is not None
            first.process.send_signal(signal.SIGTERM)
            assert first.process.wait(timeout=30) == 0
            os.kill(killed, signal.SIGKILL)
            wait_until(lambda: is_stale(str(dead)), "the killed daemon's mount to be dead")
            # Keep the mounts for the next plugin: this one's cleanup must not unmount them.
            first.fuse_mounts = lambda: []  # type: ignore[method-assign]

        with running_plugin(emulator, tmp_path) as second:
            second.publish("vol-alive", alive, [], attributes={"bucketName": bucket_name})
            assert daemon_pids(str(alive)) == [kept]
            second.publish("vol-dead", dead, [], attributes={"bucketName": bucket_name})
            assert not is_stale(str(dead))
            (dead / "again.txt").write_bytes(b"remounted")
            assert (
                gcs_client.bucket(bucket_name).blob("again.txt").download_as_bytes() == b"remounted"
            )
            for volume_id, target in (("vol-alive", alive), ("vol-dead", dead)):
                second.unpublish(volume_id, target)
                assert not target.exists()
            assert second.fuse_mounts() == []
            assert daemon_pids(str(alive)) == []
    finally:
        leftovers.stop()


def test_a_new_plugin_replaces_a_mount_whose_daemon_hangs(
    emulator: Emulator, bucket_name: str, gcs_client: storage.Client, tmp_path: Path
) -> None:
    """The old plugin went and left a write-back volume's daemon alive but not answering
    (stopped). The new plugin's republish kills it and mounts again. Before, it was only
    unmounted: the hung daemon kept its journal's lock, and every new daemon refused it
    failed the republish."""
    leftovers, stopped = Plugin(emulator, tmp_path), 0
    try:
        with running_plugin(emulator, tmp_path) as first:
            hung = first.target(volume="hung")
            first.publish("vol-hung", hung, ["write-back"], attributes={"bucketName": bucket_name})
            (stopped,) = daemon_pids(str(hung))
            assert first.process is not None
            first.process.send_signal(signal.SIGTERM)
            assert first.process.wait(timeout=30) == 0
            os.kill(stopped, signal.SIGSTOP)
            first.fuse_mounts = lambda: []  # type: ignore[method-assign]

        with running_plugin(emulator, tmp_path) as second:
            second.expect_errors = True  # (the hung daemon killed: an ERROR line)
            second.publish("vol-hung", hung, ["write-back"], attributes={"bucketName": bucket_name})
            wait_until(lambda: not Path(f"/proc/{stopped}").exists(), "the hung daemon to go")
            (hung / "again.txt").write_bytes(b"remounted")
            second.unpublish("vol-hung", hung)
            blob = gcs_client.bucket(bucket_name).blob("again.txt")
            assert blob.download_as_bytes() == b"remounted"
    finally:
        if stopped:
            with contextlib.suppress(ProcessLookupError):
                os.kill(stopped, signal.SIGKILL)
        leftovers.stop()
