"""The control socket's server on its own (`tierfs.cli.control.serve_control`): nothing it
meets ends the mount. Through a real mount: tests/test_faults.py (a malformed request)."""

from __future__ import annotations

import logging
import socket
import threading
from pathlib import Path

import pytest
import trio

from tierfs.cli import control


async def test_a_socket_that_cannot_be_made_is_one_warning_not_the_mounts_end(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Its directory cannot be made (here: a file stands in the way; another user's
    /tmp/tierfs-UID, or a path too long for a Unix socket, fail the same way): the server
    says so once and returns, and the mount's other tasks go on."""
    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setattr(control, "socket_dir", lambda: blocker / "tierfs")
    with caplog.at_level(logging.WARNING, logger="tierfs"), trio.fail_after(5):
        await control.serve_control(str(tmp_path / "mnt"), {})  # returns, raises nothing
    assert [r.getMessage().split(" (")[0] for r in caplog.records] == ["no control socket"]


async def test_a_mountpoint_whose_name_is_not_utf8_has_a_socket(tmp_path: Path) -> None:
    """(Its name's encode() raised UnicodeEncodeError, in the server and the client.)"""
    name = str(tmp_path) + "/mnt-\udcff"
    assert control.socket_path(name) == control.socket_path(name)
    assert control.socket_path(name).name.endswith(".sock")


def test_a_daemon_that_ends_a_request_without_an_answer_is_an_oserror(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """(The client parsed the empty answer: `tierfs stats` said "internal error:
    JSONDecodeError" when the daemon died mid-request.)"""
    monkeypatch.setattr(control, "socket_dir", lambda: tmp_path)
    path = control.socket_path(str(tmp_path / "mnt"))
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as server:
        server.bind(str(path))
        server.listen(1)

        def hang_up() -> None:
            connection, _ = server.accept()
            connection.recv(100)
            connection.close()

        thread = threading.Thread(target=hang_up)
        thread.start()
        with pytest.raises(OSError, match="without an answer"):
            control.request(str(tmp_path / "mnt"), "stats", 10)
        thread.join()


def listening(path: Path) -> bool:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        try:
            probe.connect(str(path))
        except (FileNotFoundError, ConnectionRefusedError):
            return False
    return True


async def test_a_daemon_leaves_another_daemons_socket_in_place(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A stuck daemon taken off lazily, a new mount made on the same mountpoint (its own
    socket, same name), then the old daemon let go: on its way out it removed the new
    daemon's socket. It removes only its own."""
    monkeypatch.setattr(control, "socket_dir", lambda: tmp_path)
    mountpoint = str(tmp_path / "mnt")
    path = control.socket_path(mountpoint)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(control.serve_control, mountpoint, {})
        with trio.fail_after(30):
            # Listening, not merely bound: the socket file appears in bind's worker thread,
            # before the server noted its inode. Replaced in that gap, the newer socket's
            # inode is the one it notes, and it removes that one.
            while not listening(path):
                await trio.sleep(0.01)
        path.unlink()  # the new daemon's socket in its place
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as newer:
            newer.bind(str(path))
            nursery.cancel_scope.cancel()
    assert path.exists()
