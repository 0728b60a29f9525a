"""POSIX operations through a real mount, checked with the GCS client: what landed is what was done.

Most tests share one mount of one bucket (default options) and work in a directory of
their own, named after the test, so they pay for a single daemon start; the daemon log
is checked for new ERROR lines after each test. Tests that need options (modes, owner,
``--rename-dir-limit``, ``-o ro``, ``--only-dir``) or a remount get their own mounts from
``mount_factory``.

Semantics are gcsfuse's (``/work/shared/reference/gcsfuse.md`` §3): placeholders,
rename-dir-limit and EMFILE, symlink object formats, ``gcsfuse_mtime``, generation
preconditions and ESTALE, unsupported operations and their errno.
"""

from __future__ import annotations

import datetime
import errno
import os
import random
import re
import stat
import subprocess
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from google.cloud import storage

from tests.mounting import Mount
from tierfs.cli import mountpoint
from tierfs.cli.emulator import Emulator

MountFactory = Callable[..., Mount]

# --- one shared mount, a directory per test --------------------------------------------


@dataclass
class Area:
    """A test's own directory on the module's shared mount (object prefix ``name/``)."""

    mount: Mount
    name: str
    expect_errors: bool = False

    @property
    def path(self) -> Path:
        return self.mount.path / self.name

    @property
    def bucket(self) -> str:
        return self.mount.bucket

    def obj(self, relative: str) -> str:
        return f"{self.name}/{relative}"


@pytest.fixture(scope="module")
def shared_mount(emulator: Emulator, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Mount]:
    bucket = f"tierfs-ops-{uuid.uuid4().hex[:12]}"
    emulator.create_bucket(bucket)
    root = tmp_path_factory.mktemp("ops-shared")
    mount = Mount(emulator, bucket, root / "mnt", root / "mnt.log", [])
    try:
        yield mount.start()
    finally:
        mount.cleanup()


@pytest.fixture
def area(shared_mount: Mount, request: pytest.FixtureRequest) -> Iterator[Area]:
    log = shared_mount.log
    start = log.stat().st_size if log.exists() else 0
    name = re.sub(r"[^A-Za-z0-9_.-]", "_", request.node.name)
    os.mkdir(shared_mount.path / name)
    here = Area(shared_mount, name)
    yield here
    with open(log, "rb") as f:
        f.seek(start)
        new = f.read().decode("utf-8", "replace").splitlines()
    errors = [line for line in new if " ERROR " in line]
    if errors and not here.expect_errors:
        pytest.fail(f"unexpected errors in the daemon log: {errors[:3]}")


# --- helpers ------------------------------------------------------------------------------


def blob_bytes(client: storage.Client, bucket: str, name: str) -> bytes:
    return client.bucket(bucket).blob(name).download_as_bytes()


def blob_metadata(client: storage.Client, bucket: str, name: str) -> dict[str, str]:
    blob = client.bucket(bucket).get_blob(name)
    assert blob is not None, f"object {name!r} is missing"
    return dict(blob.metadata or {})


def upload(
    client: storage.Client,
    bucket: str,
    name: str,
    data: bytes,
    metadata: dict[str, str] | None = None,
) -> None:
    blob = client.bucket(bucket).blob(name)
    if metadata:
        blob.metadata = metadata
    blob.upload_from_string(data)


def exists(client: storage.Client, bucket: str, name: str) -> bool:
    return client.bucket(bucket).get_blob(name) is not None


def names_under(client: storage.Client, bucket: str, prefix: str = "") -> set[str]:
    """Object names below ``prefix`` (relative to it), the prefix's own placeholder left out."""
    return {
        b.name[len(prefix) :] for b in client.list_blobs(bucket, prefix=prefix) if b.name != prefix
    }


def area_objects(client: storage.Client, area: Area) -> set[str]:
    return names_under(client, area.bucket, area.name + "/")


def raises_errno(code: int, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
    with pytest.raises(OSError) as info:
        fn(*args, **kwargs)
    got = info.value.errno
    assert got == code, (
        f"expected {errno.errorcode[code]}, got {errno.errorcode.get(got or 0, got)}: "
        f"{info.value!r}"
    )


def run(*args: str | Path) -> subprocess.CompletedProcess[str]:
    result = subprocess.run([str(a) for a in args], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, f"{args}: {result.stderr}"
    return result


def bash(script: str, *args: str | Path) -> subprocess.CompletedProcess[str]:
    return run("bash", "-c", script, "_", *args)


def ls_ln(directory: Path) -> dict[str, tuple[str, ...]]:
    """``ls -lnA``: name -> (mode string, links, uid, gid, size); symlinks keep ``-> target``."""
    out = run("ls", "-lnA", "--time-style=+%s", directory).stdout
    entries: dict[str, tuple[str, ...]] = {}
    for line in out.splitlines():
        if line.startswith("total"):
            continue
        mode, links, uid, gid, size, _when, name = line.split(None, 6)
        entries[name] = (mode, links, uid, gid, size)
    return entries


def random_bytes(seed: int, n: int) -> bytes:
    return random.Random(seed).randbytes(n)


# --- everyday tools -------------------------------------------------------------------------


def test_cp_file_tree_and_overwrite(area: Area, gcs_client: storage.Client, tmp_path: Path) -> None:
    data = random_bytes(1, 300_001)
    (tmp_path / "src.bin").write_bytes(data)
    run("cp", tmp_path / "src.bin", area.path / "copy.bin")
    assert blob_bytes(gcs_client, area.bucket, area.obj("copy.bin")) == data
    run("cmp", tmp_path / "src.bin", area.path / "copy.bin")

    tree = tmp_path / "tree"
    (tree / "sub").mkdir(parents=True)
    (tree / "a.txt").write_bytes(b"alpha\n")
    (tree / "empty").write_bytes(b"")
    (tree / "sub" / "b.bin").write_bytes(random_bytes(2, 70_000))
    run("cp", "-r", tree, area.path / "tree")
    run("diff", "-r", tree, area.path / "tree")
    assert area_objects(gcs_client, area) == {
        "copy.bin",
        "tree/",
        "tree/a.txt",
        "tree/empty",
        "tree/sub/",
        "tree/sub/b.bin",
    }
    assert blob_bytes(gcs_client, area.bucket, area.obj("tree/empty")) == b""
    assert blob_bytes(gcs_client, area.bucket, area.obj("tree/sub/b.bin")) == random_bytes(
        2, 70_000
    )

    # cp over an existing, longer file: opened O_TRUNC, the object shrinks to the new bytes.
    run("cp", tree / "a.txt", area.path / "copy.bin")
    assert blob_bytes(gcs_client, area.bucket, area.obj("copy.bin")) == b"alpha\n"
    assert os.stat(area.path / "copy.bin").st_size == 6


def test_ls_l_sizes_default_modes_and_owner(area: Area, gcs_client: storage.Client) -> None:
    (area.path / "file").write_bytes(b"x" * 1234)
    (area.path / "empty").write_bytes(b"")
    os.mkdir(area.path / "dir")
    os.symlink("file", area.path / "link")
    upload(gcs_client, area.bucket, area.obj("remote"), b"r" * 77)
    uid, gid = str(os.getuid()), str(os.getgid())
    assert ls_ln(area.path) == {
        "dir": ("drwxr-xr-x", "1", uid, gid, "0"),
        "empty": ("-rw-r--r--", "1", uid, gid, "0"),
        "file": ("-rw-r--r--", "1", uid, gid, "1234"),
        "link -> file": ("lrwxrwxrwx", "1", uid, gid, "4"),
        "remote": ("-rw-r--r--", "1", uid, gid, "77"),
    }


def test_ls_l_modes_and_owner_from_options(
    mount_factory: MountFactory, gcs_client: storage.Client
) -> None:
    mount = mount_factory("--file-mode=600", "--dir-mode=700", "--uid=1234", "--gid=4321")
    (mount.path / "mine").write_bytes(b"12345")
    os.mkdir(mount.path / "d")
    upload(gcs_client, mount.bucket, "theirs", b"abc")
    upload(gcs_client, mount.bucket, "remote-dir/", b"")
    assert ls_ln(mount.path) == {
        "d": ("drwx------", "1", "1234", "4321", "0"),
        "mine": ("-rw-------", "1", "1234", "4321", "5"),
        "remote-dir": ("drwx------", "1", "1234", "4321", "0"),
        "theirs": ("-rw-------", "1", "1234", "4321", "3"),
    }
    st = os.stat(mount.path / "theirs")
    assert (stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid) == (0o600, 1234, 4321)
    st = os.stat(mount.path)
    assert (stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid) == (0o700, 1234, 4321)


# --- rename ---------------------------------------------------------------------------------


def test_a_file_renamed_over_another_before_its_first_close_replaces_it_at_the_close(
    area: Area, gcs_client: storage.Client
) -> None:
    """``NamedTemporaryFile(delete=False)``, written, ``os.replace``d over the checkpoint
    before close: GCS keeps the old checkpoint until the close puts the new one in its
    place, in one step. Before, the old object was deleted at the rename: until the
    close no checkpoint at all, and none if the writer died or its upload failed."""
    area.path.joinpath("ckpt").write_bytes(b"old checkpoint")
    fd = os.open(area.path / "ckpt.tmp", os.O_CREAT | os.O_WRONLY)
    try:
        os.write(fd, b"new checkpoint")
        os.replace(area.path / "ckpt.tmp", area.path / "ckpt")
        assert blob_bytes(gcs_client, area.bucket, area.obj("ckpt")) == b"old checkpoint"
        assert sorted(os.listdir(area.path)) == ["ckpt"]
        assert os.stat(area.path / "ckpt").st_size == len(b"new checkpoint")
    finally:
        os.close(fd)
    assert blob_bytes(gcs_client, area.bucket, area.obj("ckpt")) == b"new checkpoint"
    assert area_objects(gcs_client, area) == {"ckpt"}
    assert (area.path / "ckpt").read_bytes() == b"new checkpoint"


def test_mv_file(area: Area, gcs_client: storage.Client) -> None:
    data = random_bytes(3, 50_000)
    mtime_ns = 1_500_000_000_250_000_000
    (area.path / "a").write_bytes(data)
    os.utime(area.path / "a", ns=(mtime_ns, mtime_ns))
    run("mv", area.path / "a", area.path / "b")
    assert area_objects(gcs_client, area) == {"b"}
    assert blob_bytes(gcs_client, area.bucket, area.obj("b")) == data
    assert (area.path / "b").read_bytes() == data
    assert os.stat(area.path / "b").st_mtime_ns == mtime_ns  # rename keeps the mtime
    raises_errno(errno.ENOENT, os.stat, area.path / "a")

    os.mkdir(area.path / "sub")
    run("mv", area.path / "b", area.path / "sub" / "c")
    assert area_objects(gcs_client, area) == {"sub/", "sub/c"}
    assert blob_bytes(gcs_client, area.bucket, area.obj("sub/c")) == data

    # Replacing an existing file: the target's bytes are gone, the source name too.
    (area.path / "x").write_bytes(b"old target")
    os.rename(area.path / "sub" / "c", area.path / "x")
    assert area_objects(gcs_client, area) == {"sub/", "x"}
    assert blob_bytes(gcs_client, area.bucket, area.obj("x")) == data
    assert sorted(os.listdir(area.path)) == ["sub", "x"]
    assert os.listdir(area.path / "sub") == []


def test_mv_dir_within_and_beyond_rename_dir_limit(
    mount_factory: MountFactory, gcs_client: storage.Client
) -> None:
    mount = mount_factory("--rename-dir-limit=10")
    d = mount.path / "d"
    os.makedirs(d / "sub")
    contents = {f"f{i}": random_bytes(10 + i, 1000 * i) for i in range(7)}
    for name, data in contents.items():
        (d / name).write_bytes(data)
    (d / "sub" / "g").write_bytes(b"deep")
    os.symlink("f1", d / "ln")
    # Descendants: 7 files + sub/ + sub/g + ln = 10 = the limit (d/ itself not counted).
    before = names_under(gcs_client, mount.bucket)
    assert len(before) == 11
    os.rename(d, mount.path / "e")
    expected = {"e/", "e/sub/", "e/sub/g", "e/ln"} | {f"e/{n}" for n in contents}
    assert names_under(gcs_client, mount.bucket) == expected
    for name, data in contents.items():
        assert blob_bytes(gcs_client, mount.bucket, f"e/{name}") == data
        assert (mount.path / "e" / name).read_bytes() == data
    assert (mount.path / "e" / "sub" / "g").read_bytes() == b"deep"
    assert os.readlink(mount.path / "e" / "ln") == "f1"
    assert blob_metadata(gcs_client, mount.bucket, "e/ln")["goog-reserved-file-is-symlink"] == (
        "true"
    )
    assert os.listdir(mount.path) == ["e"]
    raises_errno(errno.ENOENT, os.stat, d)

    # One more object: 11 > 10 -> EMFILE, and nothing moves.
    (mount.path / "e" / "one-more").write_bytes(b"1")
    raises_errno(errno.EMFILE, os.rename, mount.path / "e", mount.path / "g")
    assert names_under(gcs_client, mount.bucket) == expected | {"e/one-more"}
    assert os.listdir(mount.path) == ["e"]
    assert (mount.path / "e" / "one-more").read_bytes() == b"1"


def test_mv_dir_default_limit(area: Area, gcs_client: storage.Client) -> None:
    """The default rename-dir-limit is 0: a non-empty directory cannot move, an empty one can.
    A refused rename over an empty directory leaves that directory (it was removed first)."""
    os.mkdir(area.path / "full")
    (area.path / "full" / "f").write_bytes(b"f")
    raises_errno(errno.EMFILE, os.rename, area.path / "full", area.path / "moved")
    assert area_objects(gcs_client, area) == {"full/", "full/f"}
    os.mkdir(area.path / "there")
    raises_errno(errno.EMFILE, os.rename, area.path / "full", area.path / "there")
    assert area_objects(gcs_client, area) == {"full/", "full/f", "there/"}
    os.rmdir(area.path / "there")

    os.mkdir(area.path / "empty")
    os.rename(area.path / "empty", area.path / "renamed")
    assert area_objects(gcs_client, area) == {"full/", "full/f", "renamed/"}
    assert sorted(os.listdir(area.path)) == ["full", "renamed"]
    assert stat.S_ISDIR(os.stat(area.path / "renamed").st_mode)


def test_mv_dir_with_open_file_keeps_writing(
    mount_factory: MountFactory, gcs_client: storage.Client
) -> None:
    """A directory renamed while a file in it is open for writing: either the rename is
    refused (gcsfuse: ENOTSUP for unsynced files) or the open file keeps working and its
    close lands every byte under the new name. Never a spurious ESTALE and lost bytes."""
    mount = mount_factory("--rename-dir-limit=10")
    os.mkdir(mount.path / "d")
    fd = os.open(mount.path / "d" / "new", os.O_CREAT | os.O_WRONLY)
    try:
        os.write(fd, b"before-")
        try:
            os.rename(mount.path / "d", mount.path / "e")
        except OSError as err:
            assert err.errno == errno.ENOTSUP
            renamed = False
        else:
            renamed = True
        os.write(fd, b"after")
    finally:
        os.close(fd)
    name = "e/new" if renamed else "d/new"
    assert names_under(gcs_client, mount.bucket) == {name.split("/")[0] + "/", name}
    assert blob_bytes(gcs_client, mount.bucket, name) == b"before-after"
    assert (mount.path / name).read_bytes() == b"before-after"


# --- rm, mkdir, rmdir -------------------------------------------------------------------------


def test_rm(area: Area, gcs_client: storage.Client) -> None:
    (area.path / "f").write_bytes(b"f")
    upload(gcs_client, area.bucket, area.obj("remote"), b"never looked up")
    os.makedirs(area.path / "t" / "u")
    for rel in ("t/1", "t/u/2", "t/u/3"):
        (area.path / rel).write_bytes(rel.encode())
    run("rm", area.path / "f", area.path / "remote")
    assert area_objects(gcs_client, area) == {"t/", "t/1", "t/u/", "t/u/2", "t/u/3"}
    run("rm", "-r", area.path / "t")
    assert area_objects(gcs_client, area) == set()
    assert os.listdir(area.path) == []
    raises_errno(errno.ENOENT, os.unlink, area.path / "f")
    raises_errno(errno.ENOENT, os.unlink, area.path / "never-existed")


def test_mkdir(area: Area, gcs_client: storage.Client) -> None:
    os.mkdir(area.path / "d")
    assert area_objects(gcs_client, area) == {"d/"}
    assert blob_bytes(gcs_client, area.bucket, area.obj("d/")) == b""
    raises_errno(errno.EEXIST, os.mkdir, area.path / "d")
    (area.path / "file").write_bytes(b"x")
    raises_errno(errno.EEXIST, os.mkdir, area.path / "file")
    upload(gcs_client, area.bucket, area.obj("theirs/"), b"")
    raises_errno(errno.EEXIST, os.mkdir, area.path / "theirs")
    run("mkdir", "-p", area.path / "a" / "b" / "c")
    assert area_objects(gcs_client, area) == {"d/", "file", "theirs/", "a/", "a/b/", "a/b/c/"}
    assert stat.S_ISDIR(os.stat(area.path / "a" / "b" / "c").st_mode)


def test_rmdir(area: Area, gcs_client: storage.Client) -> None:
    os.makedirs(area.path / "with-file")
    (area.path / "with-file" / "f").write_bytes(b"f")
    os.makedirs(area.path / "with-subdir" / "sub")
    os.mkdir(area.path / "remote-child")
    upload(gcs_client, area.bucket, area.obj("remote-child/x"), b"x")
    os.mkdir(area.path / "empty")
    (area.path / "file").write_bytes(b"")

    raises_errno(errno.ENOTEMPTY, os.rmdir, area.path / "with-file")
    raises_errno(errno.ENOTEMPTY, os.rmdir, area.path / "with-subdir")
    raises_errno(errno.ENOTEMPTY, os.rmdir, area.path / "remote-child")
    raises_errno(errno.ENOENT, os.rmdir, area.path / "missing")
    raises_errno(errno.ENOTDIR, os.rmdir, area.path / "file")
    os.rmdir(area.path / "empty")
    assert not exists(gcs_client, area.bucket, area.obj("empty/"))
    raises_errno(errno.ENOENT, os.stat, area.path / "empty")
    assert area_objects(gcs_client, area) == {
        "with-file/",
        "with-file/f",
        "with-subdir/",
        "with-subdir/sub/",
        "remote-child/",
        "remote-child/x",
        "file",
    }


# --- symlinks ---------------------------------------------------------------------------------


def test_symlink_new_format(area: Area, gcs_client: storage.Client) -> None:
    (area.path / "target.txt").write_bytes(b"pointed at")
    os.mkdir(area.path / "sub")
    (area.path / "sub" / "inner").write_bytes(b"inner")
    run("ln", "-s", "target.txt", area.path / "link")
    run("ln", "-s", "sub", area.path / "dirlink")
    run("ln", "-s", "/etc/hostname", area.path / "absolute")
    run("ln", "-s", "nowhere", area.path / "dangling")

    assert run("readlink", area.path / "link").stdout == "target.txt\n"
    assert os.readlink(area.path / "absolute") == "/etc/hostname"
    assert (area.path / "link").read_bytes() == b"pointed at"
    assert os.listdir(area.path / "dirlink") == ["inner"]
    raises_errno(errno.ENOENT, open, area.path / "dangling", "rb")
    st = os.lstat(area.path / "link")
    assert stat.S_ISLNK(st.st_mode) and st.st_size == len("target.txt")

    # gcsfuse >= 3.9 format: the body is the target; both metadata keys are set.
    assert blob_bytes(gcs_client, area.bucket, area.obj("link")) == b"target.txt"
    meta = blob_metadata(gcs_client, area.bucket, area.obj("link"))
    assert meta["goog-reserved-file-is-symlink"] == "true"
    assert meta["gcsfuse_symlink_target"] == "target.txt"
    assert blob_bytes(gcs_client, area.bucket, area.obj("dangling")) == b"nowhere"

    raises_errno(errno.EEXIST, os.symlink, "other", area.path / "link")
    os.unlink(area.path / "link")
    assert not exists(gcs_client, area.bucket, area.obj("link"))
    assert blob_bytes(gcs_client, area.bucket, area.obj("target.txt")) == b"pointed at"


def test_symlinks_written_by_other_clients(area: Area, gcs_client: storage.Client) -> None:
    (area.path / "target.txt").write_bytes(b"old-format target")
    os.mkdir(area.path / "sub")
    (area.path / "sub" / "file").write_bytes(b"nested")
    # Old format (gcsfuse < 3.9): an empty object with only the legacy metadata key.
    upload(gcs_client, area.bucket, area.obj("old"), b"", {"gcsfuse_symlink_target": "target.txt"})
    upload(
        gcs_client, area.bucket, area.obj("old-nested"), b"", {"gcsfuse_symlink_target": "sub/file"}
    )
    # New format written by gcsfuse >= 3.9: body plus both keys.
    upload(
        gcs_client,
        area.bucket,
        area.obj("new"),
        b"sub/file",
        {"goog-reserved-file-is-symlink": "true", "gcsfuse_symlink_target": "sub/file"},
    )
    # New format with the flag only: the target is the body.
    upload(
        gcs_client,
        area.bucket,
        area.obj("flag-only"),
        b"target.txt",
        {"goog-reserved-file-is-symlink": "true"},
    )
    for name, target, content in [
        ("old", "target.txt", b"old-format target"),
        ("old-nested", "sub/file", b"nested"),
        ("new", "sub/file", b"nested"),
        ("flag-only", "target.txt", b"old-format target"),
    ]:
        assert os.readlink(area.path / name) == target, name
        st = os.lstat(area.path / name)
        assert stat.S_ISLNK(st.st_mode), name
        assert st.st_size == len(target), name
        assert (area.path / name).read_bytes() == content, name


# --- truncate, append, overwrite -----------------------------------------------------------------


def test_truncate(area: Area, gcs_client: storage.Client) -> None:
    path = area.path / "t"
    key = area.obj("t")
    data = random_bytes(4, 10_000)
    path.write_bytes(data)

    run("truncate", "-s", "4000", path)
    assert blob_bytes(gcs_client, area.bucket, key) == data[:4000]
    assert os.stat(path).st_size == 4000
    os.truncate(path, 6000)  # grow: zeros
    assert blob_bytes(gcs_client, area.bucket, key) == data[:4000] + bytes(2000)
    assert path.read_bytes() == data[:4000] + bytes(2000)
    run("truncate", "-s", "0", path)
    assert blob_bytes(gcs_client, area.bucket, key) == b""
    assert os.stat(path).st_size == 0

    fd = os.open(path, os.O_RDWR)
    try:
        os.write(fd, b"abcdef")
        os.ftruncate(fd, 3)
        assert os.fstat(fd).st_size == 3
        os.ftruncate(fd, 8)
        assert os.pread(fd, 100, 0) == b"abc" + bytes(5)
    finally:
        os.close(fd)
    assert blob_bytes(gcs_client, area.bucket, key) == b"abc" + bytes(5)

    # truncate(1) on a missing name creates it; ': >' truncates through O_TRUNC.
    run("truncate", "-s", "100", area.path / "new")
    assert blob_bytes(gcs_client, area.bucket, area.obj("new")) == bytes(100)
    bash(': > "$1"', path)
    assert blob_bytes(gcs_client, area.bucket, key) == b""

    # An object from another client, never read here, shrunk by path and grown by fd.
    theirs = random_bytes(5, 5000)
    upload(gcs_client, area.bucket, area.obj("theirs"), theirs)
    os.truncate(area.path / "theirs", 1234)
    assert blob_bytes(gcs_client, area.bucket, area.obj("theirs")) == theirs[:1234]
    with open(area.path / "theirs", "r+b") as f:
        f.truncate(2000)
    assert blob_bytes(gcs_client, area.bucket, area.obj("theirs")) == theirs[:1234] + bytes(766)


def test_append(area: Area, gcs_client: storage.Client) -> None:
    path = area.path / "log"
    path.write_bytes(b"line1\n")
    bash('echo line2 >> "$1"; echo line3 >> "$1"', path)
    assert blob_bytes(gcs_client, area.bucket, area.obj("log")) == b"line1\nline2\nline3\n"
    with open(path, "ab") as f:
        f.write(b"line4\n")
    assert blob_bytes(gcs_client, area.bucket, area.obj("log")) == b"line1\nline2\nline3\nline4\n"
    assert path.read_bytes() == b"line1\nline2\nline3\nline4\n"

    big = random_bytes(6, 3 << 20)  # past gcsfuse's 2 MiB append threshold
    upload(gcs_client, area.bucket, area.obj("big"), big)
    bash('printf tail >> "$1"', area.path / "big")
    assert blob_bytes(gcs_client, area.bucket, area.obj("big")) == big + b"tail"


def test_overwrite_part_of_existing_object(area: Area, gcs_client: storage.Client) -> None:
    original = random_bytes(7, 1 << 20)
    upload(gcs_client, area.bucket, area.obj("obj"), original)
    patch = random_bytes(8, 5000)
    with open(area.path / "obj", "r+b") as f:
        f.seek(300_000)
        f.write(patch)
        f.seek(0)
        f.write(b"HEAD")
    expected = bytearray(original)
    expected[300_000:305_000] = patch
    expected[0:4] = b"HEAD"
    assert blob_bytes(gcs_client, area.bucket, area.obj("obj")) == bytes(expected)
    assert (area.path / "obj").read_bytes() == bytes(expected)

    # A write that straddles EOF extends the object.
    with open(area.path / "obj", "r+b") as f:
        f.seek(len(original) - 10)
        f.write(b"Z" * 30)
    expected[len(original) - 10 :] = b"Z" * 30
    assert blob_bytes(gcs_client, area.bucket, area.obj("obj")) == bytes(expected)
    assert os.stat(area.path / "obj").st_size == len(original) + 20


# --- mtime -------------------------------------------------------------------------------------


def test_utime_sets_gcsfuse_mtime(area: Area, gcs_client: storage.Client, tmp_path: Path) -> None:
    path = area.path / "f"
    path.write_bytes(b"content")
    mtime_ns = 1_600_000_000_987_654_321
    os.utime(path, ns=(1_000_000_000_000_000_000, mtime_ns))
    assert os.stat(path).st_mtime_ns == mtime_ns
    meta = blob_metadata(gcs_client, area.bucket, area.obj("f"))
    assert meta["gcsfuse_mtime"] == "2020-09-13T12:26:40.987654321Z"
    assert blob_bytes(gcs_client, area.bucket, area.obj("f")) == b"content"

    run("touch", "-d", "@1234567890", path)
    assert os.stat(path).st_mtime_ns == 1_234_567_890_000_000_000
    meta = blob_metadata(gcs_client, area.bucket, area.obj("f"))
    assert meta["gcsfuse_mtime"] == "2009-02-13T23:31:30Z"

    # cp -p sets the time on a file still open for writing: it lands with the upload.
    src = tmp_path / "src"
    src.write_bytes(b"x" * 1000)
    os.utime(src, ns=(1_111_111_111_000_000_000, 1_111_111_111_123_456_789))
    run("cp", "-p", src, area.path / "copied")
    assert os.stat(area.path / "copied").st_mtime_ns == 1_111_111_111_123_456_789
    meta = blob_metadata(gcs_client, area.bucket, area.obj("copied"))
    assert meta["gcsfuse_mtime"] == "2005-03-18T01:58:31.123456789Z"


def test_touch_of_a_file_another_client_deleted_succeeds(
    area: Area, gcs_client: storage.Client
) -> None:
    """gcsfuse's SetMtime ignores "not found" (and "changed": *core*
    `test_metadata.py::test_touch_of_a_file_another_client_replaced_succeeds`; the emulator
    patches the live object whatever generation is asked): ``touch``, ``cp -p`` and
    ``rsync -t`` on a shared bucket go on. tierfs said ENOENT."""
    path = area.path / "f"
    path.write_bytes(b"ours")
    assert os.stat(path).st_size == 4  # known to the mount, at our generation
    gcs_client.bucket(area.bucket).blob(area.obj("f")).delete()
    run("touch", "-d", "@1234567890", path)


def test_mtime_survives_remount(mount_factory: MountFactory, gcs_client: storage.Client) -> None:
    first = mount_factory()
    (first.path / "f").write_bytes(b"keep my time")
    mtime_ns = 1_555_555_555_123_456_789
    os.utime(first.path / "f", ns=(mtime_ns, mtime_ns))
    result = first.unmount()
    assert result.returncode == 0, result.stderr
    assert not first.is_mounted()
    # Other clients' objects: gcsfuse_mtime, else goog-reserved-file-mtime (seconds).
    upload(gcs_client, first.bucket, "theirs", b"t", {"gcsfuse_mtime": "2001-09-09T01:46:40.5Z"})
    upload(gcs_client, first.bucket, "legacy", b"l", {"goog-reserved-file-mtime": "1234567890"})

    second = mount_factory(name="again")
    assert os.stat(second.path / "f").st_mtime_ns == mtime_ns
    assert (second.path / "f").read_bytes() == b"keep my time"
    assert os.stat(second.path / "theirs").st_mtime_ns == 1_000_000_000_500_000_000
    assert os.stat(second.path / "legacy").st_mtime_ns == 1_234_567_890_000_000_000


# --- open files and other clients ---------------------------------------------------------------


def test_unlink_of_a_file_another_client_replaced_removes_the_name(
    area: Area, gcs_client: storage.Client
) -> None:
    """The mount knows f at one generation, another client writes it again, then ``rm f``
    here: the name goes, as gcsfuse's unlink deletes the live object. (Each delete names
    a generation, so the first fails its precondition; the generation there now goes.)"""
    path = area.path / "f"
    path.write_bytes(b"mine")
    assert path.read_bytes() == b"mine"
    gcs_client.bucket(area.bucket).blob(area.obj("f")).upload_from_string(b"theirs")
    os.unlink(path)
    assert not exists(gcs_client, area.bucket, area.obj("f"))
    raises_errno(errno.ENOENT, os.stat, path)


def test_unlink_while_open(area: Area, gcs_client: storage.Client) -> None:
    data = random_bytes(9, 200_000)
    path = area.path / "u"
    path.write_bytes(data)
    fd = os.open(path, os.O_RDWR)
    try:
        os.unlink(path)
        assert not exists(gcs_client, area.bucket, area.obj("u"))
        raises_errno(errno.ENOENT, os.stat, path)
        assert os.listdir(area.path) == []
        assert os.pread(fd, 100, 1000) == data[1000:1100]
        assert os.pwrite(fd, b"XYZ", 10) == 3
        assert os.pread(fd, 20, 0) == data[:10] + b"XYZ" + data[13:20]
        assert os.fstat(fd).st_size == len(data)
        os.fsync(fd)
        # The name is free again: a new file there is independent of the open one.
        path.write_bytes(b"successor")
    finally:
        os.close(fd)
    assert blob_bytes(gcs_client, area.bucket, area.obj("u")) == b"successor"
    assert area_objects(gcs_client, area) == {"u"}

    # A file never uploaded, unlinked while open: never reaches GCS.
    fresh = area.path / "fresh"
    fd = os.open(fresh, os.O_CREAT | os.O_RDWR)
    try:
        os.write(fd, b"hello")
        os.unlink(fresh)
        os.write(fd, b" world")
        assert os.pread(fd, 100, 0) == b"hello world"
    finally:
        os.close(fd)
    assert area_objects(gcs_client, area) == {"u"}
    assert os.listdir(area.path) == ["u"]


def test_other_client_rewrites_file_open_for_write_estale(
    area: Area, gcs_client: storage.Client
) -> None:
    path, key = area.path / "s", area.obj("s")
    path.write_bytes(b"original")
    fd = os.open(path, os.O_RDWR)
    try:
        os.pwrite(fd, b"mine", 0)
        upload(gcs_client, area.bucket, key, b"theirs")
    finally:
        raises_errno(errno.ESTALE, os.close, fd)
    assert blob_bytes(gcs_client, area.bucket, key) == b"theirs"
    assert path.read_bytes() == b"theirs"

    # fsync reports it too.
    fd = os.open(path, os.O_RDWR)
    try:
        os.pwrite(fd, b"again", 0)
        upload(gcs_client, area.bucket, key, b"theirs, twice")
        raises_errno(errno.ESTALE, os.fsync, fd)
    finally:
        raises_errno(errno.ESTALE, os.close, fd)
    assert blob_bytes(gcs_client, area.bucket, key) == b"theirs, twice"

    # A new file that another client creates first: first writer wins.
    fd = os.open(area.path / "race", os.O_CREAT | os.O_WRONLY)
    try:
        os.write(fd, b"late")
        upload(gcs_client, area.bucket, area.obj("race"), b"early")
    finally:
        raises_errno(errno.ESTALE, os.close, fd)
    assert blob_bytes(gcs_client, area.bucket, area.obj("race")) == b"early"

    # Deleted by another client while open for write: not resurrected.
    (area.path / "gone").write_bytes(b"gone")
    fd = os.open(area.path / "gone", os.O_RDWR)
    try:
        os.write(fd, b"X")
        gcs_client.bucket(area.bucket).blob(area.obj("gone")).delete()
    finally:
        raises_errno(errno.ESTALE, os.close, fd)
    assert not exists(gcs_client, area.bucket, area.obj("gone"))


def test_file_replaced_by_other_client(
    mount_factory: MountFactory, gcs_client: storage.Client
) -> None:
    """With metadata-cache:ttl-secs 0 (gcsfuse's advice for strict consistency) another
    client's change is seen by the next open; with a TTL, once it expires (test_metadata)."""
    mount = mount_factory("--metadata-cache-ttl-secs=0")
    area = Area(mount, "strict")
    area.path.mkdir()
    path, key = area.path / "r", area.obj("r")
    path.write_bytes(b"one" * 1000)
    assert path.read_bytes() == b"one" * 1000  # now in the kernel's page cache
    upload(gcs_client, area.bucket, key, b"two" * 1000)  # same size
    assert path.read_bytes() == b"two" * 1000
    upload(gcs_client, area.bucket, key, b"three")
    assert path.read_bytes() == b"three"
    assert os.stat(path).st_size == 5

    # A handle opened before the change, with nothing cached yet, reads a generation that
    # no longer exists: ESTALE (gcsfuse). A fresh open sees the new object.
    upload(gcs_client, area.bucket, area.obj("cold"), b"cold v1")
    with open(area.path / "cold", "rb") as f:
        upload(gcs_client, area.bucket, area.obj("cold"), b"cold v2")
        raises_errno(errno.ESTALE, f.read)
    assert (area.path / "cold").read_bytes() == b"cold v2"


# --- mount options: ro, only-dir ----------------------------------------------------------------


def test_read_only_mount(mount_factory: MountFactory, gcs_client: storage.Client) -> None:
    mount = mount_factory("-o", "ro")
    upload(gcs_client, mount.bucket, "f", b"read me")
    upload(gcs_client, mount.bucket, "d/", b"")
    upload(gcs_client, mount.bucket, "d/inner", b"inner")
    upload(gcs_client, mount.bucket, "ln", b"", {"gcsfuse_symlink_target": "f"})
    before = {b.name: b.generation for b in gcs_client.list_blobs(mount.bucket)}
    p = mount.path

    assert (p / "f").read_bytes() == b"read me"
    assert (p / "d" / "inner").read_bytes() == b"inner"
    assert sorted(os.listdir(p)) == ["d", "f", "ln"]
    assert os.readlink(p / "ln") == "f"
    assert os.statvfs(p).f_flag & os.ST_RDONLY

    raises_errno(errno.EROFS, open, p / "new", "wb")
    raises_errno(errno.EROFS, open, p / "f", "r+b")
    raises_errno(errno.EROFS, open, p / "f", "ab")
    raises_errno(errno.EROFS, os.mkdir, p / "nd")
    raises_errno(errno.EROFS, os.rmdir, p / "d")
    raises_errno(errno.EROFS, os.unlink, p / "f")
    raises_errno(errno.EROFS, os.rename, p / "f", p / "g")
    raises_errno(errno.EROFS, os.truncate, p / "f", 0)
    raises_errno(errno.EROFS, os.symlink, "f", p / "ln2")
    raises_errno(errno.EROFS, os.utime, p / "f", (1, 1))
    assert {b.name: b.generation for b in gcs_client.list_blobs(mount.bucket)} == before
    assert blob_bytes(gcs_client, mount.bucket, "f") == b"read me"


def test_only_dir(mount_factory: MountFactory, gcs_client: storage.Client) -> None:
    mount = mount_factory("--only-dir=sub")
    for name, data in [
        ("top.txt", b"top"),
        ("subway.txt", b"not under sub/"),
        ("other/o", b"other"),
        ("sub/", b""),
        ("sub/inner.txt", b"inner"),
        ("sub/deeper/", b""),
        ("sub/deeper/x", b"x"),
    ]:
        upload(gcs_client, mount.bucket, name, data)
    p = mount.path
    assert sorted(os.listdir(p)) == ["deeper", "inner.txt"]
    assert (p / "inner.txt").read_bytes() == b"inner"
    assert (p / "deeper" / "x").read_bytes() == b"x"
    raises_errno(errno.ENOENT, os.stat, p / "top.txt")
    raises_errno(errno.ENOENT, os.stat, p / "sub")

    (p / "new.txt").write_bytes(b"new")
    os.mkdir(p / "made")
    os.symlink("inner.txt", p / "ln")
    os.rename(p / "new.txt", p / "made" / "moved.txt")
    os.unlink(p / "deeper" / "x")
    assert names_under(gcs_client, mount.bucket) == {
        "top.txt",
        "subway.txt",
        "other/o",
        "sub/",
        "sub/inner.txt",
        "sub/deeper/",
        "sub/made/",
        "sub/made/moved.txt",
        "sub/ln",
    }
    assert blob_bytes(gcs_client, mount.bucket, "sub/made/moved.txt") == b"new"
    assert blob_bytes(gcs_client, mount.bucket, "top.txt") == b"top"


# --- statfs and unsupported operations -----------------------------------------------------------


# --- times of directories and symlinks, and of the parent --------------------------------


T = 1_950_000_000  # a time no test run could stumble on by itself
LONG_AGO = 1_000_000_000


def test_directory_and_symlink_times_are_kept_in_their_objects(
    area: Area, gcs_client: storage.Client
) -> None:
    """``touch -d @T DIR`` and ``touch -h -d @T LINK`` set mtimes that stat shows and that
    the placeholder and the symlink object carry (gcsfuse_mtime), so another mount sees
    them. They were accepted and dropped."""
    os.mkdir(area.path / "d")
    os.symlink("target", area.path / "link")
    os.utime(area.path / "d", (T, T))
    os.utime(area.path / "link", (T, T), follow_symlinks=False)
    assert os.stat(area.path / "d").st_mtime == T
    assert os.lstat(area.path / "link").st_mtime == T
    for name in ("d/", "link"):
        blob = gcs_client.bucket(area.bucket).get_blob(area.obj(name))
        assert blob is not None and blob.metadata["gcsfuse_mtime"].startswith("2031-10-17"), name


def test_a_directory_with_no_object_keeps_its_time_for_this_mount_only(
    mount_factory: MountFactory, gcs_client: storage.Client, bucket_name: str
) -> None:
    """An implied directory (objects below it, no placeholder) and the mount root have no
    object to carry an mtime: it is kept while mounted (so rsync -a and cp -a work), GCS
    gets nothing (no placeholder appears), and a new mount does not show it."""
    gcs_client.bucket(bucket_name).blob("implied/x").upload_from_string(b"x")
    mount = mount_factory("--implicit-dirs")
    os.utime(mount.path / "implied", (T, T))
    os.utime(mount.path, (T, T))
    assert os.stat(mount.path / "implied").st_mtime == T
    assert os.stat(mount.path).st_mtime == T
    assert [b.name for b in gcs_client.list_blobs(bucket_name)] == ["implied/x"]
    mount.unmount()
    again = mount_factory("--implicit-dirs", name="again")
    assert os.stat(again.path / "implied").st_mtime != T


@pytest.mark.parametrize(
    "change",
    ["create", "mkdir", "symlink", "unlink", "rmdir", "rename-in", "rename-out"],
)
def test_adding_or_removing_an_entry_moves_the_parents_mtime_and_ctime(
    area: Area, change: str
) -> None:
    """As on a local file system: the parent's mtime and ctime move forward when an entry
    is added or removed (rmdir and symlink left them unchanged)."""
    parent = area.path / "p"
    os.mkdir(parent)
    (area.path / "other").write_bytes(b"o")
    if change in ("unlink",):
        (parent / "f").write_bytes(b"f")
    if change == "rmdir":
        os.mkdir(parent / "sub")
    if change == "rename-out":
        (parent / "f").write_bytes(b"f")
    os.utime(parent, (LONG_AGO, LONG_AGO))  # so that any change is visible
    before = os.stat(parent)
    {
        "create": lambda: (parent / "new").write_bytes(b"n"),
        "mkdir": lambda: os.mkdir(parent / "newdir"),
        "symlink": lambda: os.symlink("t", parent / "ln"),
        "unlink": lambda: os.unlink(parent / "f"),
        "rmdir": lambda: os.rmdir(parent / "sub"),
        "rename-in": lambda: os.rename(area.path / "other", parent / "moved"),
        "rename-out": lambda: os.rename(parent / "f", area.path / "moved-out"),
    }[change]()
    after = os.stat(parent)
    assert after.st_mtime_ns > before.st_mtime_ns, change
    assert after.st_ctime_ns > before.st_ctime_ns, change


def test_statfs(area: Area) -> None:
    st = os.statvfs(area.path)
    # gcsfuse's fake capacity: 2^33 blocks of 128 KiB, 2^50 inodes.
    assert (st.f_bsize, st.f_frsize) == (1 << 17, 1 << 17)
    assert st.f_blocks == st.f_bfree == st.f_bavail == 1 << 33
    assert st.f_files == st.f_ffree == 1 << 50
    assert st.f_namemax == 255
    run("df", area.path)


def test_find_walks_every_directory_which_counts_no_links(area: Area) -> None:
    """Directories say nlink 1, as gcsfuse's (their subdirectories are not counted): with
    2, find's leaf optimisation (nlink - 2 subdirectories) may skip what is below."""
    for name in ("a/b/c/f1", "a/b/f2", "a/d/f3", "e/f4"):
        (area.path / name).parent.mkdir(parents=True, exist_ok=True)
        (area.path / name).write_bytes(b"x")
    assert os.stat(area.path / "a").st_nlink == 1
    found = subprocess.run(
        ["find", str(area.path), "-type", "f"], capture_output=True, text=True, check=True
    ).stdout.split()
    assert sorted(os.path.relpath(p, area.path) for p in found) == [
        "a/b/c/f1",
        "a/b/f2",
        "a/d/f3",
        "e/f4",
    ]


def test_hard_link_unsupported(area: Area, gcs_client: storage.Client) -> None:
    (area.path / "f").write_bytes(b"f")
    # tierfs answers LINK with ENOSYS, as gcsfuse does; Linux's FUSE client turns ENOSYS
    # from LINK into EPERM (fs/fuse/dir.c, fuse_link), which is what the caller sees.
    raises_errno(errno.EPERM, os.link, area.path / "f", area.path / "hard")
    assert area_objects(gcs_client, area) == {"f"}
    assert os.stat(area.path / "f").st_nlink == 1
    assert subprocess.run(["ln", str(area.path / "f"), str(area.path / "h2")]).returncode != 0


def test_xattrs_unsupported(area: Area, gcs_client: storage.Client) -> None:
    (area.path / "f").write_bytes(b"f")
    # tierfs answers ENOSYS (gcsfuse); the kernel then reports EOPNOTSUPP for xattr calls.
    for target in (area.path / "f", area.path):
        raises_errno(errno.ENOTSUP, os.setxattr, target, "user.k", b"v")
        raises_errno(errno.ENOTSUP, os.getxattr, target, "user.k")
        raises_errno(errno.ENOTSUP, os.listxattr, target)
        raises_errno(errno.ENOTSUP, os.removexattr, target, "user.k")
    assert blob_metadata(gcs_client, area.bucket, area.obj("f")).keys() == {"gcsfuse_mtime"}


def test_mknod_special_files_unsupported(area: Area, gcs_client: storage.Client) -> None:
    raises_errno(errno.ENOTSUP, os.mkfifo, area.path / "fifo")
    raises_errno(errno.ENOTSUP, os.mknod, area.path / "sock", 0o644 | stat.S_IFSOCK)
    assert area_objects(gcs_client, area) == set()
    assert os.listdir(area.path) == []


def test_mknod_regular_file_creates_empty_object(area: Area, gcs_client: storage.Client) -> None:
    os.mknod(area.path / "plain", 0o644 | stat.S_IFREG)
    assert blob_bytes(gcs_client, area.bucket, area.obj("plain")) == b""
    assert stat.S_ISREG(os.stat(area.path / "plain").st_mode)


def test_chmod_chown_accepted_and_ignored(area: Area, gcs_client: storage.Client) -> None:
    path = area.path / "f"
    path.write_bytes(b"f")
    os.mkdir(area.path / "d")
    before = {b.name: (b.generation, b.metageneration) for b in gcs_client.list_blobs(area.bucket)}
    os.chmod(path, 0o600)
    os.chmod(area.path / "d", 0o700)
    os.chown(path, 4242, 4343)
    run("chmod", "a+x", path)
    st = os.stat(path)
    assert (stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid) == (0o644, os.getuid(), os.getgid())
    assert stat.S_IMODE(os.stat(area.path / "d").st_mode) == 0o755
    after = {b.name: (b.generation, b.metageneration) for b in gcs_client.list_blobs(area.bucket)}
    assert after == before
    assert path.read_bytes() == b"f"


# --- big files and trees --------------------------------------------------------------------


def test_large_file_round_trip(area: Area, gcs_client: storage.Client) -> None:
    data = os.urandom(64 << 20)
    (area.path / "big.bin").write_bytes(data)
    assert os.stat(area.path / "big.bin").st_size == len(data)
    assert blob_bytes(gcs_client, area.bucket, area.obj("big.bin")) == data
    assert (area.path / "big.bin").read_bytes() == data


def make_tree(root: Path, seed: int) -> list[Path]:
    """~50 files of varied sizes (empty, tiny, page-sized, 2 MiB) in nested directories."""
    rng = random.Random(seed)
    sizes = [0, 0, 1, 100, 4095, 4096, 4097, 65_537, 131_072, 2 << 20]
    files = []
    for i in range(50):
        directory = root / f"d{i % 4}" / (f"s{i % 3}" if i % 2 else "")
        directory.mkdir(parents=True, exist_ok=True)
        size = sizes[i] if i < len(sizes) else rng.randrange(0, 200_000)
        path = directory / f"f{i:02d}.bin"
        path.write_bytes(rng.randbytes(size))
        os.utime(path, (1_700_000_000 + i, 1_700_000_000 + i))
        files.append(path)
    (root / "empty-dir").mkdir()
    return files


def test_tar_round_trip(area: Area, gcs_client: storage.Client, tmp_path: Path) -> None:
    src = tmp_path / "src"
    files = make_tree(src, seed=11)
    assert len(files) == 50

    # tar into the mount, untar elsewhere.
    run("tar", "-C", src, "-cf", area.path / "tree.tar", ".")
    out = tmp_path / "out"
    out.mkdir()
    run("tar", "-C", out, "-xf", area.path / "tree.tar")
    run("diff", "-r", src, out)
    local_tar = tmp_path / "tree.tar"
    run("tar", "-C", src, "-cf", local_tar, ".")
    assert blob_bytes(gcs_client, area.bucket, area.obj("tree.tar")) == local_tar.read_bytes()

    # untar into the mount.
    os.mkdir(area.path / "unpacked")
    run("tar", "-C", area.path / "unpacked", "-xf", local_tar)
    run("diff", "-r", src, area.path / "unpacked")
    prefix = area.obj("unpacked/")
    blobs = {b.name[len(prefix) :]: b for b in gcs_client.list_blobs(area.bucket, prefix=prefix)}
    expected_files = {str(f.relative_to(src)) for f in files}
    expected_dirs = {str(d.relative_to(src)) + "/" for d in src.rglob("*") if d.is_dir()}
    assert set(blobs) == expected_files | expected_dirs | {""}
    for f in files:
        rel = str(f.relative_to(src))
        assert blobs[rel].download_as_bytes() == f.read_bytes(), rel
        # tar restores mtimes: they land in gcsfuse_mtime.
        when = datetime.datetime.fromtimestamp(f.stat().st_mtime, tz=datetime.UTC)
        assert blobs[rel].metadata["gcsfuse_mtime"] == when.strftime("%Y-%m-%dT%H:%M:%SZ"), rel


def test_read_ahead_kb_applied(mount_factory: MountFactory) -> None:
    mount = mount_factory("-o", "read_ahead_kb=1024")
    device = mountpoint.device_of(str(mount.path))
    assert device is not None
    with open(f"/sys/class/bdi/{device}/read_ahead_kb", encoding="ascii") as knob:
        assert knob.read().strip() == "1024"


def test_read_ahead_is_one_mib_by_default_and_0_keeps_the_kernels(
    mount_factory: MountFactory,
) -> None:
    """By default the kernel sends 1 MiB reads (read_ahead_kb=1024); 0 leaves its value."""
    values = []
    for name, args in (("default", ()), ("kernel", ("--read-ahead-kb=0",))):
        mount = mount_factory(*args, name=name)
        device = mountpoint.device_of(str(mount.path))
        assert device is not None
        with open(f"/sys/class/bdi/{device}/read_ahead_kb", encoding="ascii") as knob:
            values.append(int(knob.read()))
    assert values[0] == 1024
    assert values[1] != 1024
