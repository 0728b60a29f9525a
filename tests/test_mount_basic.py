"""Everyday tools through a real mount: what lands in GCS is what was written."""

from __future__ import annotations

import gzip
import os
import subprocess

from google.cloud import storage

from tests.conftest import MountFactory
from tests.mounting import TIERFS, Mount, stats


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


def test_a_gzip_encoded_object_reads_as_stored(mount: Mount, gcs_client: storage.Client) -> None:
    """``gcloud storage cp -Z`` stores gzip with ``Content-Encoding: gzip``: the file is
    those bytes, as in gcsfuse (GCS would unzip them for a reader that does not ask for
    gzip, whole and past the size the file has: every read past the first was wrong)."""
    body = gzip.compress(os.urandom(300_000) + b"line\n" * 100_000)
    blob = gcs_client.bucket(mount.bucket).blob("app.js.gz")
    blob.content_encoding = "gzip"
    blob.upload_from_string(body, content_type="application/javascript")
    path = mount.path / "app.js.gz"
    assert path.stat().st_size == len(body)
    assert path.read_bytes() == body
    assert gzip.decompress(path.read_bytes()).endswith(b"line\n")


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


def test_stats_count_the_requests_served_by_operation(
    mount_factory: MountFactory, gcs_client: storage.Client
) -> None:
    """`tierfs stats` counts what the mount served, by operation, as the Prometheus
    metrics do, requests answered at once (a stat the metadata cache knows) included.
    (Metadata TTL 0: at the defaults, two names looked up in a directory its prefetch
    listed let the daemon teach the kernel the rest (`tierfs.core.prefill`), and the third
    stat never came as a LOOKUP: 2 where 4 were counted on, 1 run in 3.)"""
    mount = mount_factory("--metadata-cache-ttl-secs=0")
    bucket = gcs_client.bucket(mount.bucket)
    for name in ("f", "g0", "g1", "g2"):
        bucket.blob(name).upload_from_string(b"0123456789")
    assert (mount.path / "f").read_bytes() == b"0123456789"
    before = stats(mount)["requests"]["operations"]
    for name in ("g0", "g1", "g2"):  # new names to the kernel: one LOOKUP each
        assert os.stat(mount.path / name).st_size == 10
    served = stats(mount)["requests"]["operations"]
    assert served["lookup"]["count"] == before["lookup"]["count"] + 3
    assert served["read"]["count"] >= 1 and served["open"]["count"] >= 1
    assert all(op["seconds"] >= 0 for op in served.values())
    text = subprocess.run(
        [TIERFS, "stats", str(mount.path)], capture_output=True, text=True, timeout=60
    )
    assert text.returncode == 0, text.stderr
    line = next(row for row in text.stdout.splitlines() if row.startswith("requests"))
    assert "in flight 0" in line, line
    served_now = int(line.split("served ")[1].split()[0])
    assert served_now >= sum(op["count"] for op in served.values()), line


def test_the_daemon_keeps_its_startup_objects_out_of_python_collections(mount: Mount) -> None:
    """`tierfs.fuse.collector`: the objects the daemon made to set itself up (tens of
    thousands: the GCS client's modules, trio, pyfuse3) are out of every collection, so a
    full one no longer pauses every request for 30-44 ms; `tierfs stats` shows the
    collections and their pauses. (Fails when the daemon does not freeze them: 0.)"""
    for i in range(200):  # requests enough for a few young collections
        (mount.path / f"f{i}").write_bytes(b"x")
    collector = stats(mount)["python_gc"]
    assert collector["frozen_objects"] > 10_000, collector
    young, _middle, full = collector["collections"]
    assert young >= 1 and full >= 1, collector  # (the freeze's own full one, at least)
    assert 0 < collector["longest_pause_s"] <= collector["paused_s"], collector
    text = subprocess.run(
        [TIERFS, "stats", str(mount.path)], capture_output=True, text=True, timeout=60
    )
    line = next(row for row in text.stdout.splitlines() if row.startswith("python gc"))
    assert f"kept out of collections {collector['frozen_objects']}" in line, line
