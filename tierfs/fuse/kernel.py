"""The kernel side of a mount through pyfuse3: `tierfs.core.kernel.Kernel` for the core.

The composition root makes one per mount and hands it to both the core and the
adapter; the adapter alone learns, at INIT, whether the kernel agreed to FUSE
passthrough (`agreed`), and the core reads `passthrough` when it opens a file.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pyfuse3


class PyfuseKernel:
    """Entry invalidation and backing files through the patched pyfuse3 (``deploy/pyfuse3``),
    and directories read through the mountpoint (``mountpoint``: None when this daemon
    cannot open it, as when it was handed a ``/dev/fd/N`` someone else mounted)."""

    def __init__(self, mountpoint: str | None = None) -> None:
        self._passthrough = False
        self._mountpoint = mountpoint
        self._readers: set[int] = set()  # threads in `read_dir` (their kernel thread ids)

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

    @property
    def reads_dirs(self) -> bool:
        return self._mountpoint is not None

    def read_dir(self, path: str) -> int:
        if self._mountpoint is None:
            raise OSError(f"no mountpoint to read {path!r} through")
        thread = threading.get_native_id()  # the pid FUSE gives this thread's requests
        self._readers.add(thread)
        try:
            with os.scandir(os.path.join(self._mountpoint, path)) as entries:
                return sum(1 for _ in entries)
        finally:
            self._readers.discard(thread)

    def is_reader(self, pid: int) -> bool:
        """Whether a request comes from `read_dir` (its opendir: the adapter's question)."""
        return pid in self._readers
