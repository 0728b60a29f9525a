"""``tierfs prefetch``: warms the tiers ahead of a job; a bar on a terminal, one line otherwise."""

from __future__ import annotations

import os
import shlex
import subprocess
from pathlib import Path

import pytest
from google.cloud import storage

from tests.conftest import MountFactory
from tests.mounting import TIERFS, Mount, stats
from tierfs.cli import prefetch as prefetch_module

MiB = 1 << 20


def test_prefetch_fills_the_ssd_tier(
    mount_factory: MountFactory, gcs_client: storage.Client, bucket_name: str, tmp_path: Path
) -> None:
    data = {f"data/part-{i}": os.urandom(3 * MiB + i) for i in range(5)}
    for name, body in data.items():
        gcs_client.bucket(bucket_name).blob(name).upload_from_string(body)
    cache = tmp_path / "cache"
    mount = mount_factory(f"--cache-dir={cache}", "--implicit-dirs", name="first")
    result = subprocess.run(
        [TIERFS, "prefetch", str(mount.path / "data")], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert len(lines) == 1 and lines[0].startswith("prefetched 5 files, "), result.stdout
    assert result.stderr == ""  # no progress bar when not on a terminal
    assert stats(mount)["data"]["tiers"]["ssd"]["used_bytes"] >= sum(map(len, data.values()))
    assert mount.unmount().returncode == 0
    again = mount_factory(f"--cache-dir={cache}", "--implicit-dirs", name="second")
    for name, body in data.items():
        assert (again.path / name).read_bytes() == body
    assert stats(again)["gcs"]["media_reads"] == 0


def test_prefetch_shows_a_progress_bar_on_a_terminal(
    mount: Mount, gcs_client: storage.Client
) -> None:
    gcs_client.bucket(mount.bucket).blob("f").upload_from_string(os.urandom(2 * MiB))
    command = shlex.join([TIERFS, "prefetch", str(mount.path / "f")])
    # script(1) gives the command a terminal and copies what it shows to our stdout.
    proc = subprocess.run(
        ["script", "-q", "-e", "-c", command, "/dev/null"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "prefetch: 100%" in proc.stdout and "2.00M/2.00M" in proc.stdout, proc.stdout
    assert "prefetched 1 files, 2.0 MiB" in proc.stdout


def test_prefetch_outside_a_mount_is_refused(tmp_path: Path) -> None:
    result = subprocess.run([TIERFS, "prefetch", str(tmp_path)], capture_output=True, text=True)
    assert result.returncode == 1
    assert result.stderr == f"tierfs: {tmp_path} is not inside a tierfs mount\n"


def test_prefetch_of_more_than_the_tiers_hold_says_so_and_reads_only_what_fits(
    mount_factory: MountFactory, gcs_client: storage.Client, bucket_name: str
) -> None:
    """Five 8 MiB files into a 20 MiB RAM tier (no cache dir): one line before it starts,
    and only the two files that fit are downloaded (not 40 MiB to keep 20)."""
    for i in range(5):
        gcs_client.bucket(bucket_name).blob(f"data/part-{i}").upload_from_string(
            os.urandom(8 * MiB)
        )
    mount = mount_factory("--ram-cache-max-size-mb=20", "--implicit-dirs")
    result = subprocess.run(
        [TIERFS, "prefetch", str(mount.path / "data")], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    assert result.stderr == (
        "tierfs: prefetch: 40.0 MiB asked for, the tiers hold 20.0 MiB: warming 2 of 5 files "
        "(16.0 MiB); the rest would evict them\n"
    )
    assert result.stdout.startswith("prefetched 2 files, 16.0 MiB"), result.stdout
    assert stats(mount)["gcs"]["bytes_read"] <= 16 * MiB


def test_prefetch_on_a_mount_that_keeps_nothing_says_so(
    mount_factory: MountFactory, gcs_client: storage.Client, bucket_name: str
) -> None:
    gcs_client.bucket(bucket_name).blob("f").upload_from_string(os.urandom(MiB))
    mount = mount_factory("--ram-cache-max-size-mb=0")
    result = subprocess.run(
        [TIERFS, "prefetch", str(mount.path / "f")], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0 and result.stdout == ""
    assert "the mount keeps no data (no RAM tier, no cache dir): nothing to warm" in result.stderr
    assert stats(mount)["gcs"]["media_reads"] == 0


def test_prefetch_of_a_file_named_twice_reads_it_once(
    mount_factory: MountFactory, gcs_client: storage.Client, bucket_name: str
) -> None:
    """``prefetch data data/part-0``: part-0 counted and read once (twice before, and its
    size twice could say "more than the tiers hold" when it was not)."""
    for i in range(2):
        gcs_client.bucket(bucket_name).blob(f"data/part-{i}").upload_from_string(
            os.urandom(8 * MiB)
        )
    mount = mount_factory("--ram-cache-max-size-mb=20", "--implicit-dirs")
    result = subprocess.run(
        [TIERFS, "prefetch", str(mount.path / "data"), str(mount.path / "data" / "part-0")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert (result.returncode, result.stderr) == (0, "")
    assert result.stdout.startswith("prefetched 2 files, 16.0 MiB"), result.stdout


def test_a_tier_of_unknown_size_bounds_no_prefetch(monkeypatch: pytest.MonkeyPatch) -> None:
    """The shared tier sized by its volume says -1 until its first scan: no bound, not
    a bound of -1 bytes ("the tiers hold -0.0 MiB: warming 0 of 1 files")."""
    answers = {
        "shared": {
            "data": {"tiers": {"ram": {"capacity_bytes": 0}, "shared": {"capacity_bytes": -1}}}
        },
        "ram": {"data": {"tiers": {"ram": {"capacity_bytes": 5}}}},
    }
    monkeypatch.setattr(
        prefetch_module, "request_statistics", lambda mountpoint: answers[mountpoint]
    )
    assert prefetch_module.tier_capacity("shared") is None
    assert prefetch_module.tier_capacity("ram") == 5


def test_a_directory_that_cannot_be_listed_is_said_not_skipped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """os.walk skipped a directory it could not list (EACCES, or EIO from GCS) without a
    word, and prefetch said it had warmed everything, exit 0. The rest is still found;
    the one that failed is kept for the command to name (and exit 1)."""
    for name in ("a/f1", "b/f2", "c/f3"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_bytes(b"x")
    real = os.scandir

    def scandir(path: object = ".") -> object:
        if str(path).endswith("/b"):
            raise PermissionError(13, "Permission denied", str(path))
        return real(path)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "scandir", scandir)
    unlisted: list[OSError] = []
    found = sorted(p.name for p, _ in prefetch_module.files_below([tmp_path], unlisted))
    assert found == ["f1", "f3"]
    assert [(err.filename, err.strerror) for err in unlisted] == [
        (str(tmp_path / "b"), "Permission denied")
    ]
