"""Real mounts for tests: the ``tierfs`` console script, on the emulator, cleaned up always.

A `Mount` runs ``tierfs mount`` exactly as a user would (background daemon,
``--custom-endpoint`` pointing at the emulator) and ``tierfs unmount`` at the
end. If that fails it unmounts lazily and kills the daemon by its PID, so no
test leaves a mount or a process behind even when it fails. The daemon logs
at debug level to a file; an ERROR line in it fails the test unless the test
said it expects errors.

Mount tests never skip: without root or ``/dev/fuse`` they fail with the reason.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tierfs.cli.daemon import daemon_pids
from tierfs.cli.emulator import Emulator

BIN = Path(sys.executable).parent
TIERFS = str(BIN / "tierfs")


def require_fuse() -> None:
    if not os.path.exists("/dev/fuse"):
        pytest.fail("FUSE tests need /dev/fuse (run as root with the device present)")
    if os.geteuid() != 0:
        pytest.fail("FUSE tests need root (they mount for real)")


class Mount:
    """One mounted bucket."""

    def __init__(
        self, emulator: Emulator, bucket: str, path: Path, log: Path, args: list[str]
    ) -> None:
        self.emulator = emulator
        self.bucket = bucket
        self.path = path
        self.log = log
        self.args = args
        self.expect_errors = False
        self.mounted = False
        self.cwd: Path | None = None  # where `tierfs mount` runs (relative paths in args)

    def command(self) -> list[str]:
        return [
            TIERFS,
            "mount",
            f"--custom-endpoint={self.emulator.endpoint}",
            "--anonymous-access",
            "--log-severity=debug",
            "--log-format=text",
            f"--log-file={self.log}",
            *self.args,
            self.bucket,
            str(self.path),
        ]

    def start(self) -> Mount:
        require_fuse()
        self.path.mkdir(parents=True, exist_ok=True)
        result = subprocess.run(
            self.command(), capture_output=True, text=True, timeout=120, cwd=self.cwd
        )
        if result.returncode != 0:
            pytest.fail(f"tierfs mount failed ({result.returncode}): {result.stderr.strip()}")
        self.mounted = True
        return self

    def unmount(self) -> subprocess.CompletedProcess[str]:
        result = subprocess.run(
            [TIERFS, "unmount", str(self.path)], capture_output=True, text=True, timeout=600
        )
        self.mounted = result.returncode != 0 and self.is_mounted()
        return result

    def is_mounted(self) -> bool:
        target = str(self.path)
        with open("/proc/self/mounts", encoding="utf-8") as table:
            return any(line.split()[1] == target for line in table if len(line.split()) > 1)

    def pids(self) -> list[int]:
        return daemon_pids(str(self.path))

    def cleanup(self) -> None:
        """Unmount however it takes, and stop the daemon by PID."""
        pids = self.pids()
        if self.is_mounted():
            result = self.unmount()
            if result.returncode != 0 and self.is_mounted():
                subprocess.run(["fusermount3", "-u", "-z", str(self.path)], check=False)
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.mounted = False

    def errors(self) -> list[str]:
        if not self.log.exists():
            return []
        lines = self.log.read_text(encoding="utf-8", errors="replace").splitlines()
        return [line for line in lines if " ERROR " in line]


def stats(mount: Mount) -> dict:
    """``tierfs stats --json`` of a live mount."""
    result = subprocess.run(
        [TIERFS, "stats", "--json", str(mount.path)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def wait_until(check: Callable[[], object], what: str, timeout_s: float = 60.0) -> None:
    """Poll ``check()`` until true: for work a daemon or plugin does in the background (a
    restart, a mount, a prefetch), which has no event a test can wait on."""
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout_s}s waiting for {what}")
        time.sleep(0.05)
