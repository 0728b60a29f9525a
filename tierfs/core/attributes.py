"""setattr: sizes, modes, and times on files, directories and symlinks.

Where a time can be kept it is (a file's ``gcsfuse_mtime``, a directory placeholder's,
a symlink object's); a part of `tierfs.core.filesystem.Filesystem`, sharing its state.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from tierfs.core.inodes import Inode, Kind
from tierfs.errors import (
    IsADirectory,
)

if TYPE_CHECKING:  # a part of `Filesystem`: its state is the core's (typed loosely
    # until the parts take collaborators instead of sharing one object)
    from typing import Any as _Base

    from tierfs.core.filesystem import Attr
else:
    _Base = object

log = logging.getLogger("tierfs.fs")


class Attributes(_Base):
    """setattr: sizes, modes, and times on files, directories and symlinks."""

    async def setattr(
        self, ino: int, *, size: int | None = None, mtime_ns: int | None = None
    ) -> Attr:
        inode = self._inode(ino)
        await self._settle(inode.path)
        if size is not None:
            if inode.kind is Kind.DIR:
                raise IsADirectory(inode.path)
            self._writable()
            await self._after_upload(inode)
            await self._truncate(inode, size)
        if mtime_ns is not None:
            self._writable()
            if inode.kind is Kind.FILE:
                await self._set_mtime(inode, mtime_ns)
            elif inode.kind is Kind.DIR:
                await self._set_dir_mtime(inode, mtime_ns)
            else:  # a symlink: its object was written at symlink()
                inode.mtime_ns = mtime_ns
                await self._patch_mtime(inode, self.names.file_object(inode.path), mtime_ns)
        if inode.open_handles == 0 and inode.staged is not None:
            # Path-based truncate (no open file): nothing else will upload it.
            await self._persist(inode)
            self._retire(inode)
        return self.attr(inode)

    async def _truncate(self, inode: Inode, size: int) -> None:
        self._observe(inode)
        old_size = inode.staged.size if inode.staged is not None else inode.size
        if inode.staged is None:
            await self._stage(inode, size)
        assert inode.staged is not None
        if inode.stream is not None and size != inode.stream.offset:
            self._end_stream(inode)
        if size != old_size or inode.generation == 0:
            inode.staged.truncate(size)
            inode.mtime_ns = self.clock_ns()
