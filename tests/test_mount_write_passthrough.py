"""Write-back files written by the kernel straight into their staged file (FUSE passthrough).

The daemon sees CREATE, FLUSH and RELEASE, no WRITE: counted in `tierfs stats`
(``write_requests``, the daemon's WRITEs; ``passthrough.write_opens``). The same checks run
with ``--write-passthrough=false``, where every write goes through the daemon, so both
paths keep the same contract: equal bytes in GCS, sizes and mtimes right while open, mmap,
appends, truncates, a second open of the file while it is written.
"""

from __future__ import annotations

import mmap
import os
import subprocess
from pathlib import Path

import pytest
from google.cloud import storage

from tests.conftest import MountFactory
from tests.mounting import TIERFS, Mount, stats

MiB = 1 << 20
PATHS = [
    pytest.param((), True, id="passthrough"),
    pytest.param(("--write-passthrough=false",), False, id="daemon"),
]


def synced(mount: Mount) -> None:
    result = subprocess.run(
        [TIERFS, "sync", str(mount.path)], capture_output=True, text=True, timeout=300
    )
    assert (result.returncode, result.stderr) == (0, "")


def blob(client: storage.Client, bucket: str, name: str) -> bytes:
    return client.bucket(bucket).blob(name).download_as_bytes()


@pytest.mark.parametrize(("args", "direct"), PATHS)
def test_a_checkpoint_shard_reaches_gcs_with_equal_bytes(
    mount_factory: MountFactory,
    gcs_client: storage.Client,
    bucket_name: str,
    tmp_path: Path,
    args: tuple[str, ...],
    direct: bool,
) -> None:
    mount = mount_factory("--write-back", f"--cache-dir={tmp_path / 'cache'}", *args)
    data = os.urandom(24 * MiB + 17)
    path = mount.path / "shard-0.distcp"
    with open(path, "wb") as handle:
        for start in range(0, len(data), 4 * MiB):
            handle.write(data[start : start + 4 * MiB])
            handle.flush()
            assert os.stat(path).st_size == min(start + 4 * MiB, len(data))  # while open
        os.fsync(handle.fileno())
    assert path.read_bytes() == data
    synced(mount)
    assert blob(gcs_client, bucket_name, "shard-0.distcp") == data
    numbers = stats(mount)
    if direct:
        assert numbers["write_requests"] == 0
        assert numbers["passthrough"]["write_opens"] == 1
    else:
        assert numbers["write_requests"] >= 6
        assert numbers["passthrough"]["write_opens"] == 0


@pytest.mark.parametrize("args", [p.values[0] for p in PATHS], ids=[p.id for p in PATHS])
def test_append_truncate_mmap_and_a_second_open_while_written(
    mount_factory: MountFactory,
    gcs_client: storage.Client,
    bucket_name: str,
    tmp_path: Path,
    args: tuple[str, ...],
) -> None:
    mount = mount_factory("--write-back", f"--cache-dir={tmp_path / 'cache'}", *args)
    path = mount.path / "state.bin"
    with open(path, "wb") as writer:
        writer.write(b"a" * 10_000)
        writer.flush()
        with open(path, "rb") as reader:  # another open of the same file, meanwhile
            assert reader.read() == b"a" * 10_000
        os.truncate(path, 4096)  # path-based, while open
        writer.seek(0, os.SEEK_END)
        writer.write(b"b" * 100)
    with open(path, "ab") as appender:  # reopened: written through the daemon either way
        appender.write(b"c" * 10)
    expected = b"a" * 4096 + b"b" * 100 + b"c" * 10
    assert path.read_bytes() == expected
    mapped = mount.path / "mapped.bin"
    with open(mapped, "w+b") as handle:
        handle.truncate(2 * mmap.PAGESIZE)
        with mmap.mmap(handle.fileno(), 2 * mmap.PAGESIZE) as region:
            region[:5] = b"hello"
            region[-5:] = b"world"
    synced(mount)
    assert blob(gcs_client, bucket_name, "state.bin") == expected
    body = blob(gcs_client, bucket_name, "mapped.bin")
    assert (body[:5], body[-5:], len(body)) == (b"hello", b"world", 2 * mmap.PAGESIZE)
    mtime = os.stat(path).st_mtime_ns
    remounted = mount.unmount()
    assert remounted.returncode == 0
    again = mount_factory("--write-back", f"--cache-dir={tmp_path / 'cache'}", name="again")
    assert abs(os.stat(again.path / "state.bin").st_mtime_ns - mtime) < 1_000_000
