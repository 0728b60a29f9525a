"""mount(8), fstab lines and the ``mount.tierfs`` helper, the way a system administrator uses them.

``tierfs install-helper`` writes ``/sbin/mount.tierfs`` (mount(8) looks for helpers
only there); util-linux ``mount -T FSTAB MOUNTPOINT`` then mounts a line of a test
fstab exactly as it would one of ``/etc/fstab``, and ``umount`` ends the mount.
The real ``/sbin/mount.tierfs`` is put back as it was after each test.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from google.cloud import storage

from tests.mounting import BIN, require_fuse, wait_until
from tests.test_mount_lifecycle import (
    RUN_TIMEOUT_S,
    force_cleanup,
    gone,
    mount_table,
    one_line_error,
    tierfs,
)
from tierfs.cli import install
from tierfs.cli.daemon import daemon_pids
from tierfs.cli.emulator import Emulator

MOUNT_HELPER = str(BIN / "mount.tierfs")


# --- install-helper into a scratch prefix ---------------------------------------------------


def test_install_helper_writes_a_script_that_runs_this_environment(tmp_path: Path) -> None:
    prefix = tmp_path / "sbin"
    done = install.install_helper(prefix)
    assert done.changed and done.path == prefix / "mount.tierfs"
    assert done.target == BIN / "mount.tierfs"
    assert stat.S_IMODE(done.path.stat().st_mode) == 0o755
    text = done.path.read_text()
    assert text.startswith("#!/bin/sh\n") and f'exec {BIN / "mount.tierfs"} "$@"' in text
    # the installed helper is mount.tierfs itself, whatever PATH mount(8) was run with
    result = subprocess.run(
        [
            str(done.path),
            "a-bucket",
            "/mnt/x",
            "-n",
            "-s",
            "-v",
            "-o",
            "ro,implicit_dirs",
            "--dry-run",
        ],
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
        env={"PATH": "/nonexistent"},
    )
    assert result.returncode == 0, result.stderr
    effective = json.loads(result.stdout)
    assert (effective["bucket"], effective["mountpoint"]) == ("a-bucket", "/mnt/x")
    assert effective["options"]["implicit-dirs"]["value"] is True


def test_install_helper_finds_the_helper_beside_the_tierfs_script(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A system-wide ``pip install`` puts the scripts in /usr/local/bin, the interpreter
    being /usr/bin/python3: the helper was looked for beside the interpreter only, and
    install-helper refused ("missing or not executable")."""
    python_dir = tmp_path / "usr-bin"
    python_dir.mkdir()
    monkeypatch.setattr(sys, "executable", str(python_dir / "python3"))
    monkeypatch.setattr(sys, "argv", [str(BIN / "tierfs"), "install-helper"])
    done = install.install_helper(tmp_path / "sbin")
    assert done.target == BIN / "mount.tierfs"


def test_install_helper_is_idempotent(tmp_path: Path) -> None:
    first = install.install_helper(tmp_path)
    before = first.path.stat()
    again = install.install_helper(tmp_path)
    assert not again.changed
    after = again.path.stat()
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)
    assert sorted(os.listdir(tmp_path)) == ["mount.tierfs"]  # no temporary files left


def test_install_helper_replaces_a_helper_of_another_tierfs_environment(tmp_path: Path) -> None:
    old = tmp_path / "mount.tierfs"
    old.write_text(install.helper_text(Path("/opt/old-venv/bin/mount.tierfs")))
    assert install.install_helper(tmp_path).changed
    assert old.read_text() == install.helper_text(BIN / "mount.tierfs")


def test_install_helper_replaces_a_symlink_to_the_same_console_script(tmp_path: Path) -> None:
    (tmp_path / "mount.tierfs").symlink_to(BIN / "mount.tierfs")
    assert install.install_helper(tmp_path).changed
    assert not (tmp_path / "mount.tierfs").is_symlink()


@pytest.mark.parametrize("kind", ["file", "symlink"])
def test_install_helper_never_overwrites_a_foreign_file(tmp_path: Path, kind: str) -> None:
    path = tmp_path / "mount.tierfs"
    if kind == "file":
        path.write_text('#!/bin/sh\nexec /usr/local/bin/someone-elses-helper "$@"\n')
    else:
        path.symlink_to("/usr/bin/true")
    before = os.readlink(path) if kind == "symlink" else path.read_text()
    with pytest.raises(install.InstallError, match="is not tierfs's helper"):
        install.install_helper(tmp_path)
    assert (os.readlink(path) if kind == "symlink" else path.read_text()) == before


def test_install_helper_command(tmp_path: Path) -> None:
    result = tierfs("install-helper", "--prefix", str(tmp_path))
    assert result.returncode == 0, result.stderr
    assert result.stdout == f"installed: {tmp_path}/mount.tierfs -> {BIN}/mount.tierfs\n"
    result = tierfs("install-helper", f"--prefix={tmp_path}")
    assert (result.returncode, result.stderr) == (0, "")
    assert result.stdout.startswith("already installed: ")

    (tmp_path / "mount.tierfs").write_text("not ours\n")
    refused = tierfs("install-helper", "--prefix", str(tmp_path))
    assert refused.returncode == 1
    assert one_line_error(refused) == (
        f"tierfs: {tmp_path}/mount.tierfs exists and is not tierfs's helper: remove it first"
    )
    usage = tierfs("install-helper", "--bogus")
    assert usage.returncode == 2
    assert one_line_error(usage).startswith("tierfs: usage: tierfs install-helper")


def test_mount_helper_dry_run_prints_json(tmp_path: Path) -> None:
    result = subprocess.run(
        [
            MOUNT_HELPER,
            "my-bucket",
            str(tmp_path),
            "-o",
            "rw,_netdev,allow_other,implicit_dirs,file_mode=640",
            "--dry-run",
        ],
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
    )
    assert (result.returncode, result.stderr) == (0, "")
    effective = json.loads(result.stdout)
    assert effective["bucket"] == "my-bucket"
    assert effective["mountpoint"] == str(tmp_path)
    assert effective["fuse_options"] == ["allow_other"]
    assert effective["options"]["file-system:file-mode"]["value"] == "0640"
    assert mount_table(tmp_path) == []  # a dry run mounts nothing


def test_mount_helper_takes_the_last_part_of_a_source_mount_8_made_absolute(
    tmp_path: Path,
) -> None:
    """mount(8) makes a source that names an existing path absolute (``cd /mnt; mount
    my-bucket`` with /mnt/my-bucket the mountpoint): the bucket was '' (an error); gcsfuse's
    helper takes the last part."""
    source = str(tmp_path / "my-bucket")
    (tmp_path / "my-bucket").mkdir()
    result = subprocess.run(
        [MOUNT_HELPER, source, source, "-o", "rw", "--dry-run"],
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
    )
    assert (result.returncode, result.stderr) == (0, "")
    assert json.loads(result.stdout)["bucket"] == "my-bucket"


def test_mount_helper_fake_mounts_nothing(tmp_path: Path) -> None:
    """``mount -f`` (fake: mtab entries for ``mount -fa``) passes -f: everything is checked,
    nothing mounted (it mounted for real); a bad option still fails."""
    args = [MOUNT_HELPER, "my-bucket", str(tmp_path), "-f", "-o"]
    result = subprocess.run(
        [*args, "rw,implicit_dirs"], capture_output=True, text=True, timeout=RUN_TIMEOUT_S
    )
    assert (result.returncode, result.stderr, result.stdout) == (0, "", "")
    assert mount_table(tmp_path) == []
    bad = subprocess.run(
        [*args, "rw,no_such_option"], capture_output=True, text=True, timeout=RUN_TIMEOUT_S
    )
    assert bad.returncode == 2 and "no_such_option" in bad.stderr


# --- mount(8) with an fstab line ---------------------------------------------------------------


@pytest.fixture
def sbin_helper() -> Iterator[Path]:
    """``tierfs install-helper`` into /sbin; whatever was there before is restored."""
    require_fuse()
    path = Path("/sbin/mount.tierfs")
    link = os.readlink(path) if path.is_symlink() else None
    content = path.read_bytes() if link is None and path.exists() else None
    result = tierfs("install-helper")
    assert result.returncode == 0, result.stderr
    try:
        yield path
    finally:
        if link is not None:
            if not path.is_symlink() or os.readlink(path) != link:
                path.unlink(missing_ok=True)
                path.symlink_to(link)
        elif content is None:
            path.unlink(missing_ok=True)  # this test created it
        elif path.is_symlink() or path.read_bytes() != content:
            path.unlink(missing_ok=True)
            path.write_bytes(content)
            path.chmod(0o755)


def fstab_line(bucket: str, mountpoint: Path, options: list[str]) -> str:
    return f"{bucket} {mountpoint} tierfs {','.join(options)} 0 0\n"


def test_fstab_line_mounts_with_its_options_and_umount_ends_it(
    sbin_helper: Path,
    emulator: Emulator,
    bucket_name: str,
    gcs_client: storage.Client,
    tmp_path: Path,
) -> None:
    mountpoint = tmp_path / "mnt"
    mountpoint.mkdir()
    log = tmp_path / "daemon.log"
    fstab = tmp_path / "fstab"
    fstab.write_text(
        "# a test fstab\n"
        + fstab_line(
            bucket_name,
            mountpoint,
            [
                "rw",
                "_netdev",
                "allow_other",
                "implicit_dirs",
                "file_mode=640",
                "dir_mode=750",  # not the defaults (644, 755): they show
                "anonymous_access",
                f"custom_endpoint={emulator.endpoint}",
                f"log_file={log}",
                "log_severity=debug",
                "log_format=text",
            ],
        )
    )
    try:
        result = subprocess.run(
            ["mount", "-s", "-v", "-T", str(fstab), str(mountpoint)],
            capture_output=True,
            text=True,
            timeout=RUN_TIMEOUT_S,
        )
        assert result.returncode == 0, result.stderr
        assert "Traceback" not in result.stderr
        ((source, fstype, options),) = mount_table(mountpoint)
        assert (source, fstype) == (bucket_name, "fuse.tierfs")
        assert "allow_other" in options.split(",")
        (pid,) = daemon_pids(str(mountpoint))

        (mountpoint / "hello.txt").write_bytes(b"hello from fstab\n")
        bucket = gcs_client.bucket(bucket_name)
        assert bucket.blob("hello.txt").download_as_bytes() == b"hello from fstab\n"
        bucket.blob("x/y").upload_from_string(b"implicit")
        assert os.path.isdir(mountpoint / "x")  # implicit_dirs took effect
        assert (mountpoint / "x" / "y").read_bytes() == b"implicit"
        assert stat.S_IMODE((mountpoint / "hello.txt").stat().st_mode) == 0o640
        assert stat.S_IMODE((mountpoint / "x" / "y").stat().st_mode) == 0o640
        assert stat.S_IMODE((mountpoint / "x").stat().st_mode) == 0o750

        result = subprocess.run(
            ["umount", str(mountpoint)], capture_output=True, text=True, timeout=RUN_TIMEOUT_S
        )
        assert (result.returncode, result.stderr) == (0, "")
        assert mount_table(mountpoint) == []
        wait_until(lambda: gone(pid), f"the daemon (pid {pid}) to exit after umount", 30)
        assert os.listdir(mountpoint) == []
        errors = [line for line in log.read_text().splitlines() if " ERROR " in line]
        assert errors == []
    finally:
        force_cleanup(mountpoint)


@pytest.mark.parametrize(
    ("option", "message"),
    [
        ("implicit_dirz", "tierfs: unknown option 'implicit_dirz' (did you mean 'implicit-dirs'?)"),
        (
            "file_mode=rw-r--r--",
            "tierfs: bad value 'rw-r--r--' for option 'file-system:file-mode':"
            " expected an octal mode such as 0644",
        ),
    ],
    ids=["unknown", "ill-typed"],
)
def test_fstab_line_with_a_bad_option_fails_with_one_line(
    sbin_helper: Path,
    emulator: Emulator,
    bucket_name: str,
    tmp_path: Path,
    option: str,
    message: str,
) -> None:
    mountpoint = tmp_path / "mnt"
    mountpoint.mkdir()
    fstab = tmp_path / "fstab"
    fstab.write_text(
        fstab_line(
            bucket_name,
            mountpoint,
            ["rw", "_netdev", option, "anonymous_access", f"custom_endpoint={emulator.endpoint}"],
        )
    )
    try:
        result = subprocess.run(
            ["mount", "-T", str(fstab), str(mountpoint)],
            capture_output=True,
            text=True,
            timeout=RUN_TIMEOUT_S,
        )
        assert one_line_error(result) == message
        assert mount_table(mountpoint) == []
        assert daemon_pids(str(mountpoint)) == []
    finally:
        force_cleanup(mountpoint)


def test_the_helper_alone_behaves_like_mount_8_calls_it(
    emulator: Emulator, bucket_name: str, tmp_path: Path, gcs_client: storage.Client
) -> None:
    """``mount.tierfs SPEC DIR -n -s -v -o OPTIONS`` with the flags mount(8) may add."""
    require_fuse()
    mountpoint = tmp_path / "mnt"
    mountpoint.mkdir()
    options = f"rw,_netdev,anonymous_access,custom_endpoint={emulator.endpoint}"
    try:
        result = subprocess.run(
            [MOUNT_HELPER, bucket_name, str(mountpoint), "-n", "-s", "-v", "-o", options],
            capture_output=True,
            text=True,
            timeout=RUN_TIMEOUT_S,
        )
        assert (result.returncode, result.stderr) == (0, "")
        (mountpoint / "f").write_bytes(b"via helper")
        assert gcs_client.bucket(bucket_name).blob("f").download_as_bytes() == b"via helper"
        result = tierfs("unmount", str(mountpoint))
        assert (result.returncode, result.stderr) == (0, "")
        assert mount_table(mountpoint) == []
    finally:
        force_cleanup(mountpoint)
