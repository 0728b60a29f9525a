"""Running a mount in the background, and stopping it.

``tierfs mount`` (without ``--foreground``) starts a copy of itself with
``--foreground --ready-fd=N`` in a new session, and waits on that pipe: the
daemon writes ``ok`` once the mount answers, or one line saying why it
cannot. The parent exits 0 only after ``ok`` and a successful stat of the
mountpoint, else non-zero with that line. The daemon's command line keeps
the mountpoint, so ``ps`` shows which process serves which mount.

``tierfs unmount`` unmounts (lazily if the daemon is dead) and waits for the
daemon of that mountpoint to exit, so that when it returns every pending
upload has finished.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from types import FrameType

from tierfs.cli.fdmount import check_fd, fuse_fd
from tierfs.cli.memory import daemon_environment
from tierfs.cli.mountpoint import (
    ALIVE,
    HUNG,
    MountError,
    canonical,
    mounted_here,
    probe,
    unmount,
)
from tierfs.cli.readiness import QUIET_S, final_word

STOP_TIMEOUT_S = 600.0
HUNG_WAIT_S = 10.0  # for a daemon whose mount does not answer (stopped, deadlocked)


def start_background(child_args: Sequence[str], mountpoint: str) -> None:
    """Start the daemon and wait until its mount answers; `MountError` otherwise."""
    served = fuse_fd(mountpoint)  # /dev/fd/N: the daemon needs that descriptor too
    if served is not None and (problem := check_fd(served)) is not None:
        raise MountError(problem)  # (Popen's pass_fds failed first: "internal error")
    read_fd, write_fd = os.pipe()
    interrupt = _HeldInterrupt()
    with tempfile.TemporaryFile() as errors:
        try:
            interrupt.hold()
            child = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "tierfs",
                    *child_args,
                    "--foreground",
                    f"--ready-fd={write_fd}",
                ],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=errors,
                pass_fds=(write_fd, *(() if served is None else (served,))),
                start_new_session=True,
                env=daemon_environment(),
            )
        except BaseException:
            interrupt.let_go()
            raise
        finally:
            os.close(write_fd)
        try:
            interrupt.let_go()  # (a Ctrl-C held meanwhile is raised here, where it stops it)
            # Bounded by quiet, not by time: a daemon stuck before it answers (a bucket
            # check that never returns) held `tierfs mount` for ever, while one uploading a
            # journal left by a killed daemon says it moves on (`tierfs.cli.readiness`).
            message = final_word(read_fd, QUIET_S)
        except BaseException:
            # Ctrl-C while it starts: no mount may come up after `tierfs mount` said it was
            # interrupted (one did, and died at its first answer: a dead mount left behind).
            _stop_starting(child, mountpoint)
            raise
        finally:
            os.close(read_fd)
        if message is None:
            _stop_starting(child, mountpoint)
            raise MountError(
                f"the mount daemon said nothing for {QUIET_S:.0f} s while starting; stopped it"
            )
        if message != "ok":
            try:
                status = child.wait(timeout=10)
            except subprocess.TimeoutExpired:
                child.kill()
                status = child.wait()
            errors.seek(0)
            said = errors.read().decode("utf-8", "replace").strip().splitlines() or [""]
            # libfuse says why it refused a mount on the daemon's stderr only ("fuse:
            # unknown option(s): `-o context=...'"); the daemon's own line names no cause.
            why = [line.strip() for line in said if line.startswith("fuse: ")]
            if message and why:
                message = f"{message} ({'; '.join(why[-2:])})"
            # (the daemon's own "tierfs: " before ours doubled it: "tierfs: tierfs: ...")
            last = said[-1].removeprefix("tierfs: ")
            raise MountError(message or last or f"the mount daemon exited with status {status}")
    try:
        os.stat(mountpoint)
    except OSError as err:
        raise MountError(f"mounted, but {mountpoint} does not answer: {err.strerror}") from None


class _HeldInterrupt:
    """Ctrl-C while the daemon is spawned, held until the parent knows its PID. Raised
    inside ``Popen`` (waiting for the child's exec), it left a daemon nobody stopped: the
    mount came up after `tierfs mount` had said "interrupted" (3 of 25 runs of
    `test_ctrl_c_while_a_mount_starts_leaves_no_daemon_and_no_mount` on a loaded CPU).
    Only Python's own handler is replaced: a SIGINT ignored (a mount started in the
    background by a script) stays ignored, a handler set by someone else stays theirs."""

    def __init__(self) -> None:
        self.came = False
        self._held = False

    def hold(self) -> None:
        if (
            threading.current_thread() is threading.main_thread()  # (signal's own rule)
            and signal.getsignal(signal.SIGINT) is signal.default_int_handler
        ):
            signal.signal(signal.SIGINT, self._note)
            self._held = True

    def _note(self, signum: int, frame: FrameType | None) -> None:
        self.came = True

    def let_go(self, *, raise_held: bool = True) -> None:
        """Put Python's handler back; with ``raise_held``, raise KeyboardInterrupt if a
        Ctrl-C came meanwhile."""
        if self._held:
            signal.signal(signal.SIGINT, signal.default_int_handler)
            self._held = False
        if self.came and raise_held:
            self.came = False
            raise KeyboardInterrupt


def _stop_starting(child: subprocess.Popen[bytes], mountpoint: str) -> None:
    """Kill a daemon still starting, and take off a mount it made meanwhile. A second
    Ctrl-C (users press it twice) is held meanwhile: it cut this short, and the daemon,
    in a session of its own, never sees the terminal's."""
    interrupt = _HeldInterrupt()
    interrupt.hold()
    try:
        child.kill()
        child.wait()
        if mounted_here(mountpoint) is not None:  # (refused before the start if there was one)
            try:
                unmount(mountpoint, lazy=True)
            except MountError:
                pass
    finally:
        interrupt.let_go(raise_held=False)  # (what is being handled goes on all the same)


def daemon_pids(mountpoint: str) -> list[int]:
    """PIDs of tierfs daemons whose command line names this mountpoint."""
    target = canonical(mountpoint)
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            args = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        words = [a.decode("utf-8", "surrogateescape") for a in args if a]
        runs_tierfs = any(os.path.basename(w) in ("tierfs", "mount.tierfs") for w in words)
        if runs_tierfs and "mount" in words and target in words:
            pids.append(int(entry.name))
    return pids


def stop(mountpoint: str, *, timeout_s: float = STOP_TIMEOUT_S) -> None:
    """``tierfs unmount``: unmount, then wait for the daemon to finish its uploads and exit."""
    path = canonical(mountpoint)
    entry = mounted_here(path)
    if entry is None:
        raise MountError(f"{path} is not mounted")
    pids = daemon_pids(path)
    # fuse.tierfs, or a plain "fuse" mount (/dev/fd/N, mounted by someone else) that a
    # tierfs daemon serves: another FUSE file system (sshfs...) is not ours to unmount.
    if entry.fstype != "fuse.tierfs" and not (entry.fstype == "fuse" and pids):
        raise MountError(f"{path} is not a tierfs mount ({entry.fstype})")
    state = probe(path)
    unmount(path, lazy=state != ALIVE)
    # A daemon that does not answer is not waited for as long as one uploading.
    deadline = time.monotonic() + (min(timeout_s, HUNG_WAIT_S) if state == HUNG else timeout_s)
    while pids and time.monotonic() < deadline:
        pids = [pid for pid in pids if _alive(pid)]
        if pids:
            time.sleep(0.05)
    if pids and state == HUNG:
        raise MountError(
            f"unmounted {path} lazily: its daemon (pid {pids[0]}) does not answer "
            "(stopped or stuck); kill it"
        )
    if pids:
        raise MountError(f"unmounted {path}, but its daemon (pid {pids[0]}) has not exited yet")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as stat:
            return stat.read().split(") ", 1)[-1][:1] != "Z"
    except OSError:
        return False
