"""Telling a file's last close() from a forked child's or a dup's FLUSH (tierfs.fuse.closes),
on real processes and descriptors of this test (no mount needed: /proc is the same)."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

from tierfs.fuse.closes import Closes, descriptors_on, mount_id, thread_group


def test_a_thread_belongs_to_its_process_and_a_gone_pid_to_none() -> None:
    seen: list[int | None] = []
    worker = threading.Thread(target=lambda: seen.append(thread_group(threading.get_native_id())))
    worker.start()
    worker.join()
    assert seen == [os.getpid()]
    assert thread_group(os.getpid()) == os.getpid()
    assert thread_group(2**22 + 12345) is None  # above pid_max's default: never a process


def test_descriptors_are_counted_by_inode_and_mount(tmp_path: Path) -> None:
    path = tmp_path / "f"
    path.write_bytes(b"x")
    ino = path.stat().st_ino
    mnt = mount_id(_mount_point_of(tmp_path))
    assert mnt is not None
    fd = os.open(path, os.O_RDONLY)
    dup = os.dup(fd)
    try:
        assert descriptors_on(os.getpid(), ino, mnt) == 2
        assert descriptors_on(os.getpid(), ino, None) >= 2
        assert descriptors_on(os.getpid(), ino, mnt + 100_000) == 0  # another mount's inode
    finally:
        os.close(fd)
        os.close(dup)
    assert descriptors_on(os.getpid(), ino, mnt) == 0
    assert descriptors_on(2**22 + 12345, ino, mnt) == 0  # a process that is gone holds none


def test_the_last_close_is_the_openers_with_no_dup_left(tmp_path: Path) -> None:
    """fds here stand for the mount's: the flushed one is closed already (as at a FLUSH)."""
    path = tmp_path / "f"
    path.write_bytes(b"x")
    ino = path.stat().st_ino
    closes = Closes()
    closes.mnt_id = mount_id(_mount_point_of(tmp_path))
    me = threading.get_native_id()
    closes.opened(7, me, ino)
    dup = os.open(path, os.O_RDONLY)  # a dup of handle 7 still open
    try:
        assert not closes.is_last(7, me)
        closes.opened(8, me, ino)  # ... or a handle of its own (a reader): then it is last
        assert closes.is_last(7, me)
        closes.released(8)
    finally:
        os.close(dup)
    assert closes.is_last(7, me)
    child = os.fork()
    if child == 0:  # pragma: no cover - the child only sleeps until killed
        os.execv("/bin/sleep", ["sleep", "30"])
    try:
        assert not closes.is_last(7, child)  # another process's copy of the fd
    finally:
        os.kill(child, 9)
        os.waitpid(child, 0)
    assert closes.is_last(7, child)  # the closer is gone: nothing to hold back for
    closes.released(7)
    assert closes.is_last(7, child)  # a handle opened before we knew: publish


def test_a_file_opened_by_a_thread_that_has_exited_is_closed_last_by_its_process(
    tmp_path: Path,
) -> None:
    """A worker thread opens and writes, then exits (a pool's idle thread retiring); the
    main thread's close() is the last one and publishes. (Before, the gone opener read
    as another process: close() returned at once, the upload went to RELEASE, and its
    error reached no one.) A read-only handle keeps its thread: it publishes nothing."""
    path = tmp_path / "f"
    path.write_bytes(b"x")
    ino = path.stat().st_ino
    closes = Closes()
    closes.mnt_id = mount_id(_mount_point_of(tmp_path))
    workers: list[int] = []

    def open_there() -> None:  # the open request, while its thread lives
        workers.append(threading.get_native_id())
        closes.opened(7, workers[0], ino, writable=True)

    worker = threading.Thread(target=open_there)
    worker.start()
    worker.join()
    deadline = time.monotonic() + 10
    while thread_group(workers[0]) is not None:  # the kernel reaps it just after the join
        assert time.monotonic() < deadline, "the worker thread's entry stayed in /proc"
        time.sleep(0.01)
    assert closes.is_last(7, threading.get_native_id())
    child = os.fork()
    if child == 0:  # pragma: no cover - the child only sleeps until killed
        os.execv("/bin/sleep", ["sleep", "30"])
    try:
        assert not closes.is_last(7, child)  # still another process's copy
    finally:
        os.kill(child, 9)
        os.waitpid(child, 0)


def _mount_point_of(path: Path) -> str:
    path = path.resolve()
    while not os.path.ismount(path):
        path = path.parent
    return str(path)
