"""``tierfs mount BUCKET /dev/fd/N``: a privileged helper (this test, as root) opens /dev/fuse
and mounts it with mount(2); an unprivileged tierfs (uid 65534, no capabilities) serves the
descriptor it is handed. The unmount is the helper's too: the daemon then exits on its own.
This is how the GKE driver runs gcsfuse in a pod (see docs/kubernetes.md)."""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from google.cloud import storage

from tests.mounting import TIERFS, require_fuse
from tierfs.cli.daemon import daemon_pids
from tierfs.cli.emulator import Emulator
from tierfs.cli.fdmount import check_fd, fuse_fd

pytestmark = pytest.mark.mount

NOBODY = 65534
MS_NOSUID, MS_NODEV = 2, 4
UNPRIVILEGED = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups"]


def fuse_mount(fd: int, mountpoint: Path) -> None:
    """What a CSI node plugin does for the pod: mount(2) a FUSE file system on ``fd``."""
    libc = ctypes.CDLL(None, use_errno=True)
    options = f"fd={fd},rootmode=40000,user_id=0,group_id=0".encode()
    status = libc.mount(
        b"tierfs", os.fsencode(mountpoint), b"fuse.tierfs", MS_NOSUID | MS_NODEV, options
    )
    if status != 0:
        pytest.fail(f"mount(2) failed: {os.strerror(ctypes.get_errno())}")


def wait_gone(pid: int, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[-1][:1]
        except FileNotFoundError:
            return True
        if state == "Z":
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)


@pytest.mark.parametrize("mode", ["--foreground", "background"])
def test_an_unprivileged_daemon_serves_a_mount_a_privileged_helper_made(
    emulator: Emulator, bucket_name: str, gcs_client: storage.Client, tmp_path: Path, mode: str
) -> None:
    """In the foreground as uid 65534 without capabilities (as the GKE sidecar runs gcsfuse),
    and as a background daemon, which `tierfs mount` hands the descriptor to. (The background
    case runs as root: the daemon re-executes the venv's python, which on these machines
    lies below /root, 0700.)"""
    require_fuse()
    blobs = gcs_client.bucket(bucket_name)
    blobs.blob("present.txt").upload_from_string(b"in gcs")
    blobs.blob("d/").upload_from_string(b"")
    for i in range(8):
        blobs.blob(f"d/f{i}").upload_from_string(b"x" * i)
    mountpoint = tmp_path / "mnt"
    mountpoint.mkdir()
    log = tmp_path / "daemon.log"
    fd = os.open("/dev/fuse", os.O_RDWR)
    daemon: subprocess.Popen[bytes] | None = None
    pid = 0
    mounted = False
    try:
        fuse_mount(fd, mountpoint)
        mounted = True
        with open(log, "wb") as stderr:
            daemon = subprocess.Popen(
                [
                    *(UNPRIVILEGED if mode == "--foreground" else []),
                    TIERFS,
                    "mount",
                    *([mode] if mode.startswith("--") else []),
                    f"--custom-endpoint={emulator.endpoint}",
                    "--anonymous-access",
                    "--log-severity=debug",
                    "--log-format=text",
                    bucket_name,
                    f"/dev/fd/{fd}",
                ],
                pass_fds=(fd,),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=stderr,
            )
        if mode == "background":  # `tierfs mount` exits once its daemon serves
            assert daemon.wait(timeout=120) == 0, log.read_text()
            (pid,) = daemon_pids(f"/dev/fd/{fd}")
        else:
            pid = daemon.pid
        os.close(fd)  # the daemon's copy is the only one: if it dies, the mount fails at once
        fd = -1
        assert (mountpoint / "present.txt").read_bytes() == b"in gcs"
        # A stat storm: on a mount handed over as /dev/fd/N the daemon has no mountpoint to
        # read d/ through (tierfs.core.prefill), so it never tries (checked in the log).
        assert [os.stat(mountpoint / "d" / f"f{i}").st_size for i in range(8)] == list(range(8))
        (mountpoint / "hello.txt").write_bytes(b"from nobody")
        blob = gcs_client.bucket(bucket_name).blob("hello.txt")
        if mode == "background":
            # Without the mount's path the daemon has no mount id to tell our descriptors from
            # those of other file systems with the same inode number, and this test process
            # (root, so readable) has some: the upload then comes at RELEASE, just after
            # close() (tierfs/cli/fdmount.py; as uid 65534 our descriptors are not readable).
            deadline = time.monotonic() + 60
            while not blob.exists() and time.monotonic() < deadline:
                time.sleep(0.05)
        assert blob.download_as_bytes() == b"from nobody"
        if mode == "--foreground":
            status = Path(f"/proc/{pid}/status").read_text()
            assert f"Uid:\t{NOBODY}\t{NOBODY}" in status
            assert "CapEff:\t0000000000000000" in status

        subprocess.run(["umount", str(mountpoint)], check=True, timeout=60)
        mounted = False
        if mode == "background":
            assert wait_gone(pid, 120), "the daemon did not exit after the unmount"
        else:
            assert daemon.wait(timeout=120) == 0
    finally:
        if fd >= 0:
            os.close(fd)
        if mounted:
            subprocess.run(["umount", "-l", str(mountpoint)], check=False)
        if daemon is not None and daemon.poll() is None:
            daemon.kill()
            daemon.wait()
        if mode == "background" and pid and not wait_gone(pid, 0):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    lines = log.read_text(encoding="utf-8", errors="replace").splitlines()
    assert not [line for line in lines if " ERROR " in line or " WARNING " in line], lines[-5:]
    assert not [line for line in lines if "through the mount" in line]


def test_fd_mountpoints_are_recognised_as_libfuse_does() -> None:
    assert fuse_fd("/dev/fd/3") == 3
    assert fuse_fd("/dev/fd/3x") is None
    assert fuse_fd("/mnt/dev/fd/3") is None
    assert fuse_fd("/dev/fd/") is None
    read_end, write_end = os.pipe()
    os.close(write_end)
    try:
        assert check_fd(read_end) is None
    finally:
        os.close(read_end)
    assert "not an open descriptor" in (check_fd(write_end) or "")
