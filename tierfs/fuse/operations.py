"""pyfuse3 handlers: translation between the kernel's requests and `Filesystem`.

Nothing here decides semantics. Each handler is wrapped by `_handler`, the
one place where an exception becomes an errno: a `FUSEError` passes, a
tierfs error or an ``OSError`` becomes its errno through `errno_of` (the one
table), anything else is logged with its traceback and answered EIO. Only
`FUSEError` may leave a pyfuse3 handler; anything else would end the mount.

Unsupported operations answer as gcsfuse does: hard links and xattrs ENOSYS
(so the kernel stops asking), mknod ENOTSUP.
"""

from __future__ import annotations

import errno
import functools
import logging
import os
import re
import stat
import time
from collections.abc import Callable, Coroutine, Sequence
from typing import Any, ParamSpec, TypeVar, cast

import pyfuse3

from tierfs.core.filesystem import NEVER_S, Attr, Filesystem
from tierfs.core.handles import FileHandle
from tierfs.core.namespace import decode_name, decode_target
from tierfs.errors import NotFound, errno_of
from tierfs.fuse.closes import Closes, mount_id
from tierfs.fuse.collector import Collections
from tierfs.fuse.interrupts import Interrupts
from tierfs.fuse.kernel import PyfuseKernel
from tierfs.fuse.watchdog import InFlight

log = logging.getLogger("tierfs.fuse")

# pyfuse3 as tierfs builds it (deploy/pyfuse3/) lets opendir ask the kernel to cache
# listings; a stock pyfuse3 cannot, and the kept listings in the daemon do that job alone.
KERNEL_LIST_CACHE = "cache_readdir" in dir(pyfuse3.FileInfo)
# ... and lets open hand the kernel a backing file to read (FUSE passthrough).
PASSTHROUGH = hasattr(pyfuse3, "backing_open")
# ... and tells a handler its request's id, and the file system of a FUSE INTERRUPT.
INTERRUPTS = hasattr(pyfuse3, "current_request")
# What may be abandoned when its caller is interrupted: requests that change nothing, so
# answering EINTR midway leaves nothing half done (docs/semantics.md). Their GCS calls
# are abandoned too (the thread finishes in the background, its answer dropped).
ABANDONABLE = frozenset(
    {"lookup", "getattr", "readdir", "opendir", "read", "readlink", "statfs", "listxattr"}
)


def kernel_drops_listings(release: str) -> bool:
    """Whether this kernel drops a cached listing when opendir does not ask to keep it.
    6.9 to 6.12 do not (fixed by 03f275adb8fb in 6.13; gcsfuse #2792): there the kernel
    would serve a listing past its TTL, so the daemon keeps listings instead."""
    version = re.match(r"(\d+)\.(\d+)", release)
    if version is None:
        return True
    return not (6, 9) <= (int(version[1]), int(version[2])) < (6, 13)


# Requests whose first argument is a file handle, or a directory handle (else an inode).
_BY_FILE_HANDLE = frozenset({"read", "write", "flush", "fsync", "release"})
_BY_DIR_HANDLE = frozenset({"readdir", "releasedir", "fsyncdir"})

P = ParamSpec("P")
R = TypeVar("R")


def _lookup_now(
    ops: Operations, parent_inode: int, name: bytes, ctx: object = None
) -> pyfuse3.EntryAttributes | None:
    """LOOKUP from the metadata cache (`Lookups.lookup_now`); "." and ".." are the handler's."""
    if name in (b".", b".."):
        return None
    inode = ops.fs.lookup_now(parent_inode, decode_name(name))
    return None if inode is None else entry(ops.fs.attr(inode))


# Requests the core always answers without a wait: nothing to interrupt, so no cancel scope.
_NEVER_WAIT = frozenset({"getattr", "opendir", "readlink", "statfs", "listxattr"})

# Requests the core may answer at once, without a wait: then the handler needs no cancel
# scope for interrupts (`Interrupts.run`: 6 of 15 us in-process for a second touch of a
# random 4 KiB region, the daemon spending 59 us of CPU per such read against null
# pyfuse3's 38; 6 of 16 us for a lookup the metadata cache answers). Each returns the
# answer, or None: run the handler.
_AT_ONCE: dict[str, Callable[..., Any]] = {
    "read": lambda ops, fh, off, size: ops.fs.read_now(fh, off, size),
    "lookup": _lookup_now,
}


def _handler(fn: Callable[P, Coroutine[Any, Any, R]]) -> Callable[P, Coroutine[Any, Any, R]]:
    op = fn.__name__
    at_once = _AT_ONCE.get(op)

    @functools.wraps(fn)
    async def wrapped(*args: P.args, **kwargs: P.kwargs) -> R:
        self = cast("Operations", args[0])
        if at_once is not None:
            answer = _answer_at_once(self.inflight, op, at_once, args)
            if answer is not None:
                return cast(R, answer)
        inflight = self.inflight
        number = inflight.begin(op, self.describe, args[1:])
        failed = True
        try:
            if op in ABANDONABLE and INTERRUPTS and op not in _NEVER_WAIT:
                result = await self.interrupts.run(op, fn, args, kwargs)
            else:
                result = await fn(*args, **kwargs)
            failed = False
            return result
        except pyfuse3.FUSEError:
            raise
        except Exception as err:
            raise _fuse_error(op, err) from None
        finally:
            inflight.end(number, failed)

    return wrapped


def _answer_at_once(
    inflight: InFlight, op: str, at_once: Callable[..., Any], args: tuple[Any, ...]
) -> Any:
    """The answer of `_AT_ONCE`, or None. Never in flight (it cannot wait, so the watchdog
    could never see it), only counted with its latency: a request's entry and two reads
    of trio's clock were 1 of the 9 us a second touch of a random 4 KiB region cost."""
    started = time.perf_counter()
    try:
        answer = at_once(*args)
    except pyfuse3.FUSEError:
        inflight.answered(op, time.perf_counter() - started, failed=True)
        raise
    except Exception as err:
        inflight.answered(op, time.perf_counter() - started, failed=True)
        raise _fuse_error(op, err) from None
    if answer is not None:
        inflight.answered(op, time.perf_counter() - started)
    return answer


def _fuse_error(op: str, err: Exception) -> pyfuse3.FUSEError:
    """The `FUSEError` for ``err`` (its errno from the one table), logged: with its
    traceback when it is EIO, which means a defect or a fault nothing else names."""
    code = errno_of(err)
    if code == errno.EIO:
        log.error("%s failed: %s", op, err, exc_info=err)
    else:
        log.debug("%s: %s -> %s", op, err, errno.errorcode.get(code, code))
    return pyfuse3.FUSEError(code)


def file_info(handle: FileHandle) -> pyfuse3.FileInfo:
    """The reply to OPEN and CREATE. A handle with a backing file (passthrough: the kernel
    reads or writes that file itself) may not ask for KEEP_CACHE."""
    if handle.backing_id:
        return pyfuse3.FileInfo(  # type: ignore[call-arg]
            fh=handle.fh, keep_cache=False, backing_id=handle.backing_id
        )
    return pyfuse3.FileInfo(fh=handle.fh, direct_io=handle.direct_io, keep_cache=True)


def entry(attr: Attr) -> pyfuse3.EntryAttributes:
    out = pyfuse3.EntryAttributes()
    out.st_ino = attr.ino
    out.generation = 0
    out.entry_timeout = attr.entry_timeout_s
    out.attr_timeout = attr.attr_timeout_s
    out.st_mode = attr.mode
    out.st_nlink = attr.nlink
    out.st_uid = attr.uid
    out.st_gid = attr.gid
    out.st_rdev = 0
    out.st_size = attr.size
    out.st_blksize = 1 << 20
    out.st_blocks = attr.blocks
    out.st_atime_ns = attr.mtime_ns
    out.st_mtime_ns = attr.mtime_ns
    out.st_ctime_ns = attr.mtime_ns
    return out


class Operations(pyfuse3.Operations):
    """The FUSE face of one `Filesystem`."""

    supports_dot_lookup = False
    enable_writeback_cache = False
    enable_acl = False

    # The patched pyfuse3 passes flush() the closer's context (tierfs.fuse.closes).
    flush_takes_context = True

    def __init__(
        self, fs: Filesystem, mountpoint: str | None = None, kernel: PyfuseKernel | None = None
    ) -> None:
        super().__init__()
        self.fs = fs
        self.mountpoint = mountpoint
        self.kernel = kernel or PyfuseKernel()  # the same one the core was given
        self.closes = Closes()
        # The requests being served, and warnings about slow ones (its run() is started
        # beside the request loop); which of them an INTERRUPT lets go.
        self.inflight = InFlight(fs.settings.slow_request_s, lambda: fs.bucket.last_error)
        self.interrupts = Interrupts(ignore=fs.settings.ignore_interrupts)
        self.collections = Collections()  # Python's collector's pauses (`tierfs.fuse.collector`)
        self.kernel_lists = KERNEL_LIST_CACHE and fs.settings.list_ttl_s > 0
        # Asked for at INIT (pyfuse3 reads this attribute) only with an SSD tier to read, or
        # write-back files to write.
        settings = fs.settings
        self.enable_passthrough = PASSTHROUGH and (
            (settings.passthrough and any(tier.persistent for tier in fs.blocks.tiers))
            or (fs.journal is not None and settings.write_passthrough)
        )
        release = os.uname().release
        if self.kernel_lists and not kernel_drops_listings(release):
            log.warning(
                "kernel %s keeps cached listings past their TTL (fixed in 6.13): "
                "listings are kept by tierfs instead, every ls reaches the daemon",
                release,
            )
            self.kernel_lists = False

    def init(self) -> None:
        """After INIT (the mount exists): whether the kernel agreed to passthrough, and the
        mount's id, to find our files among a closing process's descriptors."""
        if self.mountpoint is not None:
            self.closes.mnt_id = mount_id(self.mountpoint)
        agreed = self.enable_passthrough and bool(getattr(pyfuse3, "passthrough", False))
        self.kernel.agreed(agreed)
        if not agreed and self.enable_passthrough:
            log.info("this kernel offers no FUSE passthrough: reads and writes go through tierfs")

    def describe(self, op: str, args: tuple[object, ...]) -> str:
        """The path a request works on, for a log line: its first argument is a file
        handle, a directory handle or an inode (then maybe a name below it)."""
        fs, first = self.fs, args[0] if args else None
        if not isinstance(first, int):
            return "?"
        try:
            if op in _BY_FILE_HANDLE:
                path = fs.files[first].inode.path
            elif op in _BY_DIR_HANDLE:
                path = fs.dirs[first].inode.path
            else:
                path = fs.inodes[first].path
        except (KeyError, AttributeError):
            return f"(inode or handle {first})"
        if len(args) > 1 and isinstance(args[1], bytes) and op != "write":
            path = (
                f"{path}/{args[1].decode('utf-8', 'replace')}"
                if path
                else args[1].decode("utf-8", "replace")
            )
        return "/" + path

    def interrupt(self, unique: int) -> None:
        """FUSE INTERRUPT of request ``unique`` (the patched pyfuse3 calls this)."""
        self.interrupts.interrupted(unique)

    def statistics(self) -> dict[str, object]:
        """What `tierfs stats` shows: the core's counters, the requests in flight, and the
        requests served by operation (as the Prometheus metrics count them)."""
        inflight = self.inflight
        served = inflight.latencies()
        return {
            **self.fs.statistics(),
            "requests": {
                "in_flight": len(inflight),
                "interrupted": self.interrupts.cancelled,
                "longest_wait_s": round(inflight.longest_wait_s(), 3),
                "slow_warnings": inflight.warnings,
                "operations": {
                    op: {"count": n.count, "errors": n.errors, "seconds": round(n.total_s, 6)}
                    for op, n in sorted(served.items())
                },
            },
            "python_gc": self.collections.statistics(),
        }

    @_handler
    async def lookup(
        self, parent_inode: int, name: bytes, ctx: pyfuse3.RequestContext | None = None
    ) -> pyfuse3.EntryAttributes:
        if name in (b".", b".."):
            raise pyfuse3.FUSEError(errno.ENOENT)
        try:
            inode = await self.fs.lookup(parent_inode, decode_name(name))
        except NotFound:
            negative_s = self.fs.settings.negative_ttl_s
            if negative_s <= 0:
                raise
            # Inode 0: the kernel remembers "no such name" for the negative TTL.
            missing = pyfuse3.EntryAttributes()
            missing.st_ino = 0
            missing.entry_timeout = min(negative_s, NEVER_S)
            return missing
        return entry(self.fs.attr(inode))

    async def forget(self, inode_list: Sequence[tuple[int, int]]) -> None:
        for ino, count in inode_list:
            self.fs.forget(ino, count)

    @_handler
    async def getattr(
        self, inode: int, ctx: pyfuse3.RequestContext | None = None
    ) -> pyfuse3.EntryAttributes:
        return entry(self.fs.getattr(inode))

    @_handler
    async def setattr(
        self,
        inode: int,
        attr: pyfuse3.EntryAttributes,
        fields: pyfuse3.SetattrFields,
        fh: int | None,
        ctx: pyfuse3.RequestContext,
    ) -> pyfuse3.EntryAttributes:
        size = attr.st_size if fields.update_size else None
        mtime = attr.st_mtime_ns if fields.update_mtime else None
        # chmod/chown/atime: accepted and ignored, as gcsfuse does.
        return entry(await self.fs.setattr(inode, size=size, mtime_ns=mtime))

    @_handler
    async def readlink(self, inode: int, ctx: pyfuse3.RequestContext) -> bytes:
        return self.fs.readlink(inode).encode("utf-8")

    @_handler
    # pyfuse3 (patched, deploy/pyfuse3) takes a FileInfo too; its stub says int only.
    async def opendir(  # type: ignore[override]
        self, inode: int, ctx: pyfuse3.RequestContext
    ) -> int | pyfuse3.FileInfo:
        # The daemon's own read (tierfs.core.prefill). (Core tests call with no context.)
        prefill = ctx is not None and self.kernel.is_reader(ctx.pid)
        fh = self.fs.opendir(inode, prefill=prefill)
        if not self.kernel_lists or prefill:
            return fh
        # The kernel caches the listing (FOPEN_CACHE_DIR) and answers a repeated readdir
        # itself while we let it keep that copy (FOPEN_KEEP_CACHE); its own creates,
        # unlinks and renames drop the copy too.
        keep = self.fs.kernel_may_keep_listing(fh)
        return pyfuse3.FileInfo(fh=fh, keep_cache=keep, cache_readdir=True)  # type: ignore[call-arg]

    @_handler
    async def readdir(self, fh: int, start_id: int, token: pyfuse3.ReaddirToken) -> None:
        attr_of = self.fs.attr
        for name, inode, next_id in await self.fs.readdir(fh, start_id):
            # The kernel struct is rebuilt only when the attributes changed: a warm
            # ``ls -lR`` re-sends the same entries, and building one costs 2 us in Python.
            attr = attr_of(inode)
            kept = inode.kernel_entry
            if kept is not None and kept[0] == attr:
                attributes = cast(pyfuse3.EntryAttributes, kept[1])
            else:
                attributes = entry(attr)
                inode.kernel_entry = (attr, attributes)
            if not pyfuse3.readdir_reply(token, name.encode("utf-8"), attributes, next_id):
                break
            self.fs.remember(inode)

    @_handler
    async def releasedir(self, fh: int) -> None:
        self.fs.releasedir(fh)

    @_handler
    async def mkdir(
        self, parent_inode: int, name: bytes, mode: int, ctx: pyfuse3.RequestContext
    ) -> pyfuse3.EntryAttributes:
        inode = await self.fs.mkdir(parent_inode, decode_name(name))
        return entry(self.fs.attr(inode))

    @_handler
    async def rmdir(self, parent_inode: int, name: bytes, ctx: pyfuse3.RequestContext) -> None:
        await self.fs.rmdir(parent_inode, decode_name(name))

    @_handler
    async def unlink(self, parent_inode: int, name: bytes, ctx: pyfuse3.RequestContext) -> None:
        await self.fs.unlink(parent_inode, decode_name(name))

    @_handler
    async def symlink(
        self, parent_inode: int, name: bytes, target: bytes, ctx: pyfuse3.RequestContext
    ) -> pyfuse3.EntryAttributes:
        inode = await self.fs.symlink(parent_inode, decode_name(name), decode_target(target))
        return entry(self.fs.attr(inode))

    @_handler
    async def rename(
        self,
        parent_inode_old: int,
        name_old: bytes,
        parent_inode_new: int,
        name_new: bytes,
        flags: int,
        ctx: pyfuse3.RequestContext,
    ) -> None:
        await self.fs.rename(
            parent_inode_old,
            decode_name(name_old),
            parent_inode_new,
            decode_name(name_new),
            flags,
        )

    @_handler
    async def create(
        self, parent_inode: int, name: bytes, mode: int, flags: int, ctx: pyfuse3.RequestContext
    ) -> tuple[pyfuse3.FileInfo, pyfuse3.EntryAttributes]:
        handle, inode = await self.fs.create(parent_inode, decode_name(name), flags)
        self.closes.opened(handle.fh, ctx.pid, inode.ino, writable=self._judged_flushes)
        return file_info(handle), entry(self.fs.attr(inode))

    @_handler
    async def open(self, inode: int, flags: int, ctx: pyfuse3.RequestContext) -> pyfuse3.FileInfo:
        handle = await self.fs.open(inode, flags)
        writable = flags & os.O_ACCMODE != os.O_RDONLY and self._judged_flushes
        self.closes.opened(handle.fh, ctx.pid, inode, writable=writable)
        return file_info(handle)

    @_handler
    async def read(self, fh: int, off: int, size: int) -> bytes:
        return await self.fs.read(fh, off, size)  # type: ignore[return-value]  # memoryview is fine

    @property
    def _judged_flushes(self) -> bool:
        """Whether FLUSHes are judged last or not (`tierfs.fuse.closes`): without write-back,
        whose uploads wait for RELEASE. Only then is a writable handle's opener looked up."""
        return self.fs.journal is None

    @_handler
    async def write(self, fh: int, off: int, buf: bytes) -> int:
        return await self.fs.write(fh, off, buf)

    @_handler
    async def flush(self, fh: int, ctx: pyfuse3.RequestContext | None = None) -> None:
        last = True
        if ctx is not None and self._judged_flushes:
            last = self.closes.is_last(fh, ctx.pid)
        await self.fs.flush(fh, last=last)

    @_handler
    async def fsync(self, fh: int, datasync: bool) -> None:
        await self.fs.fsync(fh)

    @_handler
    async def release(self, fh: int) -> None:
        self.closes.released(fh)
        await self.fs.release(fh)

    @_handler
    async def statfs(self, ctx: pyfuse3.RequestContext) -> pyfuse3.StatvfsData:
        info = self.fs.statfs()
        out = pyfuse3.StatvfsData()
        out.f_bsize = info.block_size
        out.f_frsize = info.block_size
        out.f_blocks = info.blocks
        out.f_bfree = info.free_blocks
        out.f_bavail = info.free_blocks
        out.f_files = info.files
        out.f_ffree = info.free_files
        out.f_favail = info.free_files
        out.f_namemax = info.name_max
        return out

    async def link(self, *args: Any) -> pyfuse3.EntryAttributes:
        raise pyfuse3.FUSEError(errno.ENOSYS)

    @_handler
    async def mknod(
        self, parent_inode: int, name: bytes, mode: int, rdev: int, ctx: pyfuse3.RequestContext
    ) -> pyfuse3.EntryAttributes:
        """A regular file becomes an empty object (as gcsfuse); FIFOs, sockets, devices: ENOTSUP."""
        if not stat.S_ISREG(mode):
            raise pyfuse3.FUSEError(errno.ENOTSUP)
        handle, inode = await self.fs.create(parent_inode, decode_name(name), os.O_WRONLY)
        await self.fs.release(handle.fh)
        return entry(self.fs.attr(inode))

    async def getxattr(self, *args: Any) -> bytes:
        raise pyfuse3.FUSEError(errno.ENOSYS)

    async def setxattr(self, *args: Any) -> None:
        raise pyfuse3.FUSEError(errno.ENOSYS)

    async def listxattr(self, *args: Any) -> Sequence[bytes]:
        raise pyfuse3.FUSEError(errno.ENOSYS)

    async def removexattr(self, *args: Any) -> None:
        raise pyfuse3.FUSEError(errno.ENOSYS)
