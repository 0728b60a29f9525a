"""``tierfs demo`` (what ``make run`` runs): the tour completes and leaves nothing behind."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.mounting import TIERFS, require_fuse

pytestmark = pytest.mark.mount  # the demo mounts


def fuse_mounts(below: str = "") -> list[str]:
    """FUSE mountpoints (those whose path has ``below`` in it: another test, or another
    suite on the same machine, may mount beside the demo)."""
    with open("/proc/self/mounts", encoding="utf-8") as table:
        return [
            line.split()[1]
            for line in table
            if line.split()[2].startswith("fuse") and below in line.split()[1]
        ]


def test_demo_runs_the_tour_and_cleans_up() -> None:
    require_fuse()
    before = fuse_mounts("tierfs-demo-")
    result = subprocess.run([TIERFS, "demo"], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    out = result.stdout
    for step in (
        "1. GCS emulator",
        "2. mounted: tierfs mount --custom-endpoint=",
        "3. wrote",
        "   cold, from GCS:",
        "   warm, from the RAM tier:",
        "5. saved a checkpoint with write-back",
        "   until every close():",
        "   until durable in GCS:",
        "an object uploaded by another GCS client shows up",
        "after the remount, from the SSD tier:",
        "`tierfs stats ",
    ):
        assert step in out, out
    assert "in GCS and identical: True" in out
    assert "from-another-client.txt" in out
    assert ", 0 GCS media reads" in out  # the remount read came from the SSD tier
    assert "ssd" in out  # the stats table has its row
    # Every command printed is the one that ran: the printed mount line mounts.
    printed = re.search(r"2\. mounted: (tierfs mount .*)", out)
    assert printed and "--write-back" in printed.group(1) and "--cache-dir=" in printed.group(1)
    assert "6. unmounted" in out and "7. emulator stopped" in out
    assert fuse_mounts("tierfs-demo-") == before


def test_demo_keep_leaves_it_running_and_says_how_to_stop() -> None:
    require_fuse()
    result = subprocess.run([TIERFS, "demo", "--keep"], capture_output=True, text=True, timeout=300)
    match = re.search(r"tierfs unmount (\S+) && kill (\d+)", result.stdout)
    try:
        assert result.returncode == 0, result.stderr
        assert match, result.stdout
        mountpoint = match.group(1)
        assert mountpoint in fuse_mounts()
        assert Path(mountpoint, "hello.txt").read_text() == "Hello from tierfs!\n"
    finally:
        if match:
            subprocess.run([TIERFS, "unmount", match.group(1)], capture_output=True, timeout=120)
            try:
                os.kill(int(match.group(2)), signal.SIGTERM)
            except ProcessLookupError:
                pass
    assert match.group(1) not in fuse_mounts()
    shutil.rmtree(Path(match.group(1)).parent)


def test_demo_rejects_unknown_arguments() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "tierfs", "demo", "--bogus"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert result.stderr == "tierfs: unknown demo argument '--bogus' (only --keep)\n"
