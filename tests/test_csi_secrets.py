"""A service-account key from nodePublishSecretRef: used by the daemon, never logged, never
readable by others, gone after unpublish. The key is a real (throwaway) RSA key whose
``token_uri`` is a token endpoint of the test's own, so the test sees it used."""

from __future__ import annotations

import json
import stat
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import ClassVar

import grpc
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from google.cloud import storage

from tests.csi_plugin import Plugin, running_plugin
from tierfs.cli.daemon import daemon_pids
from tierfs.cli.emulator import Emulator

pytestmark = pytest.mark.mount


class TokenEndpoint(BaseHTTPRequestHandler):
    served: ClassVar[list[str]] = []

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        TokenEndpoint.served.append(self.path)
        body = json.dumps({"access_token": "t0ken", "expires_in": 3600, "token_type": "Bearer"})
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(body.encode())

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def token_uri() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), TokenEndpoint)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/token"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def service_account_key(token_uri: str) -> tuple[str, str]:
    """(the key file's JSON, its private key PEM)."""
    private = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pem = private.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    ).decode()
    key = {
        "type": "service_account",
        "project_id": "test",
        "private_key_id": "k1",
        "private_key": pem,
        "client_email": "tierfs-test@test.iam.gserviceaccount.com",
        "client_id": "1",
        "token_uri": token_uri,
    }
    return json.dumps(key), pem


@pytest.fixture
def plugin(emulator: Emulator, tmp_path: Path) -> Iterator[Plugin]:
    with running_plugin(emulator, tmp_path) as started:
        yield started


def test_key_is_used_private_and_removed(
    plugin: Plugin, bucket_name: str, gcs_client: storage.Client, token_uri: str
) -> None:
    key_json, pem = service_account_key(token_uri)
    target = plugin.target()
    TokenEndpoint.served.clear()
    plugin.publish(bucket_name, target, [], emulator_flags=(), secrets={"key.json": key_json})

    (pid,) = daemon_pids(str(target))
    argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")
    (flag,) = [a for a in argv if a.startswith("--key-file=")]
    key_file = Path(flag.partition("=")[2])
    assert key_file.read_text() == key_json
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
    assert stat.S_IMODE(key_file.parent.stat().st_mode) == 0o700
    (target / "signed.txt").write_bytes(b"with a key")
    assert gcs_client.bucket(bucket_name).blob("signed.txt").download_as_bytes() == b"with a key"
    assert TokenEndpoint.served, "the daemon never asked for a token with the key"

    plugin.unpublish(bucket_name, target)
    assert not key_file.exists()
    log = plugin.log_text()
    body = pem.splitlines()[1]
    assert body not in log and "PRIVATE KEY" not in log


def test_several_unnamed_secrets_are_refused(plugin: Plugin, bucket_name: str) -> None:
    target = plugin.target()
    with pytest.raises(grpc.RpcError) as caught:
        plugin.publish(bucket_name, target, [], secrets={"a": "s3cr3t-a", "b": "s3cr3t-b"})
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT  # type: ignore[attr-defined]
    assert "key.json" in caught.value.details()  # type: ignore[attr-defined]
    assert "s3cr3t" not in caught.value.details()  # type: ignore[attr-defined]
    assert list(plugin.state_dir.glob("volumes/*")) == []


def test_a_rotated_key_reaches_the_key_file_at_the_next_republish(
    plugin: Plugin, bucket_name: str, token_uri: str
) -> None:
    """The secret is rotated (the old key revoked): the kubelet's next republish brings the
    new key, which is written for the daemon's next start. Before, the republish answered
    OK and kept the old key: every restart of the daemon then failed with it."""
    first, _ = service_account_key(token_uri)
    second, pem = service_account_key(token_uri)
    target = plugin.target()
    plugin.publish(bucket_name, target, [], emulator_flags=(), secrets={"key.json": first})
    (pid,) = daemon_pids(str(target))
    argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")
    (flag,) = [a for a in argv if a.startswith("--key-file=")]
    key_file = Path(flag.partition("=")[2])
    plugin.publish(bucket_name, target, [], emulator_flags=(), secrets={"key.json": second})
    assert key_file.read_text() == second
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
    assert daemon_pids(str(target)) == [pid]  # the mount itself is left alone
    plugin.unpublish(bucket_name, target)
    assert pem.splitlines()[1] not in plugin.log_text()
