"""The kernel side of a mount through pyfuse3: `tierfs.core.kernel.Kernel` for the core.

The composition root makes one per mount and hands it to both the core and the
adapter; the adapter alone learns, at INIT, whether the kernel agreed to FUSE
passthrough (`agreed`), and the core reads `passthrough` when it opens a file.
"""

from __future__ import annotations

import os
from pathlib import Path

import pyfuse3


class PyfuseKernel:
    """Entry invalidation and backing files through the patched pyfuse3 (``deploy/pyfuse3``)."""

    def __init__(self) -> None:
        self._passthrough = False

    @property
    def passthrough(self) -> bool:
        return self._passthrough

    def agreed(self, passthrough: bool) -> None:
        """At INIT: whether the kernel granted passthrough (the adapter's call)."""
        self._passthrough = passthrough

    def forget(self, parent_ino: int, name: str) -> None:
        pyfuse3.invalidate_entry_async(parent_ino, name.encode("utf-8"), ignore_enoent=True)

    def backing_open(self, path: Path | int) -> int:
        if isinstance(path, int):  # an open file: no second open (200 us on ext4 here)
            return int(pyfuse3.backing_open(path))  # type: ignore[attr-defined]
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            return int(pyfuse3.backing_open(fd))  # type: ignore[attr-defined]
        finally:
            os.close(fd)

    def backing_close(self, backing_id: int) -> None:
        pyfuse3.backing_close(backing_id)  # type: ignore[attr-defined]
