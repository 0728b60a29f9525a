"""Write-back through a real mount on the emulator: close() at local speed, durable in GCS
on its own, ``tierfs sync``, a daemon killed before its uploads, renames before upload,
and a full local disk. (The core's rules: test_writeback.py.)"""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import stat
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from google.cloud import storage

from tests.conftest import MountFactory
from tests.mounting import TIERFS, Mount, stats, wait_until
from tierfs.cli.emulator import Emulator
from tierfs.core.writeback import Journal

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


def test_fsync_is_durable_locally_and_asks_gcs_nothing(
    mount_factory: MountFactory, gcs_client: storage.Client, bucket_name: str, tmp_path: Path
) -> None:
    mount = mount_factory("--write-back", f"--cache-dir={tmp_path / 'cache'}")
    with open(mount.path / "f", "wb") as handle:
        handle.write(b"durable here when fsync returns")
        handle.flush()
        os.fsync(handle.fileno())
        numbers = stats(mount)  # the control socket, not GCS
        records = Journal(tmp_path / "cache", bucket_name, lock=False).pending()
        assert len(records) == 1  # the journal record is on disk (the data was fsync'd)
        os.fsync(handle.fileno())
        assert stats(mount)["gcs"]["requests"] == numbers["gcs"]["requests"]
        assert objects(gcs_client, bucket_name) == {}  # the upload waits for the last close
    assert tierfs_sync(mount).returncode == 0
    assert objects(gcs_client, bucket_name) == {"f": b"durable here when fsync returns"}


def test_sync_of_a_directory_uploads_what_is_below_it(
    mount_factory: MountFactory, gcs_client: storage.Client, bucket_name: str, tmp_path: Path
) -> None:
    mount = mount_factory("--write-back", HOLD, f"--cache-dir={tmp_path / 'cache'}")
    for directory in ("step_1", "step_10"):
        (mount.path / directory).mkdir()
        (mount.path / directory / "shard").write_bytes(directory.encode())
    result = subprocess.run(
        [TIERFS, "sync", str(mount.path / "step_1")], capture_output=True, text=True, timeout=300
    )
    assert (result.returncode, result.stderr) == (0, "")
    uploaded = {k: v for k, v in objects(gcs_client, bucket_name).items() if not k.endswith("/")}
    assert uploaded == {"step_1/shard": b"step_1"}
    assert "step_1/" in objects(gcs_client, bucket_name)  # its placeholder went up with it
    assert stats(mount)["writeback"]["pending"] == 2  # step_10/ (a placeholder) and its shard


def test_fsync_to_gcs_waits_for_gcs(
    mount_factory: MountFactory, gcs_client: storage.Client, bucket_name: str, tmp_path: Path
) -> None:
    mount = mount_factory(
        "--write-back", HOLD, "--fsync-to-gcs", f"--cache-dir={tmp_path / 'cache'}"
    )
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
    assert objects(gcs_client, bucket_name) == {}  # even the mkdir is a journal record
    again = mount_factory("--write-back", cache, name="mnt")
    assert objects(gcs_client, bucket_name) == {"step_1/": b"", **closed}
    assert (again.path / "model.pt").read_bytes() == closed["model.pt"]
    journal = next((tmp_path / "cache" / "tierfs-writeback").iterdir())
    assert sorted(p.name for p in journal.iterdir()) == [
        "conflicts",
        "deletes",
        "journal.lock",
        "moves",
    ]
    assert list((journal / "moves").iterdir()) == []  # nothing left over
    # A third mount finds nothing to do: nothing is uploaded twice.
    before = {b.name: b.generation for b in gcs_client.list_blobs(bucket_name)}
    again.unmount()
    third = mount_factory("--write-back", cache, name="mnt")
    assert {b.name: b.generation for b in gcs_client.list_blobs(bucket_name)} == before
    assert third.errors() == []


def test_a_log_renamed_while_open_keeps_its_bytes_across_a_kill_9(
    mount_factory: MountFactory, gcs_client: storage.Client, bucket_name: str, tmp_path: Path
) -> None:
    """Log rotation: a file in GCS, appended to, renamed while still open, then the daemon
    killed. The rename journals the delete of the old object, so it must journal the
    file's bytes under the new name too: before, the next mount deleted ``app.log`` and
    dropped the unrecorded data file, and the log was gone under both names."""
    gcs_client.bucket(bucket_name).blob("app.log").upload_from_string(b"old lines\n")
    cache = f"--cache-dir={tmp_path / 'cache'}"
    mount = mount_factory("--write-back", HOLD, cache)
    log = open(mount.path / "app.log", "ab")  # closed after the kill
    log.write(b"new lines\n")
    log.flush()
    os.rename(mount.path / "app.log", mount.path / "app.log.1")
    kill_daemon(mount)
    with contextlib.suppress(OSError):
        log.close()
    again = mount_factory("--write-back", cache, name="mnt")
    assert objects(gcs_client, bucket_name) == {"app.log.1": b"old lines\nnew lines\n"}
    assert again.errors() == []


def test_a_file_removed_while_open_stays_removed_across_a_kill_9(
    mount_factory: MountFactory, gcs_client: storage.Client, bucket_name: str, tmp_path: Path
) -> None:
    """A scratch file closed (upload pending), still open in a reader, removed, then the
    daemon killed: its journal record outlived the name for the reader's sake, and the
    next mount uploaded the removed file again."""
    cache = f"--cache-dir={tmp_path / 'cache'}"
    mount = mount_factory("--write-back", HOLD, cache)
    (mount.path / "scratch").write_bytes(b"temporary")
    reader = open(mount.path / "scratch", "rb")  # closed after the kill
    (mount.path / "scratch").unlink()
    assert reader.read() == b"temporary"
    kill_daemon(mount)
    with contextlib.suppress(OSError):
        reader.close()
    again = mount_factory("--write-back", cache, name="mnt")
    assert objects(gcs_client, bucket_name) == {}
    assert not (again.path / "scratch").exists()


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


@contextlib.contextmanager
def tmpfs(path: Path, size: str) -> Iterator[Path]:
    """A tmpfs of ``size`` on the new directory ``path``, taken off at the end."""
    path.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], check=True)
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


@pytest.fixture
def tiny_disk(tmp_path: Path) -> Iterator[Path]:
    """A 4 MiB tmpfs for the journal: a full local disk, really."""
    with tmpfs(tmp_path / "tiny", "4m") as path:
        yield path


def write_too_much(path: Path) -> int | None:
    """Write 8 MiB to ``path`` (more than a tiny disk holds); the errno it failed with."""
    try:
        with open(path, "wb") as handle:
            for _ in range(8):
                handle.write(os.urandom(MiB))
                handle.flush()
    except OSError as err:
        return err.errno
    return None


def test_full_local_disk_is_enospc_and_nothing_partial_reaches_gcs(
    mount_factory: MountFactory, gcs_client: storage.Client, bucket_name: str, tiny_disk: Path
) -> None:
    mount = mount_factory("--write-back", f"--cache-dir={tiny_disk}")
    mount.expect_errors = True  # the failed write is logged as an ERROR
    assert write_too_much(mount.path / "too-big") == errno.ENOSPC
    assert tierfs_sync(mount).returncode == 0
    assert "too-big" not in objects(gcs_client, bucket_name)
    (mount.path / "small").write_bytes(b"fits")  # the mount still works
    assert tierfs_sync(mount).returncode == 0
    assert objects(gcs_client, bucket_name)["small"] == b"fits"


def test_a_write_back_dir_of_its_own_holds_the_journal_and_bounds_it(
    mount_factory: MountFactory,
    gcs_client: storage.Client,
    bucket_name: str,
    tiny_disk: Path,
    tmp_path: Path,
) -> None:
    """`write:write-back-dir` on a tmpfs (multi-tier checkpointing's RAM tier): the files
    waiting for GCS live there, not in cache-dir; its size bounds them (ENOSPC for the
    writer, nothing partial in GCS); a daemon killed meanwhile loses nothing."""
    cache = tmp_path / "cache"
    options = ("--write-back", f"--write-back-dir={tiny_disk}", f"--cache-dir={cache}")
    mount = mount_factory(*options, "--write-back-delay-secs=3600")
    mount.expect_errors = True  # the failed write is logged as an ERROR
    data = os.urandom(MiB)
    (mount.path / "waits").write_bytes(data)
    journal = [p for p in tiny_disk.rglob("*") if p.is_file() and p.stat().st_size == MiB]
    assert len(journal) == 1, "the file waiting for GCS is not in write-back-dir"
    assert not list(cache.rglob("tierfs-writeback"))
    assert write_too_much(mount.path / "too-big") == errno.ENOSPC
    kill_daemon(mount)
    again = mount_factory(*options, name="restart")
    assert tierfs_sync(again).returncode == 0
    assert objects(gcs_client, bucket_name) == {"waits": data}
    assert (again.path / "waits").read_bytes() == data


def test_sync_through_a_symlink_uploads_what_it_points_to(
    mount_factory: MountFactory, gcs_client: storage.Client, bucket_name: str, tmp_path: Path
) -> None:
    """``~/data -> /mnt/gcs/data``: `tierfs sync ~/data` waits for the files below the
    directory it points to (it sent "../data", which matched nothing, and said yes)."""
    mount = mount_factory("--write-back", HOLD, f"--cache-dir={tmp_path / 'cache'}")
    (mount.path / "step_1").mkdir()
    (mount.path / "step_1" / "shard").write_bytes(b"step_1")
    link = tmp_path / "latest"
    link.symlink_to(mount.path / "step_1")
    result = subprocess.run(
        [TIERFS, "sync", str(link)], capture_output=True, text=True, timeout=300
    )
    assert (result.returncode, result.stderr) == (0, "")
    uploaded = {k: v for k, v in objects(gcs_client, bucket_name).items() if not k.endswith("/")}
    assert uploaded == {"step_1/shard": b"step_1"}


def test_sync_of_something_that_is_not_a_mount_is_one_line(tmp_path: Path) -> None:
    result = subprocess.run(
        [TIERFS, "sync", str(tmp_path)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 1
    assert result.stderr.startswith(f"tierfs: no tierfs mount answers at {tmp_path}: ")
    assert result.stderr.count("\n") == 1
    usage = subprocess.run([TIERFS, "sync"], capture_output=True, text=True, timeout=60)
    assert usage.returncode == 2 and "usage: tierfs sync PATH" in usage.stderr


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


def test_a_saved_file_is_written_to_local_disk_once_and_restored_from_it(
    mount_factory: MountFactory, gcs_client: storage.Client, bucket_name: str, tmp_path: Path
) -> None:
    """At the defaults of a write-back mount with a cache dir, a checkpoint's journal file
    becomes the SSD tier's copy once uploaded (renamed, not copied: no block is written
    into the tier), and the next mount reads it from there, handed to the kernel."""
    cache = f"--cache-dir={tmp_path / 'cache'}"
    mount = mount_factory("--write-back", cache, name="save")
    data = os.urandom(3 * MiB + 5)
    (mount.path / "ckpt.pt").write_bytes(data)
    assert tierfs_sync(mount).returncode == 0
    assert objects(gcs_client, bucket_name) == {"ckpt.pt": data}
    deadline = time.monotonic() + 30
    while (ssd := stats(mount)["data"]["tiers"]["ssd"])["adopted"] < 1:
        assert time.monotonic() < deadline, f"the SSD tier never took the file: {ssd}"
        time.sleep(0.05)
    assert ssd["bytes_written"] == 0
    result = mount.unmount()
    assert (result.returncode, result.stderr) == (0, "")
    assert mount.errors() == []
    again = mount_factory(cache, name="restore")
    assert (again.path / "ckpt.pt").read_bytes() == data
    assert stats(again)["gcs"]["media_reads"] == 0
    assert stats(again)["passthrough"]["opens"] == 1


@pytest.mark.parametrize(
    "mode",
    [
        pytest.param(["--write-back"], id="write-back"),
        pytest.param([], id="streaming"),  # the default
        pytest.param(["--enable-streaming-writes=false"], id="staged"),
    ],
)
def test_a_forked_child_or_a_dup_closing_never_publishes_a_partial_file(
    mount_factory: MountFactory,
    gcs_client: storage.Client,
    bucket_name: str,
    tmp_path: Path,
    mode: list[str],
) -> None:
    """DataLoader workers and subprocesses inherit the checkpoint's fd; their exit (and the
    close of a dup'd fd) is a FLUSH. No such FLUSH publishes: while the parent still writes,
    the bucket stays empty, and the object appears whole at the last close (write-back:
    uploaded after the last release, here by tierfs sync)."""
    mount = mount_factory(*mode, f"--cache-dir={tmp_path / 'cache'}")
    write_back = "--write-back" in mode
    chunk = os.urandom(MiB)
    with open(mount.path / "ckpt.pt", "wb") as handle:
        handle.write(chunk * 8)
        handle.flush()
        pid = os.fork()
        if pid == 0:
            os._exit(0)  # the child's exit closes its copy of the fd
        assert os.waitpid(pid, 0)[1] == 0
        os.close(os.dup(handle.fileno()))
        if write_back:
            assert stats(mount)["writeback"]["committed"] >= 1  # both flushes arrived
        else:
            # The child's, the dup's, and the exec of `tierfs stats` itself (an exec closes
            # the fds marked close-on-exec, each a FLUSH: any subprocess started meanwhile).
            assert stats(mount)["flushes_held"] == 3
        deadline = time.monotonic() + 1.0  # an upload at a flush starts within milliseconds
        written = 8
        while time.monotonic() < deadline:
            time.sleep(0.05)  # not a TTL: the time an upload of the bug would take to show
            if written < 16:
                handle.write(chunk)
                handle.flush()
                written += 1
            assert list(gcs_client.list_blobs(bucket_name)) == [], "a partial object appeared"
    if write_back:
        assert tierfs_sync(mount).returncode == 0
    assert objects(gcs_client, bucket_name) == {"ckpt.pt": chunk * written}
    assert stats(mount)["gcs"]["uploads"] == 1
    assert mount.errors() == []


def test_a_subprocess_that_outlives_the_writer_does_not_hold_the_upload_back(
    mount_factory: MountFactory, gcs_client: storage.Client, bucket_name: str
) -> None:
    """Without write-back, the writer's own close() uploads even while a child it started
    still holds the fd (close() is where gcsfuse reports upload errors); the child's exit
    later uploads nothing more."""
    mount = mount_factory()
    data = os.urandom(3 * MiB)
    with open(mount.path / "out.bin", "wb") as handle:
        handle.write(data)
        child = subprocess.Popen(["sleep", "30"], pass_fds=[handle.fileno()])
    try:
        assert objects(gcs_client, bucket_name) == {"out.bin": data}  # at close()
    finally:
        child.kill()
        child.wait()
    assert stats(mount)["gcs"]["uploads"] == 1
    assert stats(mount)["flushes_held"] == 1  # the child's exit, after the upload


def orbax_tree(root: Path) -> dict[str, bytes]:
    """An Orbax-shaped step under ``root``: nested array directories of small files (zarr
    chunks, .zarray metadata) and a few larger ones. Relative names -> bytes written."""
    files: dict[str, bytes] = {}
    for layer in range(3):
        for param in ("kernel", "bias"):
            for chunk in range(4):
                files[f"params/layer_{layer}/{param}/{chunk}.0"] = os.urandom(4096 + chunk)
            files[f"params/layer_{layer}/{param}/.zarray"] = b'{"chunks": [4]}'
    files["opt_state/mu.bin"] = os.urandom(3 * MiB + 1)
    files["_METADATA"] = b'{"tree": "..."}'
    for name, data in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    return files


def test_orbax_save_renames_its_tmp_step_at_the_defaults(
    mount_factory: MountFactory, gcs_client: storage.Client, bucket_name: str, tmp_path: Path
) -> None:
    """Write-back at the default delay (uploads start at each close) and the default
    rename-dir-limit (0): the tmp step directory, nested and partly uploaded, is renamed."""
    mount = mount_factory("--write-back", f"--cache-dir={tmp_path / 'cache'}")
    tmp = mount.path / "step_100.orbax-checkpoint-tmp-0"
    files = orbax_tree(tmp)
    os.rename(tmp, mount.path / "step_100")
    final = mount.path / "step_100"
    assert not tmp.exists()
    for name, data in files.items():  # the final tree at once, from this mount
        assert (final / name).read_bytes() == data, name
    assert tierfs_sync(mount).returncode == 0
    in_gcs = objects(gcs_client, bucket_name)
    assert {k: v for k, v in in_gcs.items() if not k.endswith("/")} == {
        f"step_100/{name}": data for name, data in files.items()
    }
    assert not [k for k in in_gcs if "tmp" in k]
    assert stats(mount)["writeback"]["failed"] == 0


@pytest.mark.parametrize("options", [(), ("--stat-cache-ttl=0",)])
def test_a_step_renamed_over_an_empty_directory_in_gcs_is_seen_and_kept(
    mount_factory: MountFactory,
    gcs_client: storage.Client,
    bucket_name: str,
    tmp_path: Path,
    options: tuple[str, ...],
) -> None:
    """``step_100/`` is in GCS and empty (another client made it); a write-back save writes
    its tmp step and renames it over it (implicit dirs off, gcsfuse's default). Before, the
    old placeholder's delete was journaled under the very name the step moved to: the step
    was hidden until it ran, and with no generation known (no metadata cache) it deleted
    the copied placeholder: the checkpoint invisible to every client."""
    gcs_client.bucket(bucket_name).blob("step_100/").upload_from_string(b"")
    mount = mount_factory("--write-back", f"--cache-dir={tmp_path / 'cache'}", *options)
    assert os.listdir(mount.path / "step_100") == []
    tmp = mount.path / "step_100.tmp"
    tmp.mkdir()
    (tmp / "shard").write_bytes(b"s" * 1000)
    os.rename(tmp, mount.path / "step_100")
    assert os.listdir(mount.path / "step_100") == ["shard"]
    assert sorted(os.listdir(mount.path)) == ["step_100"]
    assert tierfs_sync(mount).returncode == 0
    assert sorted(objects(gcs_client, bucket_name)) == ["step_100/", "step_100/shard"]
    again = mount_factory(name="again")
    assert (again.path / "step_100" / "shard").read_bytes() == b"s" * 1000


@contextlib.contextmanager
def over_a_slow_link(
    emulator: Emulator,
    gcs_client: storage.Client,
    bucket_name: str,
    tree: dict[str, bytes],
    delay_s: float = 0.05,
) -> Iterator[str]:
    """Put ``tree`` (and the placeholder ``t/``) in the bucket; yield the endpoint of a
    GCS-shaped link to the emulator (+``delay_s`` a request), so that moving it takes a
    while."""
    from benchmarks.shaping import ShapingProxy

    bucket = gcs_client.bucket(bucket_name)
    for name, data in {"t/": b"", **tree}.items():
        bucket.blob(name).upload_from_string(data)
    port = int(emulator.endpoint.rsplit(":", 1)[1].strip("/"))
    proxy = ShapingProxy(("127.0.0.1", port), delay_s=delay_s, rate_bytes_s=1e9).start()
    try:
        yield proxy.endpoint
    finally:
        proxy.stop()


@contextlib.contextmanager
def t_renamed_over_a_slow_link(
    mount_factory: MountFactory,
    emulator: Emulator,
    gcs_client: storage.Client,
    bucket_name: str,
    tree: dict[str, bytes],
    cache: str,
) -> Iterator[Mount]:
    """A write-back mount (``cache``: its --cache-dir flag) of ``tree`` over a slow link,
    its ``t`` just renamed to ``final``: the objects are still moving."""
    with over_a_slow_link(emulator, gcs_client, bucket_name, tree) as endpoint:
        mount = mount_factory(
            "--write-back", "--implicit-dirs", cache, f"--custom-endpoint={endpoint}"
        )
        os.rename(mount.path / "t", mount.path / "final")
        yield mount


@pytest.mark.parametrize("when", ["journaled", "copying", "deleting"])
def test_kill_9_during_a_directory_rename_is_finished_by_the_next_mount(
    mount_factory: MountFactory,
    emulator: Emulator,
    gcs_client: storage.Client,
    bucket_name: str,
    tmp_path: Path,
    when: str,
) -> None:
    """rename() returns before the objects move (the new tree meanwhile: the read test
    below). A GCS-shaped link (+50 ms a request) makes the copies and deletes of 128 objects
    take a second or two, so the daemon is killed while they run: right after the rename
    returned (its record durable), with half of the copies made, or with half of the
    sources deleted. The next mount finishes the move."""
    tree = {f"t/d{i % 4}/f{i}": str(i).encode() * 100 for i in range(128)}
    cache = f"--cache-dir={tmp_path / 'cache'}"
    moves = tmp_path / "cache" / "tierfs-writeback"
    with t_renamed_over_a_slow_link(
        mount_factory, emulator, gcs_client, bucket_name, tree, cache
    ) as mount:
        if when == "journaled":
            kill_daemon(mount)
        else:
            deadline = time.monotonic() + 60

            def reached() -> bool:
                if when == "copying":
                    return len(list(gcs_client.list_blobs(bucket_name, prefix="final/"))) >= 64
                return len(list(gcs_client.list_blobs(bucket_name, prefix="t/"))) <= 64

            while not reached():
                assert time.monotonic() < deadline, "the move never got there"
                time.sleep(0.005)
            kill_daemon(mount)
    assert list(moves.rglob("moves/*.json")), "killed after the move ended: nothing tested"
    again = mount_factory("--write-back", "--implicit-dirs", cache, name="mnt")
    expected = {"final/" + name[2:]: data for name, data in tree.items()}
    assert objects(gcs_client, bucket_name) == {"final/": b"", **expected}
    assert (again.path / "final" / "d1" / "f5").read_bytes() == tree["t/d1/f5"]
    assert not (again.path / "t").exists()
    assert list(moves.rglob("moves/*.json")) == []


def test_a_rename_replayed_later_leaves_another_clients_new_objects_in_place(
    mount_factory: MountFactory,
    emulator: Emulator,
    gcs_client: storage.Client,
    bucket_name: str,
    tmp_path: Path,
) -> None:
    """The daemon is killed while a directory rename moves its objects; before the next
    mount another client writes under the old name, a new object and a new generation of
    one not yet moved. The replay moved everything it then listed there, theirs too (and
    deleted theirs where they put them). It moves what the rename found, and leaves
    theirs be."""
    tree = {f"t/f{i:03d}": str(i).encode() * 100 for i in range(128)}
    cache = f"--cache-dir={tmp_path / 'cache'}"
    moves = tmp_path / "cache" / "tierfs-writeback"
    with t_renamed_over_a_slow_link(
        mount_factory, emulator, gcs_client, bucket_name, tree, cache
    ) as mount:
        wait_until(lambda: bool(list(moves.rglob("moves/*.listed"))), what="the move's listing")
        kill_daemon(mount)
    at_kill = objects(gcs_client, bucket_name)
    left = sorted(name for name in at_kill if name.startswith("t/f"))
    assert left, "killed after the move ended: nothing tested"
    bucket = gcs_client.bucket(bucket_name)
    bucket.blob("t/theirs").upload_from_string(b"written since")
    bucket.blob(left[-1]).upload_from_string(b"replaced since")
    again = mount_factory("--write-back", "--implicit-dirs", cache, name="mnt")
    # The replaced one stays theirs; under the new name only if it was copied before the kill.
    expected = {
        "final/" + name[2:]: data
        for name, data in tree.items()
        if name != left[-1] or "final/" + name[2:] in at_kill
    }
    assert objects(gcs_client, bucket_name) == {
        "final/": b"",
        **expected,
        "t/theirs": b"written since",
        left[-1]: b"replaced since",
    }
    assert (again.path / "t" / "theirs").read_bytes() == b"written since"
    assert list(moves.rglob("moves/*")) == []


def test_files_read_while_their_directory_rename_moves_them_read_whole(
    mount_factory: MountFactory,
    emulator: Emulator,
    gcs_client: storage.Client,
    bucket_name: str,
    tmp_path: Path,
) -> None:
    """Reads from 8 threads over a tree whose objects are being moved (each read finds its
    object under the old name, the new one, or both): every byte right, no ESTALE."""
    import concurrent.futures

    tree = {f"t/d{i % 8}/f{i}": os.urandom(1000 + i) for i in range(200)}
    cache = f"--cache-dir={tmp_path / 'cache'}"
    with over_a_slow_link(emulator, gcs_client, bucket_name, tree) as endpoint:
        mount = mount_factory(
            "--write-back", "--implicit-dirs", cache, f"--custom-endpoint={endpoint}"
        )
        for name in list(tree)[::2]:  # half of them known to the mount before the rename
            assert (mount.path / name).stat().st_size == len(tree[name])
        os.rename(mount.path / "t", mount.path / "final")
        assert not (mount.path / "t").exists()
        assert sorted(os.listdir(mount.path)) == ["final"]
        assert sorted(os.listdir(mount.path / "final" / "d1")) == sorted(
            name.rsplit("/", 1)[1] for name in tree if name.startswith("t/d1/")
        )

        def read(name: str) -> bool:
            return (mount.path / "final" / name[2:]).read_bytes() == tree[name]

        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            assert all(pool.map(read, tree))
        assert tierfs_sync(mount).returncode == 0
    assert not [b.name for b in gcs_client.list_blobs(bucket_name, prefix="t/")]
    assert mount.errors() == []


def test_a_background_rename_lets_changes_to_its_tree_wait_and_sync_waits_for_it(
    mount_factory: MountFactory,
    emulator: Emulator,
    gcs_client: storage.Client,
    bucket_name: str,
    tmp_path: Path,
) -> None:
    """While a directory rename moves its objects: a new file, an unlink and a nested
    rename in the new tree wait for the move and then happen; `tierfs sync` returns once
    the objects are moved; nothing is left under the old name."""
    tree = {f"t/d{i % 2}/f{i}": str(i).encode() * 50 for i in range(32)}
    cache = f"--cache-dir={tmp_path / 'cache'}"
    # +300 ms a request: the move lasts seconds, longer than `tierfs stats` takes to start
    # and answer on a loaded machine (at +50 ms it once ended first: moving was 0).
    with over_a_slow_link(emulator, gcs_client, bucket_name, tree, delay_s=0.3) as endpoint:
        mount = mount_factory(
            "--write-back", "--implicit-dirs", cache, f"--custom-endpoint={endpoint}"
        )
        os.rename(mount.path / "t", mount.path / "final")
        assert stats(mount)["writeback"]["moving"] == 1
        (mount.path / "final" / "new.txt").write_bytes(b"new")
        os.unlink(mount.path / "final" / "d0" / "f0")
        os.rename(mount.path / "final" / "d1", mount.path / "final" / "one")
        assert tierfs_sync(mount).returncode == 0
        assert stats(mount)["writeback"]["moving"] == 0
    expected = {
        "final/" + name[2:].replace("d1/", "one/"): data
        for name, data in tree.items()
        if name != "t/d0/f0"
    }
    in_gcs = objects(gcs_client, bucket_name)
    assert {k: v for k, v in in_gcs.items() if not k.endswith("/")} == {
        **expected,
        "final/new.txt": b"new",
    }
    assert not [name for name in in_gcs if name.startswith("t/")]
    assert stats(mount)["writeback"]["move_errors"] == 0


def test_creates_in_a_directory_this_mount_made_ask_gcs_nothing(
    mount_factory: MountFactory, gcs_client: storage.Client, bucket_name: str, tmp_path: Path
) -> None:
    """The kernel looks every new name up first; in a directory this mount made, the answer
    (ENOENT) comes from the mount's own table. Everything else still asks GCS."""
    # Two levels down: the root's listing has old/ listed ahead, not old/deeper/.
    gcs_client.bucket(bucket_name).blob("old/deeper/kept").upload_from_string(b"from before")
    mount = mount_factory(
        "--write-back", HOLD, "--implicit-dirs", f"--cache-dir={tmp_path / 'cache'}"
    )
    (mount.path / "step_1").mkdir()
    before = stats(mount)["gcs"]
    for i in range(40):
        (mount.path / "step_1" / f"shard_{i}").write_bytes(b"s" * i)
    (mount.path / "step_1" / "sub").mkdir()
    (mount.path / "step_1" / "sub" / "x").write_bytes(b"x")
    os.rename(mount.path / "step_1" / "shard_0", mount.path / "step_1" / "shard_00")
    assert not (mount.path / "step_1" / "missing").exists()
    after = stats(mount)["gcs"]
    assert (after["stats"], after["lists"]) == (before["stats"], before["lists"])
    kept = mount.path / "old" / "deeper" / "kept"
    assert kept.read_bytes() == b"from before"  # not owned: asked
    asked = stats(mount)["gcs"]
    assert asked["stats"] + asked["lists"] > after["stats"] + after["lists"]
    assert tierfs_sync(mount).returncode == 0
    names = set(objects(gcs_client, bucket_name))
    assert {"step_1/shard_00", "step_1/shard_39", "step_1/sub/x"} <= names
    assert "step_1/shard_0" not in names


def test_mkdir_rmdir_and_rename_of_new_directories_ask_gcs_nothing(
    mount_factory: MountFactory, gcs_client: storage.Client, bucket_name: str, tmp_path: Path
) -> None:
    """With write-back a placeholder is a journal record uploaded with the files: mkdir -p,
    rmdir and a rename of directories this mount made cost no GCS request, and the bucket
    ends with the final names only."""
    cache = f"--cache-dir={tmp_path / 'cache'}"
    mount = mount_factory("--write-back", HOLD, cache)
    (mount.path / "top").mkdir()
    before = stats(mount)["gcs"]["requests"]
    (mount.path / "top" / "tmp" / "b" / "gone").mkdir(parents=True)
    (mount.path / "top" / "tmp" / "b" / "gone").rmdir()
    (mount.path / "top" / "tmp" / "b" / "f").write_bytes(b"f")
    os.rename(mount.path / "top" / "tmp", mount.path / "top" / "final")
    # One listing: the rename asks what of the tree is in GCS already (nothing).
    assert stats(mount)["gcs"]["requests"] - before <= 1
    assert sorted(os.listdir(mount.path / "top" / "final" / "b")) == ["f"]
    assert objects(gcs_client, bucket_name) == {}
    kill_daemon(mount)  # the placeholders and the file are journal records only
    again = mount_factory("--write-back", cache, name="mnt")
    assert objects(gcs_client, bucket_name) == {
        "top/": b"",
        "top/final/": b"",
        "top/final/b/": b"",
        "top/final/b/f": b"f",
    }
    assert (again.path / "top" / "final" / "b" / "f").read_bytes() == b"f"


def test_a_save_of_more_files_than_the_usual_open_file_limit(
    emulator: Emulator, gcs_client: storage.Client, bucket_name: str, tmp_path: Path
) -> None:
    """Started with the soft limit many systems give (1,024 open files; here 256, hard
    limit higher), a write-back save of 600 files held for upload still creates every one:
    the daemon raises its soft limit to the hard one."""
    mount = Mount(emulator, bucket_name, tmp_path / "mnt", tmp_path / "mnt.log",
                  ["--write-back", HOLD, f"--cache-dir={tmp_path / 'cache'}"])  # fmt: skip
    command = ["prlimit", "--nofile=256:20000", "--", *mount.command()]
    mount.path.mkdir()
    try:
        result = subprocess.run(command, capture_output=True, text=True, timeout=120)
        assert result.returncode == 0, result.stderr
        mount.mounted = True
        (mount.path / "step").mkdir()
        for i in range(600):
            (mount.path / "step" / f"f{i}").write_bytes(b"x")
        assert stats(mount)["staging_errors"] == 0
        assert tierfs_sync(mount).returncode == 0
        assert len(list(gcs_client.list_blobs(bucket_name, prefix="step/"))) == 601
    finally:
        mount.cleanup()


def test_rm_rf_of_a_tree_in_gcs_is_local_and_a_kill_9_loses_no_delete(
    mount_factory: MountFactory, gcs_client: storage.Client, bucket_name: str, tmp_path: Path
) -> None:
    """Removing an old step (Orbax's max_to_keep) while the next one is being written,
    with write-back: each unlink returns once its delete is journaled, and the tree is gone
    from the mount at once. The deletes yield to the save in progress (a file open for
    writing), so all 256 objects are still in GCS when the daemon is killed, and so are
    the placeholders its rmdirs removed (their deletes journaled too, no GCS listing: the
    directories were emptied after rm -rf listed them); the next mount deletes them all
    before it serves anything."""
    import shutil

    bucket = gcs_client.bucket(bucket_name)
    tree = {"t/": b"", **{f"t/d{i % 4}/f{i}": str(i).encode() for i in range(256)}}
    for name, data in tree.items():
        bucket.blob(name).upload_from_string(data)
    cache = f"--cache-dir={tmp_path / 'cache'}"
    journal = tmp_path / "cache" / "tierfs-writeback"
    mount = mount_factory("--write-back", "--implicit-dirs", cache)
    saving = os.open(mount.path / "step_2.tmp", os.O_WRONLY | os.O_CREAT)
    try:
        os.write(saving, b"the next step")
        shutil.rmtree(mount.path / "t")
        assert sorted(os.listdir(mount.path)) == ["step_2.tmp"]
        assert not (mount.path / "t").exists()
        remaining = {b.name for b in gcs_client.list_blobs(bucket_name)}
        assert remaining == set(tree)  # nothing waited for GCS
        # One per file, and one per rmdir (t/, and d0..d3: implied, their delete finds none)
        assert len(list(journal.rglob("deletes/*.json"))) == 256 + 5
        kill_daemon(mount)
    finally:
        with contextlib.suppress(OSError):
            os.close(saving)  # (the daemon is gone: ENOTCONN)
    again = mount_factory("--write-back", "--implicit-dirs", cache, name="mnt")
    assert objects(gcs_client, bucket_name) == {}
    assert os.listdir(again.path) == []
    assert list(journal.rglob("deletes/*.json")) == []


def test_sync_after_rm_rf_means_the_objects_are_gone(
    mount_factory: MountFactory, gcs_client: storage.Client, bucket_name: str, tmp_path: Path
) -> None:
    import shutil

    bucket = gcs_client.bucket(bucket_name)
    for name in ("old/", *(f"old/f{i}" for i in range(20)), "new/", "new/f"):
        bucket.blob(name).upload_from_string(b"" if name.endswith("/") else name.encode())
    mount = mount_factory("--write-back", f"--cache-dir={tmp_path / 'cache'}")
    shutil.rmtree(mount.path / "old")
    (mount.path / "old").mkdir()  # made again at once: waits for nothing it needs
    (mount.path / "old" / "f0").write_bytes(b"again")
    assert tierfs_sync(mount).returncode == 0
    assert objects(gcs_client, bucket_name) == {
        "new/": b"",
        "new/f": b"new/f",
        "old/": b"",
        "old/f0": b"again",
    }
    assert stats(mount)["writeback"]["deleting"] == 0


def test_a_time_set_on_a_new_directory_goes_up_with_its_placeholder(
    mount_factory: MountFactory, gcs_client: storage.Client, bucket_name: str, tmp_path: Path
) -> None:
    """With write-back, mkdir is local: a time set on the directory before its placeholder
    is uploaded is carried by the placeholder (gcsfuse_mtime), and stat shows it at once."""
    mount = mount_factory("--write-back", f"--cache-dir={tmp_path / 'cache'}")
    os.mkdir(mount.path / "d")
    os.utime(mount.path / "d", (1_950_000_000, 1_950_000_000))
    assert os.stat(mount.path / "d").st_mtime == 1_950_000_000
    assert tierfs_sync(mount).returncode == 0
    blob = gcs_client.bucket(bucket_name).get_blob("d/")
    assert blob is not None and blob.metadata["gcsfuse_mtime"].startswith("2031-10-17")


@pytest.mark.parametrize("prefetch", ["default", "off"])
def test_rmdirs_of_rm_rf_ask_gcs_nothing_and_their_placeholders_go_in_the_background(
    mount_factory: MountFactory,
    gcs_client: storage.Client,
    bucket_name: str,
    tmp_path: Path,
    prefetch: str,
) -> None:
    """`rm -rf` of a step an earlier save left (a placeholder per directory, as gcsfuse
    makes them) lists each directory, then removes what it found, then the directory: its
    rmdir knows it empty from that listing, less what was removed since, and journals its
    placeholder's delete like the files'. From the first unlink to the last rmdir no GCS
    stat or listing, and nothing deleted (the deletes yield to a save in progress);
    `tierfs sync` then means every object is gone. At the defaults, and with metadata
    prefetch off (no listing of its own runs beside the ones rm -rf makes)."""
    bucket = gcs_client.bucket(bucket_name)
    tree = {"old/": b"", "old/d0/": b"", "old/d1/": b""}
    tree |= {f"old/d{i % 2}/f{i}": b"x" for i in range(10)}
    for name, data in tree.items():
        bucket.blob(name).upload_from_string(data)
    off = ["--enable-metadata-prefetch=false"] if prefetch == "off" else []
    mount = mount_factory("--write-back", *off, f"--cache-dir={tmp_path / 'cache'}")
    root = mount.path / "old"
    assert sorted(os.listdir(root)) == ["d0", "d1"]
    listed = {d: os.listdir(root / d) for d in ("d0", "d1")}
    saving = os.open(mount.path / "step_2.tmp", os.O_WRONLY | os.O_CREAT)
    try:
        before = stats(mount)["gcs"]
        for d, names in listed.items():
            for name in names:
                os.unlink(root / d / name)
            os.rmdir(root / d)
        os.rmdir(root)
        after = stats(mount)["gcs"]
        assert {b.name for b in gcs_client.list_blobs(bucket_name)} == set(tree)
    finally:
        os.close(saving)
    assert (after["stats"], after["lists"]) == (before["stats"], before["lists"])
    assert not root.exists()
    assert tierfs_sync(mount).returncode == 0
    assert objects(gcs_client, bucket_name) == {"step_2.tmp": b""}


@pytest.mark.parametrize("end", ["sync", "kill"])
@pytest.mark.parametrize("state", ["uploaded", "uploading"])
def test_a_file_rename_over_an_old_one_never_waits_for_gcs(
    mount_factory: MountFactory,
    emulator: Emulator,
    gcs_client: storage.Client,
    bucket_name: str,
    tmp_path: Path,
    state: str,
    end: str,
) -> None:
    """DCP's commit, ``.metadata.tmp`` -> ``.metadata`` over the last step's, at the default
    write-back delay, of a file in GCS already or with its upload under way, over a
    GCS-shaped link (+1 s a request, 4 MB/s): rename() returns before the upload or the
    copy ends, the mount shows the new name with its bytes at once, and the object is moved
    in the background; after `tierfs sync`, or kill -9 and a remount, GCS holds the new
    name only."""
    from benchmarks.shaping import ShapingProxy

    data = os.urandom(8 * MiB)
    gcs_client.bucket(bucket_name).blob("dcp/.metadata").upload_from_string(b"last step")
    cache = f"--cache-dir={tmp_path / 'cache'}"
    port = int(emulator.endpoint.rsplit(":", 1)[1].strip("/"))
    proxy = ShapingProxy(("127.0.0.1", port), delay_s=1.0, rate_bytes_s=4e6).start()
    try:
        mount = mount_factory(
            "--write-back", "--implicit-dirs", cache, f"--custom-endpoint={proxy.endpoint}"
        )
        tmp, final = mount.path / "dcp" / ".metadata.tmp", mount.path / "dcp" / ".metadata"
        assert final.read_bytes() == b"last step"
        tmp.write_bytes(data)
        if state == "uploaded":
            assert tierfs_sync(mount).returncode == 0
        else:
            deadline = time.monotonic() + 60
            while proxy.bytes_up < MiB:  # its upload is under way (it takes 2 s or more)
                assert time.monotonic() < deadline, "the upload never started"
                time.sleep(0.01)
        os.rename(tmp, final)
        in_gcs = objects(gcs_client, bucket_name)  # (the emulator itself: no +1 s)
        assert in_gcs["dcp/.metadata"] == b"last step"  # neither uploaded nor copied yet
        assert sorted(os.listdir(mount.path / "dcp")) == [".metadata"]
        assert final.read_bytes() == data
        if end == "sync":
            assert tierfs_sync(mount).returncode == 0
            assert stats(mount)["writeback"]["moving"] == 0
        else:
            kill_daemon(mount)
    finally:
        proxy.stop()
    if end == "kill":
        again = mount_factory("--write-back", "--implicit-dirs", cache, name="mnt")
        assert (again.path / "dcp" / ".metadata").read_bytes() == data
    assert objects(gcs_client, bucket_name) == {"dcp/.metadata": data}
    assert not list((tmp_path / "cache").rglob("moves/*.json"))


def test_a_step_removed_listed_and_made_again_is_made(
    mount_factory: MountFactory, gcs_client: storage.Client, bucket_name: str, tmp_path: Path
) -> None:
    """`rm -rf step_100; ls; mkdir step_100` at the defaults: the listing while the
    placeholder's delete was pending made mkdir say EEXIST once the delete ran."""
    bucket = gcs_client.bucket(bucket_name)
    for name in ("step_100/", "step_100/a"):
        bucket.blob(name).upload_from_string(b"")
    mount = mount_factory("--write-back", f"--cache-dir={tmp_path / 'cache'}")
    step = mount.path / "step_100"
    os.unlink(step / "a")
    step.rmdir()
    assert os.listdir(mount.path) == []
    step.mkdir()
    (step / "b").write_bytes(b"b")
    assert os.listdir(mount.path) == ["step_100"]
    assert tierfs_sync(mount).returncode == 0
    assert objects(gcs_client, bucket_name) == {"step_100/": b"", "step_100/b": b"b"}


def test_a_second_mount_on_the_same_journal_is_refused_in_one_line(
    mount_factory: MountFactory, emulator: Emulator, bucket_name: str, tmp_path: Path
) -> None:
    """Two write-back mounts of one bucket on one cache-dir shared one journal, and the
    second one's recovery deleted the first one's files being written. The second now
    fails in one line; another only-dir has a journal of its own."""
    cache = f"--cache-dir={tmp_path / 'cache'}"
    first = mount_factory("--write-back", cache)
    (first.path / "d").mkdir()
    with open(first.path / "d" / "open", "wb") as writing:  # the first one's file, open
        writing.write(b"being written")
        writing.flush()
        second = Mount(emulator, bucket_name, tmp_path / "two", tmp_path / "two.log", [])
        second.args = ["--write-back", cache]
        second.path.mkdir()
        try:
            result = subprocess.run(second.command(), capture_output=True, text=True, timeout=120)
            assert result.returncode != 0
            assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr
            assert "another tierfs mount of gs://" in result.stderr
            third = mount_factory("--write-back", cache, "--only-dir=d", name="three")
            assert os.listdir(third.path) == []  # (d/open is not closed: not in GCS yet)
        finally:
            second.cleanup()
        writing.write(b", still")
    assert (first.path / "d" / "open").read_bytes() == b"being written, still"


@pytest.mark.parametrize("how", ["rmdir", "rename"])
def test_a_file_beside_a_directory_of_its_name_shows_once_the_directory_is_gone(
    mount_factory: MountFactory,
    gcs_client: storage.Client,
    bucket_name: str,
    tmp_path: Path,
    how: str,
) -> None:
    """With write-back, the placeholder's delete (or move) runs in the background; once it
    is done, ``foo`` is the file GCS holds beside it (the delete's end cached "nothing
    there" for negative-ttl-secs)."""
    bucket = gcs_client.bucket(bucket_name)
    bucket.blob("foo").upload_from_string(b"i am the file")
    bucket.blob("foo/").upload_from_string(b"")
    mount = mount_factory("--write-back", f"--cache-dir={tmp_path / 'cache'}")
    assert stat.S_ISDIR(os.stat(mount.path / "foo").st_mode)
    if how == "rmdir":
        os.rmdir(mount.path / "foo")
    else:
        os.rename(mount.path / "foo", mount.path / "bar")
    assert tierfs_sync(mount).returncode == 0
    assert sorted(objects(gcs_client, bucket_name)) == (
        ["foo"] if how == "rmdir" else ["bar/", "foo"]
    )
    assert stat.S_ISREG(os.stat(mount.path / "foo").st_mode)
    assert (mount.path / "foo").read_bytes() == b"i am the file"


@pytest.mark.parametrize("write_back", [True, False])
def test_a_directory_whose_placeholder_gcs_cannot_name_is_enametoolong(
    mount_factory: MountFactory,
    gcs_client: storage.Client,
    bucket_name: str,
    tmp_path: Path,
    write_back: bool,
) -> None:
    """A placeholder past GCS's 1,024 bytes: with write-back, mkdir made a journal record
    that no sync could upload (every later mount failed it again); without, a name whose
    file object is exactly 1,024 bytes said EINVAL. Both are ENAMETOOLONG."""
    options = ["--write-back", f"--cache-dir={tmp_path / 'cache'}"] if write_back else []
    mount = mount_factory(*options)
    deep = mount.path
    for letter in "abcd":  # 4 x 251 bytes of path
        deep = deep / (letter * 250)
        os.mkdir(deep)
    with pytest.raises(OSError) as info:
        os.mkdir(deep / ("g" * 255))
    assert info.value.errno == errno.ENAMETOOLONG
    exact = "h" * (1024 - 4 * 251)  # its file object is 1,024 bytes, its placeholder 1,025
    with pytest.raises(OSError) as info:
        os.mkdir(deep / exact)
    assert info.value.errno == errno.ENAMETOOLONG
    (deep / exact).write_bytes(b"a file may ...")
    assert tierfs_sync(mount).returncode == 0
    placeholders = [n for n in objects(gcs_client, bucket_name) if n.endswith("/")]
    assert len(placeholders) == 4 and max(len(n) for n in placeholders) == 4 * 251
    name = "/".join([letter * 250 for letter in "abcd"] + [exact])
    assert gcs_client.bucket(bucket_name).blob(name).download_as_bytes() == b"a file may ..."


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 64 MiB tmpfs: a cache-dir volume a cache sized -1 can fill."""
    with tmpfs(tmp_path / "small", "64m") as path:
        yield path


def test_a_file_cache_sized_to_its_volume_leaves_the_journal_room_for_a_save(
    mount_factory: MountFactory, gcs_client: storage.Client, bucket_name: str, small_disk: Path
) -> None:
    """file-cache:max-size-mb -1 (the default) with write-back's journal in the same
    cache-dir: the cache took the volume's free space less its 5 % margin, so once a
    restore had filled it, a save larger than the margin failed with ENOSPC. It takes
    half now (stats say so), and the save fits."""
    restored = os.urandom(48 * MiB)
    gcs_client.bucket(bucket_name).blob("restored.bin").upload_from_string(restored)
    mount = mount_factory("--write-back", f"--cache-dir={small_disk}")
    assert (mount.path / "restored.bin").read_bytes() == restored
    capacity = stats(mount)["data"]["tiers"]["ssd"]["capacity_bytes"]
    assert 28 * MiB < capacity < 32 * MiB  # half of 64 MiB less 5 %

    def settled() -> bool:
        ssd = stats(mount)["data"]["tiers"]["ssd"]
        full = min(capacity, len(restored)) - 9 * MiB  # (within a block of it)
        return bool(ssd["pending_bytes"] == 0 and ssd["used_bytes"] > full)

    wait_until(settled, "the restore to fill the SSD tier")
    saved = os.urandom(24 * MiB)
    (mount.path / "saved.bin").write_bytes(saved)
    assert tierfs_sync(mount).returncode == 0
    assert gcs_client.bucket(bucket_name).blob("saved.bin").download_as_bytes() == saved


def test_tierfs_sync_leaves_a_file_still_being_written_to_its_close(
    mount_factory: MountFactory, gcs_client: storage.Client, bucket_name: str, tmp_path: Path
) -> None:
    """`tierfs sync` (and SIGTERM, which runs the same) while a writer is mid-file: the file
    was uploaded half written. It goes up whole at its close."""
    mount = mount_factory("--write-back", HOLD, f"--cache-dir={tmp_path / 'cache'}")
    with open(mount.path / "ckpt", "wb") as writer:
        writer.write(b"first half, ")
        writer.flush()
        assert tierfs_sync(mount).returncode == 0
        assert objects(gcs_client, bucket_name) == {}
        writer.write(b"then the rest")
    assert tierfs_sync(mount).returncode == 0
    assert objects(gcs_client, bucket_name) == {"ckpt": b"first half, then the rest"}
