"""The stack's own ceiling: a pyfuse3 + trio file system that keeps files in a dict.

It answers the requests a create-write-close makes (LOOKUP, CREATE, WRITE, FLUSH,
RELEASE, plus what reading them back, fsync, mkdir and rename need) with no work behind
them: no GCS, no journal, no disk. Its files/s in the create workload, and its time for
the Orbax- and DCP-shaped saves, are what any file system built on pyfuse3 and trio can
reach on this machine, so tierfs's numbers can be read as a fraction of them
(`benchmarks.systems.NullFuse`). Its writes go through the daemon (no passthrough).
Run: ``python -m benchmarks.nullfs DIR``; it serves until unmounted.
"""

from __future__ import annotations

import errno
import os
import stat
import sys
import time

import pyfuse3
import trio


class _Node:
    __slots__ = ("children", "data", "ino", "mode", "mtime_ns")

    def __init__(self, ino: int, mode: int) -> None:
        self.ino = ino
        self.mode = mode
        self.data = bytearray()
        self.children: dict[bytes, int] = {}
        self.mtime_ns = time.time_ns()


class NullFs(pyfuse3.Operations):
    """Files in memory, one inode table; no permissions, no persistence."""

    enable_writeback_cache = False

    def __init__(self) -> None:
        super().__init__()
        self.nodes = {pyfuse3.ROOT_INODE: _Node(pyfuse3.ROOT_INODE, stat.S_IFDIR | 0o755)}
        self.next_ino = pyfuse3.ROOT_INODE + 1

    def _node(self, ino: int) -> _Node:
        try:
            return self.nodes[ino]
        except KeyError:
            raise pyfuse3.FUSEError(errno.ENOENT) from None

    def _attr(self, node: _Node) -> pyfuse3.EntryAttributes:
        out = pyfuse3.EntryAttributes()
        out.st_ino = node.ino
        out.st_mode = node.mode
        out.st_nlink = 1
        out.st_size = len(node.data)
        out.st_uid, out.st_gid = os.getuid(), os.getgid()
        out.st_atime_ns = out.st_mtime_ns = out.st_ctime_ns = node.mtime_ns
        out.st_blksize = 4096
        out.st_blocks = (len(node.data) + 511) // 512
        out.entry_timeout = out.attr_timeout = 1.0
        return out

    def _add(self, parent: int, name: bytes, mode: int) -> _Node:
        directory = self._node(parent)
        if name in directory.children:
            raise pyfuse3.FUSEError(errno.EEXIST)
        node = _Node(self.next_ino, mode)
        self.next_ino += 1
        self.nodes[node.ino] = node
        directory.children[name] = node.ino
        return node

    async def lookup(
        self, parent_inode: int, name: bytes, ctx: pyfuse3.RequestContext | None = None
    ) -> pyfuse3.EntryAttributes:
        ino = self._node(parent_inode).children.get(name)
        if ino is None:
            raise pyfuse3.FUSEError(errno.ENOENT)
        return self._attr(self.nodes[ino])

    async def getattr(
        self, inode: int, ctx: pyfuse3.RequestContext | None = None
    ) -> pyfuse3.EntryAttributes:
        return self._attr(self._node(inode))

    async def setattr(
        self,
        inode: int,
        attr: pyfuse3.EntryAttributes,
        fields: pyfuse3.SetattrFields,
        fh: int | None,
        ctx: pyfuse3.RequestContext,
    ) -> pyfuse3.EntryAttributes:
        node = self._node(inode)
        if fields.update_size:
            del node.data[attr.st_size :]
            node.data.extend(b"\0" * (attr.st_size - len(node.data)))
        return self._attr(node)

    async def mkdir(
        self, parent_inode: int, name: bytes, mode: int, ctx: pyfuse3.RequestContext
    ) -> pyfuse3.EntryAttributes:
        return self._attr(self._add(parent_inode, name, stat.S_IFDIR | (mode & 0o7777)))

    async def rename(
        self,
        parent_old: int,
        name_old: bytes,
        parent_new: int,
        name_new: bytes,
        flags: int,
        ctx: pyfuse3.RequestContext,
    ) -> None:
        source, target = self._node(parent_old), self._node(parent_new)
        ino = source.children.get(name_old)
        if ino is None:
            raise pyfuse3.FUSEError(errno.ENOENT)
        replaced = target.children.get(name_new)
        if replaced is not None and self.nodes[replaced].children:
            raise pyfuse3.FUSEError(errno.ENOTEMPTY)
        del source.children[name_old]
        target.children[name_new] = ino

    async def unlink(self, parent_inode: int, name: bytes, ctx: pyfuse3.RequestContext) -> None:
        if self._node(parent_inode).children.pop(name, None) is None:
            raise pyfuse3.FUSEError(errno.ENOENT)

    async def rmdir(self, parent_inode: int, name: bytes, ctx: pyfuse3.RequestContext) -> None:
        directory = self._node(parent_inode)
        ino = directory.children.get(name)
        if ino is None:
            raise pyfuse3.FUSEError(errno.ENOENT)
        if self.nodes[ino].children:
            raise pyfuse3.FUSEError(errno.ENOTEMPTY)
        del directory.children[name]

    async def create(
        self, parent_inode: int, name: bytes, mode: int, flags: int, ctx: pyfuse3.RequestContext
    ) -> tuple[pyfuse3.FileInfo, pyfuse3.EntryAttributes]:
        node = self._add(parent_inode, name, stat.S_IFREG | (mode & 0o7777))
        return pyfuse3.FileInfo(fh=node.ino), self._attr(node)

    async def open(self, inode: int, flags: int, ctx: pyfuse3.RequestContext) -> pyfuse3.FileInfo:
        node = self._node(inode)
        if flags & os.O_TRUNC:
            node.data.clear()
        return pyfuse3.FileInfo(fh=inode)

    async def read(self, fh: int, off: int, size: int) -> bytes:
        # A view, not a copy: pyfuse3 writes it to the kernel as is (tierfs answers reads
        # the same way), so the read rates measure FUSE and trio, not a memcpy of ours.
        return memoryview(self._node(fh).data)[off : off + size]  # type: ignore[return-value]

    async def write(self, fh: int, off: int, buf: bytes) -> int:
        data = self._node(fh).data
        if off > len(data):
            data.extend(b"\0" * (off - len(data)))
        data[off : off + len(buf)] = buf
        return len(buf)

    async def flush(self, fh: int) -> None:
        return None

    async def fsync(self, fh: int, datasync: bool) -> None:
        return None

    async def release(self, fh: int) -> None:
        return None

    async def opendir(self, inode: int, ctx: pyfuse3.RequestContext) -> int:
        return inode

    async def readdir(self, fh: int, start_id: int, token: pyfuse3.ReaddirToken) -> None:
        entries = sorted(self._node(fh).children.items())
        for index, (name, ino) in enumerate(entries[start_id:], start_id + 1):
            if not pyfuse3.readdir_reply(token, name, self._attr(self.nodes[ino]), index):
                break

    async def fsyncdir(self, fh: int, datasync: bool) -> None:
        return None

    async def releasedir(self, fh: int) -> None:
        return None


def main(mountpoint: str) -> None:
    options = set(pyfuse3.default_options)
    options.update({"fsname=nullfs", "subtype=nullfs"})
    pyfuse3.init(NullFs(), mountpoint, options)
    try:
        trio.run(pyfuse3.main)
    finally:
        pyfuse3.close(unmount=False)  # unmounted from outside: that is how it stops


if __name__ == "__main__":
    main(sys.argv[1])
