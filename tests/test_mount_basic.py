"""Everyday tools through a real mount: what lands in GCS is what was written."""

from __future__ import annotations

import os
import subprocess

from google.cloud import storage

from tests.mounting import Mount


def blob_bytes(client: storage.Client, bucket: str, name: str) -> bytes:
    return client.bucket(bucket).blob(name).download_as_bytes()


def test_write_then_read_through_gcs_client(mount: Mount, gcs_client: storage.Client) -> None:
    data = os.urandom(3 << 20) + b"tail"
    (mount.path / "blob.bin").write_bytes(data)
    assert blob_bytes(gcs_client, mount.bucket, "blob.bin") == data
    assert (mount.path / "blob.bin").read_bytes() == data
    assert (mount.path / "blob.bin").stat().st_size == len(data)


def test_objects_from_another_client_appear(mount: Mount, gcs_client: storage.Client) -> None:
    bucket = gcs_client.bucket(mount.bucket)
    bucket.blob("remote.txt").upload_from_string(b"remote\n")
    bucket.blob("d/").upload_from_string(b"")
    bucket.blob("d/inner").upload_from_string(b"inner")
    assert sorted(os.listdir(mount.path)) == ["d", "remote.txt"]
    assert (mount.path / "remote.txt").read_bytes() == b"remote\n"
    assert (mount.path / "d" / "inner").read_bytes() == b"inner"


def test_shell_tools(mount: Mount, gcs_client: storage.Client) -> None:
    script = """
    set -e
    cd "$1"
    mkdir d
    cp /etc/services d/services
    cmp /etc/services d/services
    mv d/services d/s2
    ln -s s2 d/link
    test "$(readlink d/link)" = s2
    cmp /etc/services d/link
    truncate -s 10 d/s2
    test "$(stat -c %s d/s2)" = 10
    rm d/link
    ls -l d > /dev/null
    """
    result = subprocess.run(
        ["bash", "-c", script, "_", str(mount.path)], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr
    names = sorted(b.name for b in gcs_client.list_blobs(mount.bucket))
    assert names == ["d/", "d/s2"]
    with open("/etc/services", "rb") as f:
        assert blob_bytes(gcs_client, mount.bucket, "d/s2") == f.read(10)
