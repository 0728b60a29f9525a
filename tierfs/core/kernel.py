"""What the core asks of the kernel, without knowing FUSE.

Three things reach past the daemon into the kernel: telling it to drop a name it caches
(an implied directory that vanished with its last object), FUSE passthrough's
table of backing files (the kernel reads a sealed SSD-tier file, or writes a
write-back file's staged file, itself), and reading a directory through the mount so
that the kernel learns all its names (`tierfs.core.prefill`). The FUSE adapter implements this
(`tierfs.fuse.kernel.PyfuseKernel`, pyfuse3's calls) and says at INIT whether the
kernel agreed to passthrough; core tests use `NoKernel`. Passing it in at
construction keeps pyfuse3 out of the core.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path
from typing import Protocol


class Kernel(Protocol):
    """The kernel side of one mount, as the core sees it."""

    @property
    def passthrough(self) -> bool:
        """The kernel agreed to FUSE passthrough at INIT: backing files may be opened."""
        ...

    def forget(self, parent_ino: int, name: str) -> None:
        """Drop the kernel's cached entry ``name`` in directory ``parent_ino`` (no wait)."""
        ...

    def backing_open(self, path: Path | int) -> int:
        """Register the file at ``path``, or the open file ``path`` is a descriptor of, as a
        backing file; its id. Raises OSError."""
        ...

    def backing_close(self, backing_id: int) -> None:
        """Release an id from `backing_open`. Raises OSError."""
        ...

    @property
    def reads_dirs(self) -> bool:
        """`read_dir` may work: the mountpoint is a path this daemon can open."""
        ...

    def read_dir(self, path: str) -> int:
        """Read the directory ``path`` (relative to the mount) through the mount, so that
        the kernel asks this daemon for its entries and caches them; how many it read.
        Blocking: from a worker thread only. Raises OSError (or ValueError)."""
        ...


class NoKernel:
    """No kernel behind the core (tests over `MemoryBucket`): nothing cached, no passthrough."""

    passthrough = False

    def forget(self, parent_ino: int, name: str) -> None:
        return None

    def backing_open(self, path: Path | int) -> int:
        raise OSError(errno.ENOSYS, os.strerror(errno.ENOSYS))

    def backing_close(self, backing_id: int) -> None:
        raise OSError(errno.ENOSYS, os.strerror(errno.ENOSYS))

    reads_dirs = False

    def read_dir(self, path: str) -> int:
        raise OSError(errno.ENOSYS, os.strerror(errno.ENOSYS))
