"""The life of a mount through the real console scripts: start, fail, stop, crash, recover.

Every test runs ``tierfs`` as a user would (a subprocess, with a timeout so nothing can
hang the suite) and checks what a user sees: the exit status, exactly one line on stderr
naming the cause (never a traceback), the mount table, the daemon process, and the
objects in the bucket. Every mount made is unmounted and every process stopped by its
PID in a ``finally``/fixture teardown, also when the test fails.
"""

from __future__ import annotations

import contextlib
import errno
import http.server
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from google.cloud import storage

from tests.conftest import MountFactory
from tests.mounting import TIERFS, Mount, require_fuse, wait_until
from tierfs.cli import mountpoint
from tierfs.cli.daemon import daemon_pids
from tierfs.cli.emulator import Emulator

RUN_TIMEOUT_S = 60
READY_TIMEOUT_S = 30


# --- helpers --------------------------------------------------------------------------------


def mount_table(path: Path) -> list[tuple[str, str, str]]:
    """(source, fstype, options) of every mount on ``path``, bottom first."""
    found = []
    with open("/proc/self/mounts", encoding="utf-8") as table:
        for line in table:
            fields = line.split()
            if len(fields) >= 4 and fields[1] == str(path):
                found.append((fields[0], fields[2], fields[3]))
    return found


def gone(pid: int) -> bool:
    """The process has exited (a zombie waiting for a reaper counts as exited)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as stat:
            return stat.read().rsplit(") ", 1)[-1][:1] in ("Z", "X")
    except FileNotFoundError:
        return True


def answers(path: Path) -> bool:
    if not any(fstype == "fuse.tierfs" for _, fstype, _ in mount_table(path)):
        return False
    try:
        os.listdir(path)
    except OSError:
        return False
    return True


def tierfs(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [TIERFS, *args], capture_output=True, text=True, timeout=RUN_TIMEOUT_S, env=env
    )


def one_line_error(result: subprocess.CompletedProcess[str]) -> str:
    """The single stderr line of a failed command."""
    assert result.returncode != 0, f"expected a failure, got 0: {result.stdout!r}"
    assert "Traceback" not in result.stderr, result.stderr
    assert result.stderr.endswith("\n") and result.stderr.count("\n") == 1, (
        f"expected exactly one line on stderr, got: {result.stderr!r}"
    )
    return result.stderr.rstrip("\n")


def force_cleanup(path: Path, *procs: subprocess.Popen[str]) -> None:
    """Stop every process of this mountpoint by PID and take every mount off it."""
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=30)
    for pid in daemon_pids(str(path)):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    for _ in range(5):
        if not mount_table(path):
            break
        subprocess.run(
            ["fusermount3", "-u", "-z", str(path)], capture_output=True, timeout=30, check=False
        )


@pytest.fixture
def endpoint_args(emulator: Emulator) -> list[str]:
    return [f"--custom-endpoint={emulator.endpoint}", "--anonymous-access"]


@pytest.fixture
def mountpoint_dir(tmp_path: Path) -> Iterator[Path]:
    """An empty directory; whatever ends up mounted on it is taken off at the end."""
    require_fuse()
    path = tmp_path / "mnt"
    path.mkdir()
    try:
        yield path
    finally:
        force_cleanup(path)


# --- a successful mount -----------------------------------------------------------------------


def test_mount_returns_only_once_the_mount_answers(
    mount_factory: MountFactory, bucket_name: str, gcs_client: storage.Client
) -> None:
    gcs_client.bucket(bucket_name).blob("before.txt").upload_from_string(b"before")
    mount = mount_factory()  # `tierfs mount` has exited 0 when this returns
    assert os.listdir(mount.path) == ["before.txt"]
    assert mount_table(mount.path)[-1][:2] == (bucket_name, "fuse.tierfs")
    pids = mount.pids()
    assert len(pids) == 1
    cmdline = Path(f"/proc/{pids[0]}/cmdline").read_bytes().split(b"\0")
    assert str(mount.path).encode() in cmdline


@pytest.mark.parametrize("typed", ["mnt", "mnt/", "./x/../mnt"])
def test_unmount_waits_for_a_daemon_mounted_by_a_relative_path(
    mountpoint_dir: Path,
    bucket_name: str,
    endpoint_args: list[str],
    gcs_client: storage.Client,
    typed: str,
) -> None:
    """`tierfs unmount` finds the daemon by its mountpoint among its words in /proc, and
    the daemon had the path as typed: mounted as ``mnt`` or ``mnt/``, unmount found no
    daemon and returned at once, while it still uploaded what write-back held
    (``tierfs unmount mnt && poweroff`` lost it)."""
    home = mountpoint_dir.parent
    (home / "x").mkdir()
    mount = [TIERFS, "mount", *endpoint_args, "--write-back", f"--cache-dir={home / 'cache'}"]
    hold = "--write-back-delay-secs=3600"  # uploaded at unmount, not before
    result = subprocess.run(
        [*mount, hold, bucket_name, typed], cwd=home, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    assert len(daemon_pids(str(mountpoint_dir))) == 1
    data = os.urandom(8 << 20)
    (mountpoint_dir / "ckpt").write_bytes(data)
    result = subprocess.run(
        [TIERFS, "unmount", typed], cwd=home, capture_output=True, text=True, timeout=600
    )
    assert result.returncode == 0, result.stderr
    assert daemon_pids(str(mountpoint_dir)) == []  # it had exited when unmount returned
    assert gcs_client.bucket(bucket_name).blob("ckpt").download_as_bytes() == data


def test_a_flag_after_the_mountpoint_with_the_same_word_keeps_its_value(
    mountpoint_dir: Path, bucket_name: str, endpoint_args: list[str], gcs_client: storage.Client
) -> None:
    """``tierfs mount BUCKET mnt --only-dir mnt``: the daemon's mountpoint was made absolute
    by replacing the last word equal to it, the flag's value: the prefix became
    ``/abs/path/mnt`` (files went there), and unmount did not find the daemon to wait."""
    home = mountpoint_dir.parent
    command = [TIERFS, "mount", *endpoint_args, bucket_name, "mnt", "--only-dir", "mnt"]
    result = subprocess.run(command, cwd=home, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert len(daemon_pids(str(mountpoint_dir))) == 1
    (mountpoint_dir / "f.txt").write_bytes(b"data")
    result = subprocess.run(
        [TIERFS, "unmount", "mnt"], cwd=home, capture_output=True, text=True, timeout=600
    )
    assert result.returncode == 0, result.stderr
    assert [b.name for b in gcs_client.list_blobs(bucket_name)] == ["mnt/f.txt"]


def started_daemons(mountpoint: Path) -> list[int]:
    """The daemons of ``mountpoint`` that `tierfs mount` has started (exec'd, with the
    ready pipe it passes)."""
    started = []
    for pid in daemon_pids(str(mountpoint)):
        with contextlib.suppress(OSError):
            if b"--ready-fd=" in Path(f"/proc/{pid}/cmdline").read_bytes():
                started.append(pid)
    return started


def test_ctrl_c_while_a_mount_starts_leaves_no_daemon_and_no_mount(
    mountpoint_dir: Path, bucket_name: str
) -> None:
    """SIGINT to ``tierfs mount`` while its daemon waits for GCS (here an endpoint that
    never answers): it said "interrupted" and exited 130, but the daemon went on, mounted
    once GCS answered, and died at its first reply to the gone parent: a dead mount."""
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(16)  # connections are made, never answered
    try:
        endpoint = f"http://127.0.0.1:{silent.getsockname()[1]}"
        command = [TIERFS, "mount", f"--custom-endpoint={endpoint}", "--anonymous-access"]
        starting = subprocess.Popen(
            [*command, bucket_name, str(mountpoint_dir)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            # (as from a terminal: a suite started in the background by a non-interactive
            # shell has SIGINT ignored, which its children inherit, and keep: CI timed out)
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
        )
        # (the daemon itself: a child forked but not yet exec'd shows its parent's command
        # line, and a SIGINT then came while the parent was still importing or spawning)
        wait_until(lambda: started_daemons(mountpoint_dir), "the daemon to start")
        starting.send_signal(signal.SIGINT)
        _, err = starting.communicate(timeout=60)
        assert starting.returncode == 130 and err == "tierfs: interrupted\n", err
        assert daemon_pids(str(mountpoint_dir)) == []
        assert mount_table(mountpoint_dir) == []
    finally:
        silent.close()


def test_a_mount_whose_daemon_does_not_answer_is_never_waited_for(
    mount_factory: MountFactory, endpoint_args: list[str], bucket_name: str
) -> None:
    """A daemon stopped (or deadlocked): ``tierfs mount`` and ``tierfs unmount`` each began
    with a statvfs of the mountpoint, which waited for it for ever, and ``tierfs sync``
    (and ``tierfs prefetch``) waited for its answer for ever. Now a mount there is refused
    as busy, sync, stats and prefetch say it does not answer, and unmount takes it off
    lazily, each in one line and in seconds; a new mount then works."""
    mount = mount_factory()
    (pid,) = mount.pids()
    os.kill(pid, signal.SIGSTOP)
    try:
        again = [TIERFS, "mount", *endpoint_args, bucket_name, str(mount.path)]
        result = subprocess.run(again, capture_output=True, text=True, timeout=60)
        assert result.returncode != 0
        assert "does not answer" in one_line_error(result)
        for command in ("sync", "stats", "prefetch"):  # (sync and prefetch waited for ever)
            result = subprocess.run(
                [TIERFS, command, str(mount.path)], capture_output=True, text=True, timeout=60
            )
            assert result.returncode == 1
            assert "answer" in one_line_error(result), command
        result = subprocess.run(
            [TIERFS, "unmount", str(mount.path)], capture_output=True, text=True, timeout=60
        )
        assert result.returncode == 1
        assert f"daemon (pid {pid}) does not answer" in one_line_error(result)
        assert mount_table(mount.path) == []
    finally:
        os.kill(pid, signal.SIGKILL)
    mount.mounted = False
    fresh = mount_factory(name="mnt")
    assert os.listdir(fresh.path) == []


@pytest.mark.parametrize("linked", ["a parent", "the mountpoint itself"])
def test_a_mountpoint_reached_through_a_symlink(
    tmp_path: Path, bucket_name: str, endpoint_args: list[str], linked: str
) -> None:
    """``/home`` -> ``/var/home`` (Fedora Atomic), or ``/data`` -> ``/mnt/disk/data``: the
    mount table names the resolved path, and the commands compared it with the path as
    given. A second mount there was not refused (it stacked on the first), ``tierfs
    unmount`` said 'not mounted', and ``tierfs stats`` and ``sync`` found no mount
    answering."""
    require_fuse()
    real = tmp_path / "real"
    (real / "mnt").mkdir(parents=True)
    if linked == "a parent":
        (tmp_path / "link").symlink_to(real)
        path = str(tmp_path / "link" / "mnt")
    else:
        (tmp_path / "link").symlink_to(Path("real") / "mnt")  # (relative, as ln -s makes)
        path = str(tmp_path / "link")
    try:
        result = tierfs("mount", *endpoint_args, bucket_name, path)
        assert result.returncode == 0, result.stderr
        (Path(path) / "f").write_bytes(b"x")
        busy = one_line_error(tierfs("mount", *endpoint_args, bucket_name, path))
        assert "is busy" in busy
        assert len(mount_table(real / "mnt")) == 1
        for command in (("stats", path), ("sync", path), ("unmount", path)):
            result = tierfs(*command)
            assert result.returncode == 0, (command, result.stderr)
        assert mount_table(real / "mnt") == []
    finally:
        force_cleanup(real / "mnt")


# --- failures: one line naming the cause, exit != 0, nothing left behind --------------------


def assert_nothing_left(path: Path) -> None:
    assert mount_table(path) == []
    assert daemon_pids(str(path)) == []


def test_bucket_missing(mountpoint_dir: Path, endpoint_args: list[str]) -> None:
    result = tierfs("mount", *endpoint_args, "no-such-bucket-here", str(mountpoint_dir))
    assert one_line_error(result) == "tierfs: bucket 'no-such-bucket-here' does not exist"
    assert_nothing_left(mountpoint_dir)


@pytest.mark.parametrize("foreground", [False, True])
def test_a_log_file_in_a_missing_directory(
    mountpoint_dir: Path, bucket_name: str, endpoint_args: list[str], foreground: bool
) -> None:
    """Said 'internal error: FileNotFoundError' (twice prefixed, in the background)."""
    log = mountpoint_dir.parent / "absent" / "tierfs.log"
    extra = ["--foreground"] if foreground else []
    result = tierfs(
        "mount", *endpoint_args, *extra, f"--log-file={log}", bucket_name, str(mountpoint_dir)
    )
    assert one_line_error(result) == (
        f"tierfs: cannot write the log file {log} (log-file): No such file or directory"
    )
    assert_nothing_left(mountpoint_dir)


def test_mountpoint_missing(tmp_path: Path, bucket_name: str, endpoint_args: list[str]) -> None:
    path = tmp_path / "absent"
    result = tierfs("mount", *endpoint_args, bucket_name, str(path))
    assert one_line_error(result) == f"tierfs: mountpoint {path} does not exist"
    assert not path.exists()


def test_mountpoint_is_a_file(tmp_path: Path, bucket_name: str, endpoint_args: list[str]) -> None:
    path = tmp_path / "file"
    path.write_bytes(b"x")
    result = tierfs("mount", *endpoint_args, bucket_name, str(path))
    assert one_line_error(result) == f"tierfs: mountpoint {path} is not a directory"
    assert path.read_bytes() == b"x"
    assert_nothing_left(path)


def test_mountpoint_busy(mount: Mount, endpoint_args: list[str]) -> None:
    pids = mount.pids()
    result = tierfs("mount", *endpoint_args, mount.bucket, str(mount.path))
    assert one_line_error(result) == (
        f"tierfs: mountpoint {mount.path} is busy: {mount.bucket} is already mounted there"
    )
    assert len(mount_table(mount.path)) == 1  # nothing stacked on top
    assert mount.pids() == pids
    assert os.listdir(mount.path) == []  # the first mount is untouched


def test_nothing_listening_at_the_endpoint(mountpoint_dir: Path) -> None:
    started = time.monotonic()
    result = tierfs(
        "mount",
        "--custom-endpoint=http://127.0.0.1:1",
        "--anonymous-access",
        "--max-retry-attempts=1",
        "--max-retry-sleep=0.1s",
        "some-bucket",
        str(mountpoint_dir),
    )
    elapsed = time.monotonic() - started
    line = one_line_error(result)
    assert line.startswith("tierfs: cannot reach bucket 'some-bucket': connection failed")
    assert "127.0.0.1:1" in line and "Connection refused" in line
    assert elapsed < 20, f"took {elapsed:.1f}s"
    assert_nothing_left(mountpoint_dir)


def test_no_credentials_fails_fast_without_network(mountpoint_dir: Path, tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    with socket.create_server(("127.0.0.1", 0)) as trap:
        trap_url = f"127.0.0.1:{trap.getsockname()[1]}"
        env = {
            "PATH": os.environ.get("PATH", "/usr/sbin:/usr/bin:/sbin:/bin"),
            "HOME": str(home),
            "GOOGLE_APPLICATION_CREDENTIALS": "/nonexistent",
            # Any HTTP request (GCS, the token endpoint) or metadata-server probe lands here.
            "http_proxy": f"http://{trap_url}",
            "https_proxy": f"http://{trap_url}",
            "HTTP_PROXY": f"http://{trap_url}",
            "HTTPS_PROXY": f"http://{trap_url}",
            "GCE_METADATA_HOST": trap_url,
            "GCE_METADATA_IP": trap_url,
        }
        started = time.monotonic()
        result = tierfs("mount", "some-bucket", str(mountpoint_dir), env=env)
        elapsed = time.monotonic() - started
        trap.setblocking(False)
        with pytest.raises(BlockingIOError):
            trap.accept()[0].close()  # a connection here means the network was reached
    line = one_line_error(result)
    assert line.startswith(
        "tierfs: no credentials found: set GOOGLE_APPLICATION_CREDENTIALS,"
        " use --key-file, or --anonymous-access"
    )
    assert "/nonexistent" in line
    assert elapsed < 15, f"took {elapsed:.1f}s"
    assert_nothing_left(mountpoint_dir)


def test_a_custom_endpoint_without_credentials_says_which_flag_to_add(
    mountpoint_dir: Path, tmp_path: Path, emulator: Emulator
) -> None:
    """An emulator user who forgets --anonymous-access is told so, in one line; tierfs no
    longer switches to anonymous access behind their back."""
    env = {
        "PATH": os.environ.get("PATH", "/usr/sbin:/usr/bin:/sbin:/bin"),
        "HOME": str(tmp_path),
        "GOOGLE_APPLICATION_CREDENTIALS": "/nonexistent",
    }
    result = tierfs(
        "mount", f"--custom-endpoint={emulator.endpoint}", "some-bucket", str(mountpoint_dir),
        env=env,
    )  # fmt: skip
    assert one_line_error(result) == (
        f"tierfs: no credentials for {emulator.endpoint}: add --anonymous-access (an emulator) "
        "or --key-file=KEY.json"
    )
    assert result.returncode == 1
    assert_nothing_left(mountpoint_dir)


def test_fusermount3_missing(
    mountpoint_dir: Path, tmp_path: Path, bucket_name: str, endpoint_args: list[str]
) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "python3").symlink_to(sys.executable)
    env = {"PATH": str(bin_dir), "HOME": os.environ.get("HOME", "/root")}
    result = tierfs("mount", *endpoint_args, bucket_name, str(mountpoint_dir), env=env)
    assert one_line_error(result) == "tierfs: fusermount3 is missing: install the fuse3 package"
    assert_nothing_left(mountpoint_dir)


# In a private mount namespace, /dev becomes a tmpfs with only the usual character devices.
NO_DEV_FUSE = (
    "mount -t tmpfs -o mode=755 tmpfs /dev"
    " && mknod -m 666 /dev/null c 1 3 && mknod -m 666 /dev/zero c 1 5"
    " && mknod -m 666 /dev/random c 1 8 && mknod -m 666 /dev/urandom c 1 9"
    ' && exec "$@"'
)


def test_dev_fuse_missing(mountpoint_dir: Path, bucket_name: str, endpoint_args: list[str]) -> None:
    command = ["unshare", "--mount", "--propagation", "private", "sh", "-c", NO_DEV_FUSE, "sh"]
    command += [TIERFS, "mount", *endpoint_args, bucket_name, str(mountpoint_dir)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
    assert one_line_error(result) == (
        "tierfs: /dev/fuse is missing: load the fuse module or give the container the device"
    )
    assert_nothing_left(mountpoint_dir)


def test_check_before_mount_dev_fuse_missing(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    real_exists = os.path.exists
    monkeypatch.setattr(os.path, "exists", lambda p: p != "/dev/fuse" and real_exists(p))
    with pytest.raises(mountpoint.MountError) as caught:
        mountpoint.check_before_mount(str(tmp_path))
    assert str(caught.value) == (
        "/dev/fuse is missing: load the fuse module or give the container the device"
    )


def test_check_before_mount_fusermount3_missing(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(mountpoint.os.path, "exists", lambda p: True)
    monkeypatch.setattr(mountpoint.shutil, "which", lambda name, *a, **k: None)
    with pytest.raises(mountpoint.MountError) as caught:
        mountpoint.check_before_mount(str(tmp_path))
    assert str(caught.value) == "fusermount3 is missing: install the fuse3 package"


# --- stopping -------------------------------------------------------------------------------


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP], ids=str)
def test_foreground_stays_attached_until_signalled(
    signum: signal.Signals,
    mountpoint_dir: Path,
    bucket_name: str,
    endpoint_args: list[str],
    gcs_client: storage.Client,
) -> None:
    proc = subprocess.Popen(
        [TIERFS, "mount", "--foreground", *endpoint_args, bucket_name, str(mountpoint_dir)],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_until(
            lambda: answers(mountpoint_dir) or proc.poll() is not None,
            "the foreground mount",
            READY_TIMEOUT_S,
        )
        assert proc.poll() is None, proc.communicate(timeout=10)
        data = os.urandom(1 << 20)
        (mountpoint_dir / "written.bin").write_bytes(data)  # written and closed
        time.sleep(0.2)
        assert proc.poll() is None  # still attached: it serves until told to stop
        proc.send_signal(signum)
        _, stderr = proc.communicate(timeout=RUN_TIMEOUT_S)
        assert proc.returncode == 0, stderr
        assert "Traceback" not in stderr
        assert mount_table(mountpoint_dir) == []
        assert os.listdir(mountpoint_dir) == []  # a plain directory again
        blob = gcs_client.bucket(bucket_name).blob("written.bin")
        assert blob.download_as_bytes() == data
    finally:
        force_cleanup(mountpoint_dir, proc)


def test_unmount_waits_for_the_daemon_and_the_uploads(
    mount: Mount, gcs_client: storage.Client
) -> None:
    (pid,) = mount.pids()
    data = os.urandom(8 << 20)
    (mount.path / "big.bin").write_bytes(data)
    (mount.path / "small.txt").write_text("small")
    result = mount.unmount()
    assert (result.returncode, result.stderr) == (0, "")
    assert gone(pid), f"daemon {pid} still running after `tierfs unmount` returned"
    assert mount_table(mount.path) == []
    bucket = gcs_client.bucket(mount.bucket)
    assert bucket.blob("big.bin").download_as_bytes() == data
    assert bucket.blob("small.txt").download_as_bytes() == b"small"


def test_unmount_waits_for_a_foreground_mount(
    mountpoint_dir: Path, bucket_name: str, endpoint_args: list[str], gcs_client: storage.Client
) -> None:
    proc = subprocess.Popen(
        [TIERFS, "mount", "--foreground", *endpoint_args, bucket_name, str(mountpoint_dir)],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    resume = threading.Timer(2.0, lambda: proc.send_signal(signal.SIGCONT))
    try:
        wait_until(
            lambda: answers(mountpoint_dir) or proc.poll() is not None,
            "the foreground mount",
            READY_TIMEOUT_S,
        )
        (mountpoint_dir / "f.txt").write_text("f")
        os.stat(mountpoint_dir)  # cached: unmounting needs nothing from the stopped process
        # Stopped, the process cannot exit before `tierfs unmount` returns unless it is waited
        # for: a correct unmount returns only after the SIGCONT below and the process's exit.
        proc.send_signal(signal.SIGSTOP)
        resume.start()
        result = tierfs("unmount", str(mountpoint_dir))
        exited = proc.poll() is not None
        resume.cancel()
        if proc.poll() is None:
            proc.send_signal(signal.SIGCONT)
        assert (result.returncode, result.stderr) == (0, "")
        assert proc.wait(timeout=RUN_TIMEOUT_S) == 0
        assert gcs_client.bucket(bucket_name).blob("f.txt").download_as_bytes() == b"f"
        assert exited, "`tierfs unmount` returned while the --foreground process still ran"
    finally:
        resume.cancel()
        force_cleanup(mountpoint_dir, proc)


def test_unmount_of_a_path_not_mounted(tmp_path: Path) -> None:
    result = tierfs("unmount", str(tmp_path))
    assert result.returncode == 1
    assert one_line_error(result) == f"tierfs: {tmp_path} is not mounted"


# --- a daemon killed with SIGKILL -----------------------------------------------------------


def listdir_errno(path: Path) -> int:
    try:
        os.listdir(path)
    except OSError as err:
        return err.errno
    return 0


def kill_daemon(mount: Mount) -> None:
    """SIGKILL the daemon; the mountpoint is left dead (ENOTCONN)."""
    (pid,) = mount.pids()
    os.stat(mount.path)  # as `tierfs mount` does; the kernel now caches the root's attributes
    os.kill(pid, signal.SIGKILL)
    wait_until(lambda: gone(pid), f"daemon {pid} to die", 10)
    # Requests caught by the abort while the daemon's threads exit get ECONNABORTED;
    # once it is gone, every call answers ENOTCONN.
    wait_until(lambda: listdir_errno(mount.path) != errno.ECONNABORTED, "the abort", 10)
    assert listdir_errno(mount.path) == errno.ENOTCONN  # "Transport endpoint is not connected"
    assert [fstype for _, fstype, _ in mount_table(mount.path)] == ["fuse.tierfs"]


def test_unmount_recovers_a_killed_daemon(mount: Mount) -> None:
    mount.expect_errors = True
    kill_daemon(mount)
    result = mount.unmount()
    assert (result.returncode, result.stderr) == (0, "")
    assert mount_table(mount.path) == []
    assert os.listdir(mount.path) == []  # usable as a plain directory
    (mount.path / "plain").write_text("plain")
    (mount.path / "plain").unlink()


def test_mount_again_recovers_a_killed_daemon(
    mount: Mount, endpoint_args: list[str], gcs_client: storage.Client
) -> None:
    mount.expect_errors = True
    (mount.path / "kept.txt").write_text("kept")
    kill_daemon(mount)
    try:
        result = tierfs("mount", *endpoint_args, mount.bucket, str(mount.path))
        assert (result.returncode, result.stderr) == (0, "")
        assert [fstype for _, fstype, _ in mount_table(mount.path)] == ["fuse.tierfs"]
        assert os.listdir(mount.path) == ["kept.txt"]
        (mount.path / "new.txt").write_text("new")
        blob = gcs_client.bucket(mount.bucket).blob("new.txt")
        assert blob.download_as_bytes() == b"new"
    finally:
        force_cleanup(mount.path)


class _Forbidden(http.server.BaseHTTPRequestHandler):
    """A GCS endpoint that refuses everyone (403), as a bucket without IAM access does."""

    def _refuse(self) -> None:
        body = json.dumps({"error": {"code": 403, "message": "caller lacks storage.objects.list"}})
        self.send_response(403)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body.encode())

    do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _refuse

    def log_message(self, *args: object) -> None:
        pass


def test_access_denied(mountpoint_dir: Path) -> None:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Forbidden)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        result = tierfs(
            "mount",
            f"--custom-endpoint=http://127.0.0.1:{server.server_address[1]}",
            "--anonymous-access",
            "locked-bucket",
            str(mountpoint_dir),
        )
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)
    line = one_line_error(result)
    assert line.startswith("tierfs: access to bucket 'locked-bucket' denied"), line
    assert result.returncode == 1
    assert_nothing_left(mountpoint_dir)


def test_json_logs(mount_factory: MountFactory, tmp_path: Path) -> None:
    log = tmp_path / "json.log"
    mount = mount_factory("--log-format=json", f"--log-file={log}", name="jsonlog")
    (mount.path / "f").write_bytes(b"x")
    assert mount.unmount().returncode == 0
    records = [json.loads(line) for line in log.read_text().splitlines()]
    assert records, "the daemon wrote no log lines"
    assert {"timestamp", "severity", "message"} <= set(records[0])
    assert any("mounted gs://" in r["message"] for r in records)


def test_kernel_options_libfuse_refuses_mount_with_a_warning(
    mountpoint_dir: Path, bucket_name: str, endpoint_args: list[str]
) -> None:
    """``-o atime,relatime,max_read=...``, which gcsfuse's users and its CSI driver's
    ``o=atime`` pass: the mount failed ("fuse_session_new() failed", or for max_read
    mounted and never answered). They are dropped, with a warning; noatime is kept."""
    options = "atime,relatime,strictatime,max_read=131072,blksize=4096,noatime"
    result = subprocess.run(
        [TIERFS, "mount", *endpoint_args, "-o", options, bucket_name, str(mountpoint_dir)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    warned = [line for line in result.stderr.splitlines() if "no effect on a FUSE mount" in line]
    assert len(warned) == 5, result.stderr
    (mountpoint_dir / "f").write_bytes(b"ok")
    assert (mountpoint_dir / "f").read_bytes() == b"ok"
    assert "noatime" in mount_table(mountpoint_dir)[-1][2].split(",")
    done = subprocess.run(
        [TIERFS, "unmount", str(mountpoint_dir)], capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr


def test_a_mount_libfuse_refuses_says_libfuses_reason(
    mountpoint_dir: Path, bucket_name: str, endpoint_args: list[str]
) -> None:
    """``-o fscontext=...`` (SELinux) on a kernel without SELinux: libfuse refuses the mount
    and says why on the daemon's stderr only; the user saw "fuse_session_mount failed"."""
    result = subprocess.run(
        [TIERFS, "mount", *endpoint_args, "-o", "fscontext=x", bucket_name, str(mountpoint_dir)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    if result.returncode == 0:  # a kernel with SELinux took it
        assert tierfs("unmount", str(mountpoint_dir)).returncode == 0
        return
    assert "fuse_session_mount failed (fuse: mount failed: " in one_line_error(result)
    assert_nothing_left(mountpoint_dir)
