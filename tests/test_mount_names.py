"""Names through a real mount: implicit directories, placeholders, conflicts, odd object
names written by other clients, long listings, invalid and long names.

gcsfuse's rules (``/work/shared/reference/gcsfuse.md`` §3.1): a directory exists when its
placeholder ``dir/`` exists, or with ``--implicit-dirs`` when any object lies below it;
without the flag a listing may show a prefix whose lookup then fails ENOENT; ``foo`` and
``foo/`` together show as the directory ``foo`` and the file ``foo\\n``; names with
``//``, ``/./``, ``/../`` are hidden. Whatever a bucket holds, nothing may appear outside
the mountpoint and the mount must keep serving.

Most tests share one bucket mounted twice (default options, and ``--implicit-dirs``) and
work under names of their own; the odd-names test gets a fresh bucket because it needs
the bucket's root.
"""

from __future__ import annotations

import errno
import os
import re
import stat
import subprocess
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from google.cloud import storage

from tests.mounting import Mount, stats
from tierfs.cli.emulator import Emulator

MountFactory = Callable[..., Mount]

# --- one bucket, two mounts; a name per test ---------------------------------------------


@dataclass
class Pair:
    plain: Mount  # default options
    implicit: Mount  # --implicit-dirs

    @property
    def bucket(self) -> str:
        return self.plain.bucket


@dataclass
class Area:
    """A test's own names: a directory ``name/`` (with placeholder) in the shared bucket."""

    pair: Pair
    name: str
    expect_errors: bool = False
    log_starts: dict[Path, int] = field(default_factory=dict)

    @property
    def bucket(self) -> str:
        return self.pair.bucket

    @property
    def plain(self) -> Path:
        return self.pair.plain.path / self.name

    @property
    def implicit(self) -> Path:
        return self.pair.implicit.path / self.name

    def obj(self, relative: str) -> str:
        return f"{self.name}/{relative}"

    def new_errors(self) -> list[str]:
        errors = []
        for log, start in self.log_starts.items():
            with open(log, "rb") as f:
                f.seek(start)
                text = f.read().decode("utf-8", "replace")
            errors += [line for line in text.splitlines() if " ERROR " in line]
        return errors


@pytest.fixture(scope="module")
def pair(emulator: Emulator, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pair]:
    bucket = f"tierfs-names-{uuid.uuid4().hex[:12]}"
    emulator.create_bucket(bucket)
    root = tmp_path_factory.mktemp("names-shared")
    plain = Mount(emulator, bucket, root / "plain", root / "plain.log", [])
    implicit = Mount(
        emulator, bucket, root / "implicit", root / "implicit.log", ["--implicit-dirs"]
    )
    try:
        plain.start()
        implicit.start()
        yield Pair(plain, implicit)
    finally:
        implicit.cleanup()
        plain.cleanup()


@pytest.fixture
def area(pair: Pair, request: pytest.FixtureRequest) -> Iterator[Area]:
    name = re.sub(r"[^A-Za-z0-9_.-]", "_", request.node.name)
    here = Area(pair, name)
    for mount in (pair.plain, pair.implicit):
        here.log_starts[mount.log] = mount.log.stat().st_size if mount.log.exists() else 0
    os.mkdir(pair.plain.path / name)
    yield here
    errors = here.new_errors()
    if errors and not here.expect_errors:
        pytest.fail(f"unexpected errors in the daemon logs: {errors[:3]}")


# --- helpers ------------------------------------------------------------------------------


def upload(client: storage.Client, bucket: str, name: str, data: bytes) -> None:
    client.bucket(bucket).blob(name).upload_from_string(data)


def blob_bytes(client: storage.Client, bucket: str, name: str) -> bytes:
    return client.bucket(bucket).blob(name).download_as_bytes()


def names_under(client: storage.Client, bucket: str, prefix: str = "") -> set[str]:
    return {
        b.name[len(prefix) :] for b in client.list_blobs(bucket, prefix=prefix) if b.name != prefix
    }


def raises_errno(code: int, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
    with pytest.raises(OSError) as info:
        fn(*args, **kwargs)
    got = info.value.errno
    assert got == code, (
        f"expected {errno.errorcode[code]}, got {errno.errorcode.get(got or 0, got)}: "
        f"{info.value!r}"
    )


# --- directories: implicit, placeholder, conflicts -----------------------------------------


def test_prefix_without_placeholder_needs_implicit_dirs(
    pair: Pair, gcs_client: storage.Client
) -> None:
    """``x/y`` from another client, no ``x/``: without --implicit-dirs the root listing shows
    ``x`` (GCS returns the prefix) but ``x`` cannot be looked up (gcsfuse: "listings may show
    names that then ENOENT"); with the flag ``x`` is a directory and ``x/y`` a file."""
    x = f"implicit-{uuid.uuid4().hex[:8]}"
    upload(gcs_client, pair.bucket, f"{x}/y", b"why")
    upload(gcs_client, pair.bucket, f"{x}/sub/deeper/z", b"zed")

    plain, implicit = pair.plain.path, pair.implicit.path
    assert x in os.listdir(plain)
    raises_errno(errno.ENOENT, os.stat, plain / x)
    raises_errno(errno.ENOENT, os.stat, plain / x / "y")
    raises_errno(errno.ENOENT, open, plain / x / "y", "rb")

    assert x in os.listdir(implicit)
    assert stat.S_ISDIR(os.stat(implicit / x).st_mode)
    assert sorted(os.listdir(implicit / x)) == ["sub", "y"]
    assert (implicit / x / "y").read_bytes() == b"why"
    assert (implicit / x / "sub" / "deeper" / "z").read_bytes() == b"zed"

    # A file written into an implicit directory lands below the prefix, no placeholder made.
    (implicit / x / "new").write_bytes(b"new")
    assert names_under(gcs_client, pair.bucket, f"{x}/") == {"y", "sub/deeper/z", "new"}

    # Deleting the last objects below it makes the implicit directory vanish from the
    # listing; this mount keeps it, empty, for the metadata TTL or until its rmdir (as
    # gcsfuse's type cache does), which is what `rm -rf` makes next.
    os.unlink(implicit / x / "y")
    os.unlink(implicit / x / "new")
    os.unlink(implicit / x / "sub" / "deeper" / "z")
    assert names_under(gcs_client, pair.bucket, f"{x}/") == set()
    assert x not in os.listdir(implicit)
    assert os.listdir(implicit / x) == []
    os.rmdir(implicit / x / "sub" / "deeper")
    os.rmdir(implicit / x / "sub")
    os.rmdir(implicit / x)
    raises_errno(errno.ENOENT, os.stat, implicit / x)

    # mkdir gives the plain mount what it needs: a placeholder.
    upload(gcs_client, pair.bucket, f"{x}/again", b"again")
    os.mkdir(plain / x)
    assert (plain / x / "again").read_bytes() == b"again"
    assert os.listdir(plain / x) == ["again"]


def test_placeholder_makes_dir_visible_without_implicit_dirs(
    area: Area, gcs_client: storage.Client
) -> None:
    upload(gcs_client, area.bucket, area.obj("pd/"), b"")
    upload(gcs_client, area.bucket, area.obj("pd/f"), b"eff")
    upload(gcs_client, area.bucket, area.obj("pd/sub/g"), b"gee")  # no pd/sub/ placeholder
    assert os.listdir(area.plain) == ["pd"]
    assert stat.S_ISDIR(os.stat(area.plain / "pd").st_mode)
    assert sorted(os.listdir(area.plain / "pd")) == ["f", "sub"]
    assert (area.plain / "pd" / "f").read_bytes() == b"eff"
    raises_errno(errno.ENOENT, os.stat, area.plain / "pd" / "sub")
    assert (area.implicit / "pd" / "sub" / "g").read_bytes() == b"gee"
    # An empty directory (placeholder only) is a directory too.
    upload(gcs_client, area.bucket, area.obj("empty/"), b"")
    assert os.listdir(area.plain / "empty") == []
    assert sorted(os.listdir(area.plain)) == ["empty", "pd"]


def conflict(area: Area, client: storage.Client) -> None:
    upload(client, area.bucket, area.obj("foo"), b"i am the file")
    upload(client, area.bucket, area.obj("foo/"), b"")
    upload(client, area.bucket, area.obj("foo/in"), b"inside")


def test_file_and_dir_with_one_name_listing(area: Area, gcs_client: storage.Client) -> None:
    conflict(area, gcs_client)
    for root in (area.plain, area.implicit):
        assert sorted(os.listdir(root)) == ["foo", "foo\n"]
        assert stat.S_ISDIR(os.stat(root / "foo").st_mode)
        st = os.stat(root / "foo\n")
        assert stat.S_ISREG(st.st_mode) and st.st_size == len(b"i am the file")
        assert os.listdir(root / "foo") == ["in"]
        assert (root / "foo" / "in").read_bytes() == b"inside"
    # Implicit directory next to a file: the same convention.
    upload(gcs_client, area.bucket, area.obj("bar"), b"bar file")
    upload(gcs_client, area.bucket, area.obj("bar/in"), b"bar inside")
    assert sorted(os.listdir(area.implicit)) == ["bar", "bar\n", "foo", "foo\n"]
    assert stat.S_ISDIR(os.stat(area.implicit / "bar").st_mode)
    assert (area.implicit / "bar" / "in").read_bytes() == b"bar inside"


def test_names_that_would_collide_map_to_one_object_each(
    area: Area, gcs_client: storage.Client
) -> None:
    """``foo``, ``foo/`` and an object named ``foo\\n`` (GCS refuses such names; an emulator
    holds them): one entry per name, and ``foo\\n`` is the file ``foo``, never the other
    object under ``foo``'s generation (that was ESTALE, and killed a daemon with a cache
    dir). The hidden object is counted. A lone file is not also reachable as ``bar\\n``."""
    conflict(area, gcs_client)
    upload(gcs_client, area.bucket, area.obj("foo\n"), b"i am hidden")
    upload(gcs_client, area.bucket, area.obj("bar"), b"lone")
    for mount, root in ((area.pair.plain, area.plain), (area.pair.implicit, area.implicit)):
        assert sorted(os.listdir(root)) == ["bar", "foo", "foo\n"]
        assert (root / "foo\n").read_bytes() == b"i am the file"
        with pytest.raises(FileNotFoundError):
            (root / "bar\n").stat()
        assert (root / "bar").read_bytes() == b"lone"
        assert stats(mount)["hidden_names"] >= 1


def test_file_and_dir_with_one_name_unlink_file(area: Area, gcs_client: storage.Client) -> None:
    conflict(area, gcs_client)
    os.unlink(area.plain / "foo\n")
    assert names_under(gcs_client, area.bucket, area.obj("")) == {"foo/", "foo/in"}
    assert os.listdir(area.plain) == ["foo"]
    assert (area.plain / "foo" / "in").read_bytes() == b"inside"


def test_file_and_dir_with_one_name_file_readable(area: Area, gcs_client: storage.Client) -> None:
    conflict(area, gcs_client)
    assert (area.plain / "foo\n").read_bytes() == b"i am the file"
    assert (area.implicit / "foo\n").read_bytes() == b"i am the file"


def test_file_and_dir_with_one_name_file_writable(area: Area, gcs_client: storage.Client) -> None:
    conflict(area, gcs_client)
    with open(area.plain / "foo\n", "r+b") as f:
        f.write(b"I AM")
    assert blob_bytes(gcs_client, area.bucket, area.obj("foo")) == b"I AM the file"
    assert names_under(gcs_client, area.bucket, area.obj("")) == {"foo", "foo/", "foo/in"}


def test_file_and_dir_with_one_name_file_renamable(area: Area, gcs_client: storage.Client) -> None:
    conflict(area, gcs_client)
    os.rename(area.plain / "foo\n", area.plain / "renamed")
    assert names_under(gcs_client, area.bucket, area.obj("")) == {"renamed", "foo/", "foo/in"}
    assert blob_bytes(gcs_client, area.bucket, area.obj("renamed")) == b"i am the file"


@pytest.mark.parametrize("how", ["rmdir", "rename"])
def test_file_and_dir_with_one_name_the_file_shows_once_the_dir_is_gone(
    area: Area, gcs_client: storage.Client, how: str
) -> None:
    """``foo`` beside an empty ``foo/``: once the directory is removed or renamed, ``foo``
    is the file (it was ENOENT for negative-ttl-secs: the removal cached "nothing there")."""
    upload(gcs_client, area.bucket, area.obj("foo"), b"i am the file")
    upload(gcs_client, area.bucket, area.obj("foo/"), b"")
    assert stat.S_ISDIR(os.stat(area.plain / "foo").st_mode)
    if how == "rmdir":
        os.rmdir(area.plain / "foo")
        assert names_under(gcs_client, area.bucket, area.obj("")) == {"foo"}
    else:
        os.rename(area.plain / "foo", area.plain / "bar")
        assert names_under(gcs_client, area.bucket, area.obj("")) == {"foo", "bar/"}
        assert stat.S_ISDIR(os.stat(area.plain / "bar").st_mode)
    assert stat.S_ISREG(os.stat(area.plain / "foo").st_mode)
    assert (area.plain / "foo").read_bytes() == b"i am the file"


# --- listings ---------------------------------------------------------------------------------


def test_listing_past_one_page(area: Area, gcs_client: storage.Client) -> None:
    """1,100 entries: more than one page of 1,000 from GCS; every one listed once."""
    bucket = gcs_client.bucket(area.bucket)
    expected = [f"entry-{i:04d}" for i in range(1100)]

    def make(name: str) -> None:
        bucket.blob(area.obj(name)).upload_from_string(name.encode())

    with ThreadPoolExecutor(max_workers=16) as pool:
        list(pool.map(make, expected))
    for root in (area.plain, area.implicit):
        listed = os.listdir(root)
        assert len(listed) == 1100
        assert sorted(listed) == expected
    out = subprocess.run(["ls", "-1", str(area.plain)], capture_output=True, text=True, check=True)
    assert out.stdout.splitlines() == expected
    assert (area.plain / "entry-1099").read_bytes() == b"entry-1099"
    assert (area.plain / "entry-0000").read_bytes() == b"entry-0000"


# --- odd names from other clients --------------------------------------------------------------

DEEP_1024 = "deep/" + "/".join(["k" * 200] * 4) + "/" + "t" * 215  # 1,024 bytes, parts <= 255
ODD_NAMES = [
    "a//b",
    "./x",
    "../x",
    "x/./y",
    "x/../y",
    "nl\nname",
    "long/" + "p" * 300,
    "q" * 300,
    "L" * 1024,
    DEEP_1024,
    ".",
    "..",
    "/lead",
    "../../escape",
    "d/../../../esc3",
    "sp ace.txt",
    "ünïcødé-😀.txt",
    "h#sh",
    "q?mark",
    "pct%20x",
    "pct%",
]
# Reachable files (path in the mount -> object name); everything else must stay hidden.
VISIBLE_FILES = {"normal.txt", "nl\nname", "sp ace.txt", "ünïcødé-😀.txt", "h#sh", "q?mark"}
VISIBLE_FILES |= {"pct%20x", "pct%"}
PREFIX_DIRS = {"a", "x", "long", "deep", "d"}


def walk_files(root: Path) -> tuple[dict[str, bytes], list[OSError]]:
    files: dict[str, bytes] = {}
    errors: list[OSError] = []
    for dirpath, _dirs, names in os.walk(root, onerror=errors.append):
        for name in names:
            path = Path(dirpath) / name
            files[str(path.relative_to(root))] = path.read_bytes()
    return files, errors


def check_root_listing(root: Path) -> list[str]:
    entries = os.listdir(root)
    assert len(entries) == len(set(entries)), entries
    for entry in entries:
        assert entry not in ("", ".", ".."), entries
        assert "/" not in entry and "\0" not in entry, entries
        assert len(entry.encode()) <= 255, entries
        assert entry in VISIBLE_FILES | PREFIX_DIRS, entry
    return entries


def test_odd_object_names_from_other_clients(
    mount_factory: MountFactory, gcs_client: storage.Client, tmp_path: Path
) -> None:
    plain = mount_factory()
    implicit = mount_factory("--implicit-dirs", name="implicit")
    bucket = plain.bucket
    assert len(DEEP_1024.encode()) == 1024 and len(ODD_NAMES[8].encode()) == 1024
    upload(gcs_client, bucket, "normal.txt", b"normal")
    outside = tmp_path.parent
    before_outside = set(os.listdir(outside))
    before_tmp = set(os.listdir(tmp_path))

    for name in ODD_NAMES:
        upload(gcs_client, bucket, name, name.encode())
        for mount in (plain, implicit):
            check_root_listing(mount.path)
            assert (mount.path / "normal.txt").read_bytes() == b"normal", name
            assert mount.is_mounted() and mount.pids(), name
        assert set(os.listdir(tmp_path)) == before_tmp, name
        assert set(os.listdir(outside)) == before_outside, name

    for mount in (plain, implicit):
        assert VISIBLE_FILES <= set(check_root_listing(mount.path))
        for name in VISIBLE_FILES - {"normal.txt"}:
            assert (mount.path / name).read_bytes() == name.encode(), name

    # With implicit dirs every reachable file is a legal path and reads its own object;
    # the objects whose names are not paths are unreachable.
    files, errors = walk_files(implicit.path)
    assert errors == []
    assert files == {name: name.encode() for name in VISIBLE_FILES - {"normal.txt"}} | {
        "normal.txt": b"normal",
        DEEP_1024: DEEP_1024.encode(),
    }
    for prefix in ("a", "x", "long", "d"):
        assert os.listdir(implicit.path / prefix) == [], prefix

    # Without them the prefixes are listed but cannot be entered (ENOENT, nothing else).
    files, errors = walk_files(plain.path)
    assert {e.errno for e in errors} == {errno.ENOENT}
    assert set(files) == VISIBLE_FILES

    assert set(os.listdir(tmp_path)) == before_tmp
    assert set(os.listdir(outside)) == before_outside
    assert not (outside / "escape").exists() and not (outside / "esc3").exists()


# --- names created through the mount ---------------------------------------------------------


def test_non_utf8_name_rejected(area: Area, gcs_client: storage.Client) -> None:
    root = os.fsencode(area.plain)
    bad = root + b"/bad\xff"
    raises_errno(errno.EINVAL, os.open, bad, os.O_CREAT | os.O_WRONLY)
    raises_errno(errno.EINVAL, os.mkdir, bad)
    raises_errno(errno.EINVAL, os.symlink, b"target", bad)
    (area.plain / "good").write_bytes(b"good")
    raises_errno(errno.EINVAL, os.rename, os.fsencode(area.plain / "good"), bad)
    # The mount keeps working, and only the good name reached GCS.
    (area.plain / "after").write_bytes(b"after")
    assert (area.plain / "after").read_bytes() == b"after"
    assert sorted(os.listdir(area.plain)) == ["after", "good"]
    assert names_under(gcs_client, area.bucket, area.obj("")) == {"after", "good"}


def test_non_utf8_symlink_target_rejected(area: Area, gcs_client: storage.Client) -> None:
    area.expect_errors = True  # checked below, inside the test
    raises_errno(errno.EINVAL, os.symlink, b"\xff\xfe", os.fsencode(area.plain / "link"))
    assert names_under(gcs_client, area.bucket, area.obj("")) == set()
    assert area.new_errors() == []


def test_name_with_newline_rejected_at_create(area: Area, gcs_client: storage.Client) -> None:
    area.expect_errors = True  # checked below, inside the test
    for name in ("new\nline", "cr\rname"):
        try:
            fd = os.open(area.plain / name, os.O_CREAT | os.O_WRONLY)
        except OSError as err:
            assert err.errno == errno.EINVAL, err
            continue
        try:
            os.close(fd)
        except OSError as err:
            pytest.fail(f"create of {name!r} succeeded, close failed: {err!r}")
        pytest.fail(f"create of {name!r} succeeded")
    assert os.listdir(area.plain) == []
    assert names_under(gcs_client, area.bucket, area.obj("")) == set()
    assert area.new_errors() == []


def test_name_length_limits(area: Area, gcs_client: storage.Client) -> None:
    ascii_255 = "a" * 255
    multibyte_255 = "é" * 127 + "z"  # 254 + 1 bytes
    for name in (ascii_255, multibyte_255):
        assert len(name.encode()) == 255
        (area.plain / name).write_bytes(name.encode())
        assert (area.plain / name).read_bytes() == name.encode()
    os.mkdir(area.plain / ("D" * 255))
    assert sorted(os.listdir(area.plain)) == sorted([ascii_255, multibyte_255, "D" * 255])
    assert names_under(gcs_client, area.bucket, area.obj("")) == {
        ascii_255,
        multibyte_255,
        "D" * 255 + "/",
    }

    for name in ("b" * 256, "é" * 128):
        assert len(name.encode()) == 256
        raises_errno(errno.ENAMETOOLONG, open, area.plain / name, "wb")
        raises_errno(errno.ENAMETOOLONG, os.mkdir, area.plain / name)
        raises_errno(errno.ENAMETOOLONG, os.symlink, "t", area.plain / name)
        raises_errno(errno.ENAMETOOLONG, os.rename, area.plain / ascii_255, area.plain / name)
    assert len(names_under(gcs_client, area.bucket, area.obj(""))) == 3


def test_object_name_longer_than_gcs_allows(area: Area, gcs_client: storage.Client) -> None:
    area.expect_errors = True  # checked below, inside the test
    deep = area.plain
    for letter in "abc":
        deep = deep / (letter * 250)
        os.mkdir(deep)
    # area name + 3 x 251 bytes: one more 255-byte name passes GCS's 1,024-byte limit.
    raises_errno(errno.ENAMETOOLONG, open, deep / ("f" * 255), "wb")
    raises_errno(errno.ENAMETOOLONG, os.mkdir, deep / ("g" * 255))
    (deep / "ok").write_bytes(b"ok")
    assert (deep / "ok").read_bytes() == b"ok"
    assert area.new_errors() == []


def test_special_characters_round_trip(area: Area, gcs_client: storage.Client) -> None:
    names = [
        "sp ace",
        "  lead and trail  ",
        "ünïcødé-😀",
        "日本語",
        "h#sh",
        "q?mark",
        "pct%20x",
        "100%",
        "semi;colon",
        "star*",
        "quote'\"",
        "back\\slash",
        "tab\there",
        "+plus&amp=",
        "~tilde",
        "-dash",
    ]
    for name in names:
        (area.plain / name).write_bytes(name.encode())
    assert names_under(gcs_client, area.bucket, area.obj("")) == set(names)
    for name in names:
        assert blob_bytes(gcs_client, area.bucket, area.obj(name)) == name.encode(), name
        assert (area.implicit / name).read_bytes() == name.encode(), name
    assert sorted(os.listdir(area.implicit)) == sorted(names)


def test_rm_rf_of_a_tree_without_placeholders_removes_it_all(
    mount_factory: MountFactory, gcs_client: storage.Client, bucket_name: str
) -> None:
    """A step saved by another tool has no directory placeholders below its top: with
    --implicit-dirs its subdirectories exist only through their objects, and vanish with
    the last one. The rmdir that `rm -rf` makes of each right after still succeeds (as in
    gcsfuse), without and with write-back."""
    import shutil

    bucket = gcs_client.bucket(bucket_name)
    for name in ("t/", *(f"t/d{i % 2}/f{i}" for i in range(6)), "u/d/f"):
        bucket.blob(name).upload_from_string(b"x")
    mount = mount_factory("--implicit-dirs")
    shutil.rmtree(mount.path / "t")
    assert os.listdir(mount.path) == ["u"]
    assert [b.name for b in gcs_client.list_blobs(bucket_name)] == ["u/d/f"]
    with pytest.raises(FileNotFoundError):
        (mount.path / "t" / "d0").stat()


def test_a_directory_past_the_prefetch_cut_is_a_directory(
    mount_factory: MountFactory, gcs_client: storage.Client, bucket_name: str
) -> None:
    """'foo-v2' and 'foo.bak' sort between 'foo' and 'foo/': a directory's listing made
    ahead and cut between them said nothing of 'foo/', and 'foo' was taken for a file:
    ``stat`` said regular file and ``ls foo/`` ENOTDIR. gcsfuse: the directory ``foo``
    and the file ``foo\n``. The prefetch is cut at 10 names here; at the defaults the cut
    comes at 5,000 (1,000 for a subdirectory listed ahead), where the full read of the
    directory that follows (`tierfs.core.prefill`) mended it, unless a stat came first."""
    bucket = gcs_client.bucket(bucket_name)
    names = ["d/", *(f"d/{n}" for n in ("a0", "a1", "a2", "a3", "a4", "a5", "a6", "foo"))]
    names += ["d/foo-v2", "d/foo.bak", "d/foo/x"]  # the cut: after 'foo-v2'
    for name in names:
        bucket.blob(name).upload_from_string(b"x")
    mount = mount_factory("--implicit-dirs", "--metadata-prefetch-entries-limit=10")
    d = mount.path / "d"
    assert (d / "a0").stat().st_size == 1  # lists d ahead, cut at 'foo-v2'
    assert stat.S_ISDIR((d / "foo").stat().st_mode)
    assert os.listdir(d / "foo") == ["x"]
    assert (d / "foo\n").read_bytes() == b"x"
