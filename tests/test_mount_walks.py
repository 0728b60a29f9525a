"""A cold walk (``ls -lR``, ``find``, ``os.walk``) of a tree through a real mount.

A tree written by gcsfuse has a placeholder object for every directory. A listing asks
GCS for those beside the prefixes (``includeTrailingDelimiter``), so the directories it
names need no lookup of their own; and listing a directory lists its subdirectories
ahead of the walker (`tierfs.core.listahead`), so each readdir finds its answer waiting
instead of waiting one round trip after another. Counted in GCS requests (`tierfs
stats`): times are measured by `benchmarks` (meta), never asserted here."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from google.cloud import storage

from tests.conftest import MountFactory
from tests.mounting import stats
from tests.test_options_forms import CHECKPOINT_LINE


def make_tree(client: storage.Client, bucket: str) -> tuple[dict[str, int], int]:
    """A tree as gcsfuse writes it (placeholders included), nested two levels; the
    files with their sizes, and the number of directories (the root included)."""
    files: dict[str, int] = {}
    dirs = ["a", "b", "c", "a/deep", "b/deep", "a/deep/deeper"]
    blobs = client.bucket(bucket)
    for d in dirs:
        blobs.blob(f"{d}/").upload_from_string(b"")
        for i in range(4):
            name = f"{d}/f{i}"
            blobs.blob(name).upload_from_string(b"x" * (i + len(d)))
            files[name] = i + len(d)
    blobs.blob("top").upload_from_string(b"top")
    files["top"] = 3
    return files, len(dirs) + 1


def walk(root: Path) -> dict[str, int]:
    """What ``ls -lR`` does: readdir each directory, lstat each entry."""
    found: dict[str, int] = {}
    stack = [root]
    while stack:
        directory = stack.pop()
        with os.scandir(directory) as entries:
            for entry in entries:
                info = entry.stat(follow_symlinks=False)
                if stat.S_ISDIR(info.st_mode):
                    stack.append(Path(entry.path))
                else:
                    found[str(Path(entry.path).relative_to(root))] = info.st_size
    return found


def test_a_cold_walk_at_the_defaults_lists_each_directory_once_and_looks_up_none(
    mount_factory: MountFactory, gcs_client: storage.Client, bucket_name: str
) -> None:
    files, dirs = make_tree(gcs_client, bucket_name)
    mount = mount_factory()  # the defaults: no implicit-dirs, no list cache
    before = stats(mount)["gcs"]  # (the mount's own check of the bucket is a listing)
    assert walk(mount.path) == files
    numbers = stats(mount)
    gcs = numbers["gcs"]
    # Before: two stats per directory (its object and its placeholder), each a round
    # trip before the walker could go in, and a listing of each only once it was there.
    assert gcs["stats"] == before["stats"] == 0
    assert gcs["lists"] - before["lists"] == dirs  # each once: the listings made ahead taken
    assert numbers["directories"]["listed_ahead"] == dirs - 1  # all but the root's

    # Another client's new object shows at the next walk: a listing made ahead answers
    # one readdir only, so the second walk lists GCS again.
    gcs_client.bucket(bucket_name).blob("b/deep/late").upload_from_string(b"late")
    assert walk(mount.path) == {**files, "b/deep/late": 4}


def test_a_cold_walk_with_the_checkpoint_line_lists_each_directory_once(
    mount_factory: MountFactory, gcs_client: storage.Client, bucket_name: str
) -> None:
    files, dirs = make_tree(gcs_client, bucket_name)
    gcs_client.bucket(bucket_name).blob("implied/only/g").upload_from_string(b"g")
    mount = mount_factory("-o", CHECKPOINT_LINE)
    before = stats(mount)["gcs"]
    assert walk(mount.path) == {**files, "implied/only/g": 1}
    gcs = stats(mount)["gcs"]
    assert gcs["stats"] == before["stats"] == 0
    assert gcs["lists"] - before["lists"] == dirs + 2  # and the two implied directories


def test_a_warm_walk_at_the_defaults_finds_its_listings_made_ahead(
    mount_factory: MountFactory, gcs_client: storage.Client, bucket_name: str
) -> None:
    """The same tree walked again within the metadata TTL: its stats come from the
    metadata cache, so nothing is listed ahead for them, but each readdir must list GCS
    again. The walker is seen at its second subdirectory (`Walks`), and the rest are
    listed ahead of it: each directory is still listed once, and another client's new
    object shows."""
    blobs = gcs_client.bucket(bucket_name)
    names = [f"d{i}" for i in range(8)]
    for d in names:
        blobs.blob(f"{d}/").upload_from_string(b"")
        blobs.blob(f"{d}/f").upload_from_string(b"x")
    files = {f"{d}/f": 1 for d in names}
    mount = mount_factory()  # the defaults: metadata TTL 60 s, no list cache
    assert walk(mount.path) == files  # cold: its own listings ahead, taken
    before = stats(mount)
    blobs.blob("d0/late").upload_from_string(b"late")
    assert walk(mount.path) == {**files, "d0/late": 4}
    after = stats(mount)
    assert after["gcs"]["lists"] - before["gcs"]["lists"] == 1 + len(names)  # each once
    assert after["gcs"]["stats"] == before["gcs"]["stats"]
    taken = after["directories"]["listed_ahead"] - before["directories"]["listed_ahead"]
    assert taken == len(names) - 2  # all but the first two the walker went into
