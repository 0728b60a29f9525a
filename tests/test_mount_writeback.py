"""Write-back through a real mount on the emulator: close() at local speed, durable in GCS
on its own, ``tierfs sync``, a daemon killed before its uploads, renames before upload,
and a full local disk. (The core's rules: test_writeback.py.)"""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from google.cloud import storage

from tests.conftest import MountFactory
from tests.mounting import TIERFS, Mount, stats
from tierfs.emulator import Emulator

MiB = 1 << 20
HOLD = "--write-back-delay-secs=3600"  # keep uploads from starting until we say so


def tierfs_sync(mount: Mount) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [TIERFS, "sync", str(mount.path)], capture_output=True, text=True, timeout=300
    )


def objects(client: storage.Client, bucket: str) -> dict[str, bytes]:
    return {b.name: b.download_as_bytes() for b in client.list_blobs(bucket)}


def kill_daemon(mount: Mount) -> None:
    (pid,) = mount.pids()
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while os.path.exists(f"/proc/{pid}") and time.monotonic() < deadline:
        time.sleep(0.02)
    mount.expect_errors = True
    mount.unmount()  # recovers the dead mountpoint
    assert not mount.is_mounted()


def test_close_returns_before_upload_and_sync_makes_it_durable(
    mount_factory: MountFactory, gcs_client: storage.Client, bucket_name: str, tmp_path: Path
) -> None:
    mount = mount_factory("--write-back", HOLD, f"--cache-dir={tmp_path / 'cache'}")
    data = os.urandom(3 * MiB + 5)
    (mount.path / "ckpt.pt").write_bytes(data)
    assert objects(gcs_client, bucket_name) == {}  # closed, but not uploaded yet
    assert (mount.path / "ckpt.pt").read_bytes() == data  # readers see it meanwhile
    assert stats(mount)["writeback"]["pending"] == 1
    human = subprocess.run(
        [TIERFS, "stats", str(mount.path)], capture_output=True, text=True, timeout=60
    )
    assert "write-back  pending 1   committed 1   uploaded 0" in human.stdout
    result = tierfs_sync(mount)
    assert (result.returncode, result.stderr) == (0, "")
    assert objects(gcs_client, bucket_name) == {"ckpt.pt": data}
    assert stats(mount)["writeback"]["pending"] == 0


def test_uploads_happen_on_their_own(
    mount_factory: MountFactory, gcs_client: storage.Client, bucket_name: str, tmp_path: Path
) -> None:
    mount = mount_factory("--write-back", f"--cache-dir={tmp_path / 'cache'}")
    for i in range(5):
        (mount.path / f"shard-{i}").write_bytes(bytes([i]) * (MiB + i))
    deadline = time.monotonic() + 60
    while stats(mount)["writeback"]["uploaded"] < 5 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert objects(gcs_client, bucket_name) == {
        f"shard-{i}": bytes([i]) * (MiB + i) for i in range(5)
    }


def test_fsync_waits_for_gcs(
    mount_factory: MountFactory, gcs_client: storage.Client, bucket_name: str, tmp_path: Path
) -> None:
    mount = mount_factory("--write-back", HOLD, f"--cache-dir={tmp_path / 'cache'}")
    with open(mount.path / "f", "wb") as handle:
        handle.write(b"must be in GCS when fsync returns")
        handle.flush()
        os.fsync(handle.fileno())
        assert objects(gcs_client, bucket_name) == {"f": b"must be in GCS when fsync returns"}


def test_kill_9_before_upload_then_remount_uploads_every_closed_file(
    mount_factory: MountFactory, gcs_client: storage.Client, bucket_name: str, tmp_path: Path
) -> None:
    cache = f"--cache-dir={tmp_path / 'cache'}"
    mount = mount_factory("--write-back", HOLD, cache)
    closed = {
        "model.pt": os.urandom(20 * MiB + 3),
        "step_1/metadata.json": b'{"step": 1}',
        "step_1/shard-0": os.urandom(MiB),
    }
    (mount.path / "step_1").mkdir()
    for name, data in closed.items():
        (mount.path / name).write_bytes(data)
    unfinished = open(mount.path / "partial", "wb")
    unfinished.write(b"not closed")
    unfinished.flush()
    kill_daemon(mount)
    with contextlib.suppress(OSError):
        unfinished.close()
    assert set(objects(gcs_client, bucket_name)) == {"step_1/"}  # only the mkdir reached GCS
    again = mount_factory("--write-back", cache, name="mnt")
    assert objects(gcs_client, bucket_name) == {"step_1/": b"", **closed}
    assert (again.path / "model.pt").read_bytes() == closed["model.pt"]
    journal = next((tmp_path / "cache" / "tierfs-writeback").iterdir())
    assert sorted(p.name for p in journal.iterdir()) == ["conflicts"]  # nothing left over
    # A third mount finds nothing to do: nothing is uploaded twice.
    before = {b.name: b.generation for b in gcs_client.list_blobs(bucket_name)}
    again.unmount()
    third = mount_factory("--write-back", cache, name="mnt")
    assert {b.name: b.generation for b in gcs_client.list_blobs(bucket_name)} == before
    assert third.errors() == []


def test_tmp_then_rename_commits_are_local_before_upload(
    mount_factory: MountFactory, gcs_client: storage.Client, bucket_name: str, tmp_path: Path
) -> None:
    mount = mount_factory("--write-back", HOLD, f"--cache-dir={tmp_path / 'cache'}")
    tmp = mount.path / "step_100.orbax-checkpoint-tmp-1"
    tmp.mkdir()
    for i in range(20):
        (tmp / f"array_{i}").write_bytes(bytes([i]) * 1000)
    (tmp / "big").write_bytes(b"B" * (9 * MiB))
    (mount.path / ".metadata.tmp").write_bytes(b"{}")
    os.rename(mount.path / ".metadata.tmp", mount.path / ".metadata")
    os.rename(tmp, mount.path / "step_100")
    assert sorted(os.listdir(mount.path / "step_100"))[:2] == ["array_0", "array_1"]
    requests = stats(mount)["gcs"]["requests"]
    assert tierfs_sync(mount).returncode == 0
    names = set(objects(gcs_client, bucket_name))
    assert names == {
        ".metadata",
        "step_100/",
        "step_100/big",
        *(f"step_100/array_{i}" for i in range(20)),
    }
    # One upload per file (resumable for the big one), no copies or deletes of data.
    assert stats(mount)["gcs"]["requests"] - requests <= 22 + 4


@pytest.fixture
def tiny_disk(tmp_path: Path) -> Iterator[Path]:
    """A 4 MiB tmpfs for the journal: a full local disk, really."""
    path = tmp_path / "tiny"
    path.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(path)], check=True)
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


def test_full_local_disk_is_enospc_and_nothing_partial_reaches_gcs(
    mount_factory: MountFactory, gcs_client: storage.Client, bucket_name: str, tiny_disk: Path
) -> None:
    mount = mount_factory("--write-back", f"--cache-dir={tiny_disk}")
    mount.expect_errors = True  # the failed write is logged as an ERROR
    with pytest.raises(OSError) as raised:
        with open(mount.path / "too-big", "wb") as handle:
            for _ in range(8):
                handle.write(os.urandom(MiB))
                handle.flush()
    assert raised.value.errno == errno.ENOSPC
    assert tierfs_sync(mount).returncode == 0
    assert "too-big" not in objects(gcs_client, bucket_name)
    (mount.path / "small").write_bytes(b"fits")  # the mount still works
    assert tierfs_sync(mount).returncode == 0
    assert objects(gcs_client, bucket_name)["small"] == b"fits"


def test_sync_of_something_that_is_not_a_mount_is_one_line(tmp_path: Path) -> None:
    result = subprocess.run(
        [TIERFS, "sync", str(tmp_path)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 1
    assert result.stderr.startswith(f"tierfs: no tierfs mount answers at {tmp_path}: ")
    assert result.stderr.count("\n") == 1
    usage = subprocess.run([TIERFS, "sync"], capture_output=True, text=True, timeout=60)
    assert usage.returncode == 2 and "usage: tierfs sync MOUNTPOINT" in usage.stderr


def test_gcs_outage_is_reported_by_sync_and_the_upload_is_retried(tmp_path: Path) -> None:
    """GCS goes away after close(): the upload fails, is counted, `tierfs sync` says so in
    one line; GCS comes back: the next sync uploads it. Nothing is lost in between."""
    store = tmp_path / "gcs"
    store.mkdir()
    emulator = Emulator(data_dir=store).start()
    mount = Mount(
        emulator,
        "outage",
        tmp_path / "mnt",
        tmp_path / "mnt.log",
        ["--write-back", f"--cache-dir={tmp_path / 'cache'}", "--max-retry-attempts=1"],
    )
    try:
        emulator.create_bucket("outage")
        mount.start()
        mount.expect_errors = True
        port = emulator.port
        with open(mount.path / "ckpt.pt", "wb") as handle:  # (a lookup needs GCS)
            handle.write(b"kept through the outage")
            emulator.stop()
        # closed, durable locally; its upload now fails
        deadline = time.monotonic() + 60
        while stats(mount)["writeback"]["failing"] < 1 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert stats(mount)["writeback"]["failed"] >= 1
        result = tierfs_sync(mount)
        assert result.returncode == 1
        assert result.stderr.count("\n") == 1 and "1 file(s) not in GCS yet" in result.stderr
        assert (mount.path / "ckpt.pt").read_bytes() == b"kept through the outage"
        emulator = Emulator(data_dir=store, port=port).start()
        result = tierfs_sync(mount)
        assert (result.returncode, result.stderr) == (0, "")
        client = emulator.client()
        assert client.bucket("outage").blob("ckpt.pt").download_as_bytes() == (
            b"kept through the outage"
        )
        assert stats(mount)["writeback"]["failing"] == 0
    finally:
        mount.cleanup()
        emulator.stop()


def test_another_client_wins_before_the_upload_and_our_bytes_are_kept(
    mount_factory: MountFactory, gcs_client: storage.Client, bucket_name: str, tmp_path: Path
) -> None:
    mount = mount_factory("--write-back", HOLD, f"--cache-dir={tmp_path / 'cache'}")
    mount.expect_errors = True  # the conflict is logged as an ERROR
    (mount.path / "shared.json").write_bytes(b"ours")  # closed: committed, not uploaded
    gcs_client.bucket(bucket_name).blob("shared.json").upload_from_string(b"theirs")
    result = tierfs_sync(mount)
    assert result.returncode == 1 and result.stderr.count("\n") == 1
    assert objects(gcs_client, bucket_name) == {"shared.json": b"theirs"}  # not overwritten
    journal = next((tmp_path / "cache" / "tierfs-writeback").iterdir())
    kept = list((journal / "conflicts").iterdir())
    assert [p.read_bytes() for p in kept] == [b"ours"]  # and ours not lost
    assert stats(mount)["writeback"]["conflicts"] == 1


def test_unmount_uploads_pending_files_and_keeps_them_in_the_ssd_tier(
    mount_factory: MountFactory, gcs_client: storage.Client, bucket_name: str, tmp_path: Path
) -> None:
    """Unmount uploads what write-back still holds, and copies it into the SSD tier before
    the daemon exits: the next mount reads it with no GCS media request."""
    cache = f"--cache-dir={tmp_path / 'cache'}"
    mount = mount_factory("--write-back", HOLD, cache, name="save")
    data = os.urandom(3 * MiB + 5)
    (mount.path / "ckpt.pt").write_bytes(data)
    assert objects(gcs_client, bucket_name) == {}  # held back until the unmount
    result = mount.unmount()
    assert (result.returncode, result.stderr) == (0, "")
    assert objects(gcs_client, bucket_name) == {"ckpt.pt": data}
    assert mount.errors() == []
    again = mount_factory(cache, name="restore")
    assert (again.path / "ckpt.pt").read_bytes() == data
    assert stats(again)["gcs"]["media_reads"] == 0
    assert stats(again)["passthrough"]["opens"] == 1
