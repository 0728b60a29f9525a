"""One tierfs daemon per published volume: started, watched, restarted when it dies, stopped.

The plugin runs ``python -m tierfs mount ... --foreground --ready-fd=N`` itself,
in its own session (so a signal to the plugin's process group does not reach
it), and waits on the pipe exactly as ``tierfs mount`` does: ``ok`` once the
mount answers, or the one line saying why it never will. The daemon logs JSON
to the plugin's stderr (``--log-file=/dev/fd/2``), so ``kubectl logs`` shows
both.

A watcher thread waits for the daemon to exit. An exit nobody asked for is
logged as an ERROR and the daemon restarted on the same target, with the
same arguments (same cache and write-back directories, so a write-back
journal left behind is recovered), after lazily unmounting the dead mount;
failed restarts back off up to a minute. `stop` marks the daemon as stopping
first, so the watcher never restarts a daemon that is being unmounted.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Sequence
from pathlib import Path

from tierfs.cli.memory import daemon_environment
from tierfs.cli.mountpoint import MountError, is_stale, mounted_here, unmount
from tierfs.cli.readiness import final_word

log = logging.getLogger("tierfs.csi.daemons")
MAX_BACKOFF_S = 60.0


class StartError(Exception):
    """The daemon did not mount: its own one line, or why we gave up waiting."""


def is_fuse_mounted(target: Path) -> bool:
    entry = mounted_here(str(target))
    return entry is not None and entry.fstype.startswith("fuse")


def spawn(args: Sequence[str], timeout_s: float) -> subprocess.Popen[bytes]:
    """Start a daemon and wait until its mount answers; `StartError` otherwise."""
    read_fd, write_fd = os.pipe()
    try:
        child = subprocess.Popen(
            [sys.executable, "-m", "tierfs", *args, "--foreground", f"--ready-fd={write_fd}"],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            pass_fds=(write_fd,),
            start_new_session=True,
            env=daemon_environment(),
        )
    finally:
        os.close(write_fd)
    try:  # ``timeout_s`` of quiet: a daemon uploading a journal says it moves on
        message = final_word(read_fd, timeout_s)
    finally:
        os.close(read_fd)
    if message == "ok":
        return child
    if message is None:
        child.kill()
    try:
        status = child.wait(timeout=10)
    except subprocess.TimeoutExpired:
        child.kill()
        status = child.wait()
    target = Path(args[-1])
    if is_fuse_mounted(target):
        unmount(str(target), lazy=True)
    if message is None:
        raise StartError(f"the tierfs daemon said nothing for {timeout_s:.0f} s while starting")
    raise StartError(message or f"the tierfs daemon exited with status {status}")


class Daemon:
    """The daemon serving one target, and the thread that restarts it."""

    def __init__(self, volume_id: str, args: Sequence[str], start_timeout_s: float) -> None:
        self.volume_id = volume_id
        self.args = list(args)
        self.target = Path(self.args[-1])
        self.start_timeout_s = start_timeout_s
        self.restarts = 0
        self._lock = threading.Lock()  # held while (re)starting, and to mark stopping
        self._stopping = threading.Event()
        self._process: subprocess.Popen[bytes] | None = None
        self._watcher: threading.Thread | None = None

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    def start(self) -> None:
        """Mount (`StartError` if it fails), then watch the daemon from a thread."""
        with self._lock:
            self._process = spawn(self.args, self.start_timeout_s)
        self._watcher = threading.Thread(
            target=self._watch, name=f"watch {self.volume_id}", daemon=True
        )
        self._watcher.start()

    def restarting(self) -> bool:
        """The daemon is down and not yet back (the mount is dead or being replaced)."""
        process = self._process
        return process is None or process.poll() is not None or is_stale(str(self.target))

    def stop(self, timeout_s: float) -> None:
        """Unmount and wait for the daemon to exit (`MountError`, and not stopping, if the
        unmount fails; `TimeoutError` if the daemon is still finishing after ``timeout_s``)."""
        with self._lock:
            self._stopping.set()
        try:
            if is_fuse_mounted(self.target):
                unmount(str(self.target), lazy=is_stale(str(self.target)))
        except MountError:
            self._stopping.clear()
            raise
        self.wait_exit(timeout_s)
        if self._watcher is not None:
            self._watcher.join(timeout=5)

    def wait_exit(self, timeout_s: float) -> None:
        process = self._process
        if process is None:
            return
        try:
            process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            raise TimeoutError(
                f"unmounted, but the daemon (pid {process.pid}) is still running after "
                f"{timeout_s:.0f} s"
            ) from None

    def kill(self) -> None:
        """Stop for good without unmounting gracefully (plugin shutdown in tests, failures)."""
        self._stopping.set()
        process = self._process
        if process is not None and process.poll() is None:
            os.kill(process.pid, signal.SIGKILL)
            process.wait()

    def _watch(self) -> None:
        while True:
            process = self._process
            if process is None:
                return
            status = process.wait()
            if self._stopping.is_set():
                return
            log.error(
                "the daemon of volume %s on %s (pid %d) exited with status %d; restarting it",
                self.volume_id,
                self.target,
                process.pid,
                status,
            )
            if not self._restart():
                return

    def _restart(self) -> bool:
        backoff_s = 1.0
        while True:
            with self._lock:
                if self._stopping.is_set():
                    return False
                try:
                    if is_fuse_mounted(self.target):
                        unmount(str(self.target), lazy=True)
                    self._process = spawn(self.args, self.start_timeout_s)
                    self.restarts += 1
                    log.warning(
                        "restarted the daemon of volume %s on %s (pid %d)",
                        self.volume_id,
                        self.target,
                        self._process.pid,
                    )
                    return True
                except (StartError, MountError, OSError) as err:
                    log.error(
                        "cannot restart the daemon of volume %s: %s (next try in %.0f s)",
                        self.volume_id,
                        err,
                        backoff_s,
                    )
            if self._stopping.wait(backoff_s):
                return False
            backoff_s = min(backoff_s * 2, MAX_BACKOFF_S)
