"""FUSE passthrough: the kernel reads a cached object from its SSD-tier file, and writes a
new write-back file straight into its staged file.

Why: through the daemon, every 1 MiB read is a round trip and two copies (disk to the
daemon, the daemon to the kernel), and a restore after a remount reached 0.38 of a local
disk read. With passthrough (Linux 6.9+, libfuse 3.16+, CAP_SYS_ADMIN) the open file is
bound to a backing file, and reads and mmap go to it inside the kernel, as on a local
file; the daemon sees only OPEN and RELEASE. The backing file is the object's data file
in the SSD tier, handed out only when it is complete and sealed (`SsdTier.passthrough`).

The kernel's rules (``fs/fuse/iomode.c``) that shape `Backings`:

- All passthrough opens of one inode must name the *same* backing id, else the open
  fails with EIO: the id is registered once per inode and shared, then released by
  the last RELEASE.
- While an inode has passthrough opens, any other open of it fails with EIO (writes
  would go to the cache file, not GCS): we refuse those opens first, with EBUSY, which
  says what is going on.
- While an inode has ordinary (page-cached) opens, a passthrough open would fail: such
  opens are served the ordinary way.
- ``FOPEN_KEEP_CACHE`` is not allowed with passthrough (the operations layer leaves it
  off).

Writes: a file created on a write-back mount is bound to its staged file in the
journal (`open_staged`): the kernel writes it as a local file, and the daemon
sees CREATE, FLUSH and RELEASE, never a WRITE. It learns what was written from
the file itself (`Staged.observe`: size and mtime) whenever it must decide
(attributes, commit, upload). Other opens of that inode while it is bound share
its id, as the kernel requires.

The daemon learns of a close only when the RELEASE arrives, after the kernel forgot the
file: its counts may lag behind the kernel's, never run ahead of them, so the rules
above err on the side of an ordinary open, or of EBUSY in that short window.
"""

from __future__ import annotations

import errno
import logging
from dataclasses import dataclass

from tierfs.cache.ssd import Passthrough
from tierfs.core.blocks import Blocks
from tierfs.core.inodes import Inode
from tierfs.core.kernel import Kernel
from tierfs.errors import Busy

log = logging.getLogger("tierfs.fuse")

# Failures of `Kernel.backing_open` that say nothing of the next open: out of descriptors
# or memory, the SSD-tier file gone under us (evicted: the next open finds it missing).
TRANSIENT = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOMEM, errno.ENOENT, errno.EINTR})


@dataclass
class Shared:
    """One inode's backing file, shared by all its passthrough opens: a sealed SSD-tier
    file (``pinned``), or the staged file of a write-back file being written (None)."""

    backing_id: int
    pinned: Passthrough | None
    generation: int
    handles: int = 1


@dataclass
class Backings:
    """Which opens get passthrough, and the per-inode backing ids; one per mount."""

    blocks: Blocks
    kernel: Kernel  # its backing-file table, where it agreed to passthrough at INIT

    def __post_init__(self) -> None:
        self._refused = False  # the kernel refused a backing file: no passthrough from then on
        self._shared: dict[int, Shared] = {}  # ino -> its backing, while opens hold it
        self._said: set[int] = set()  # errnos of transient failures logged as warnings
        self.counts = {"opens": 0, "write_opens": 0, "busy": 0, "failed": 0}

    def statistics(self) -> dict[str, object]:
        """For `tierfs stats`: opens given passthrough, refused (EBUSY), failed, and the
        files the kernel reads directly now."""
        return {"enabled": self._enabled(), **self.counts, "files_open": len(self._shared)}

    def _enabled(self) -> bool:
        return self.kernel.passthrough and not self._refused

    async def open(self, inode: Inode, object_name: str, *, eligible: bool) -> int:
        """The backing id for a new open of ``inode`` (0: an ordinary open). ``eligible``:
        a read-only open of a clean object. Raises `Busy` where the kernel would refuse."""
        shared = self._shared.get(inode.ino)
        if shared is not None:
            if shared.pinned is None or (eligible and shared.generation == inode.generation):
                # (Every open of a staged file the kernel writes must name it too.)
                shared.handles += 1
                self.counts["opens"] += 1
                return shared.backing_id
            self.counts["busy"] += 1
            raise Busy(f"{inode.path}: open for reading straight from the cache")
        if not eligible or not self._enabled() or inode.open_handles or not inode.size:
            return 0
        generation = inode.generation
        pinned = await self.blocks.passthrough(object_name, generation, inode.size)
        if pinned is None:
            return 0
        if (
            inode.ino in self._shared  # another open got there first, or things changed
            or inode.open_handles
            or inode.generation != generation
            or inode.staged is not None
        ):
            self.blocks.unpin(pinned)
            return await self.open(inode, object_name, eligible=eligible)
        try:
            backing_id = self.kernel.backing_open(pinned.path)
        except OSError as exc:
            self.blocks.unpin(pinned)
            self._failed(exc, "reads")
            return 0
        self._shared[inode.ino] = Shared(backing_id, pinned, generation)
        self.counts["opens"] += 1
        return backing_id

    def open_staged(self, inode: Inode, fd: int) -> int:
        """The backing id for a new write-back file, whose staged file is open as ``fd``:
        the kernel then writes (and reads) it with no daemon round trip (it opens the file
        anew with the writer's flags, so the descriptor's own mode does not matter). 0: no
        passthrough."""
        if not self._enabled() or inode.ino in self._shared:
            return 0
        try:
            backing_id = self.kernel.backing_open(fd)
        except OSError as exc:
            self._failed(exc, "writes")
            return 0
        self._shared[inode.ino] = Shared(backing_id, None, inode.generation)
        self.counts["write_opens"] += 1
        return backing_id

    def _failed(self, exc: OSError, what: str) -> None:
        """A backing file the kernel did not take: this open is an ordinary one. Only a
        refusal that will not change (no privilege, no support) turns passthrough off
        for the mount; one descriptor too many (EMFILE, ENFILE) or no memory did, until
        remount, for every later open of every file."""
        self.counts["failed"] += 1
        if exc.errno in TRANSIENT:
            said = exc.errno in self._said
            self._said.add(exc.errno)
            (log.debug if said else log.warning)(
                "passthrough failed for one open (%s): it goes through tierfs", exc
            )
            return
        log.warning("passthrough refused (%s): %s go through tierfs from now on", exc, what)
        self._refused = True

    def copied(self, inode: Inode, generation: int) -> None:
        """``inode``'s object was copied on the server from ``generation`` to the one it
        has now (a rename): the same bytes, so the backing file its opens share serves the
        new generation too. (A read-only open after a rename of a file another process
        still read this way was EBUSY until that reader closed.)"""
        shared = self._shared.get(inode.ino)
        if shared is not None and shared.pinned is not None and shared.generation == generation:
            shared.generation = inode.generation

    def holds_staged(self, inode: Inode) -> bool:
        shared = self._shared.get(inode.ino)
        return shared is not None and shared.pinned is None

    def release(self, inode: Inode) -> None:
        """One passthrough open of ``inode`` is closed."""
        shared = self._shared.get(inode.ino)
        if shared is None:
            return
        shared.handles -= 1
        if shared.handles > 0:
            return
        del self._shared[inode.ino]
        if shared.pinned is not None:
            self.blocks.unpin(shared.pinned)
        try:
            self.kernel.backing_close(shared.backing_id)
        except OSError as exc:
            log.warning("cannot release backing file %d: %s", shared.backing_id, exc)
