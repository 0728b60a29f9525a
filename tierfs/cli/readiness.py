"""How a mount daemon tells whoever started it (`tierfs mount`, the CSI plugin) how its
start goes, on a pipe: any number of ``progress ...`` lines while it works, then one
final line, ``ok`` or why not.

Why progress lines: the starter must not wait for ever on a daemon stuck before it
answers (a bucket check that never returns), so it gives up after a quiet spell. But a
daemon's start may rightly take long: a write-back journal left by a killed daemon is
uploaded before the mount serves (a 100 GB checkpoint takes minutes), and a starter that
gave up on it killed the upload half-way at every attempt; the mount never came up. A
daemon that keeps saying it moves on is waited for; one quiet for `QUIET_S` is not.
"""

from __future__ import annotations

import os
import select

PROGRESS = "progress"
QUIET_S = 300.0  # `tierfs mount`'s bound on a daemon that says nothing


def say_progress(fd: int, what: str) -> None:
    """One progress line on the starter's pipe (if the starter is gone, nobody needs it)."""
    try:
        os.write(fd, f"{PROGRESS} {what}\n".encode("utf-8", "replace"))
    except OSError:
        pass


def final_word(fd: int, quiet_s: float) -> str | None:
    """The daemon's final line on pipe ``fd`` (``ok``, or why not; "" if it exited without
    one), past its progress lines; None if it said nothing for ``quiet_s``. Raw reads, so
    that a line already read into a buffer is never waited for again."""
    pending = b""
    while True:
        while b"\n" in pending:
            line, pending = pending.split(b"\n", 1)
            text = line.decode("utf-8", "replace").strip()
            if not text.startswith(PROGRESS):
                return text
        if not select.select([fd], [], [], quiet_s)[0]:
            return None
        chunk = os.read(fd, 4096)
        if not chunk:
            return pending.decode("utf-8", "replace").strip()
        pending += chunk
