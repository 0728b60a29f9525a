"""Sending a file's bytes to GCS: streams, whole-file uploads, the write-back uploader.

The other half of `tierfs.core.writepath`, split off where the write path hands a
file to GCS: a streaming upload of a new file while it is written, the upload of a
staged file (finishing its stream if that holds every byte), the background
uploader's attempts and what their success changes (the journal record done, the
names and the inode's generation learned, a copy kept in the SSD tier).

A mixin of `tierfs.core.filesystem.Filesystem`: it shares that class's state.
"""

from __future__ import annotations

import contextlib
import logging
import mimetypes
import os
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

import trio

from tierfs.core.deletes import DELETE_WORKERS
from tierfs.core.inodes import Inode, Kind
from tierfs.core.namespace import Found
from tierfs.core.streaming import Stream
from tierfs.core.writeback import file_crc32c
from tierfs.core.writer import MTIME_KEY, Staged, format_mtime
from tierfs.errors import PreconditionFailed, UploadedOtherBytes
from tierfs.storage import ObjectInfo

log = logging.getLogger("tierfs.fs")
# Writes (FUSE sends at most 1 MiB each) queued per streaming file while its upload
# sends a chunk: enough to keep the upload busy, small beside the chunk it buffers.
STREAM_QUEUE_WRITES = 8
# Write-back uploads of files over this size (the client's single-request limit; larger
# ones are resumable, and it holds a chunk of each in memory) run at most LARGE_UPLOADS at
# a time, so many uploaders serve small files without a save of big ones costing memory.
LARGE_UPLOAD_BYTES = 8 << 20
LARGE_UPLOADS = 4
# SSD-tier copies of uploaded files made at a time. Each is a few file operations in
# worker threads; run beside 16 uploads they multiplied the threads contending for the GIL
# (a save of 1,000 small files: 460 futex calls an upload, twice the CPU) and halved the
# upload rate. One at a time they keep up with the disk, and no upload waits for them.
# More than CACHE_COPIES_WAITING waiting: the upload is not copied (a miss later, not a
# backlog of open files whose disk space a journal could not give back).
CACHE_COPIES = 1
CACHE_COPIES_WAITING = 1024


class CacheCopies:
    """The SSD-tier copies and adoptions of uploaded files: run `CACHE_COPIES` at a time in
    the background, counted (`tierfs stats`: copying, not copied), and waited for by
    unmount, so a restore after a remount finds whole files. One piece of bookkeeping for
    both ways a file gets there (`Uploads._cache_upload`, `WritePath._adopt_staged`)."""

    def __init__(self) -> None:
        self.running = 0  # started and not ended, waiting for their turn included
        self.skipped = 0  # uploads not copied: too many waiting
        self._limiter = trio.CapacityLimiter(CACHE_COPIES)
        self._idle = trio.Event()
        self._idle.set()

    def full(self) -> bool:
        """Too many wait: the caller skips this copy (counted)."""
        if self.running >= CACHE_COPIES_WAITING:
            self.skipped += 1
            return True
        return False

    def start(
        self,
        spawn: Callable[[Callable[[], Awaitable[None]]], None],
        name: str,
        job: Callable[[], Awaitable[object]],
        cleanup: Callable[[], None],
    ) -> None:
        """Run ``job`` in its turn, then ``cleanup`` whatever happened. A failure is
        logged: a tier that could not be filled is only a miss later."""
        if not self.running:
            self._idle = trio.Event()
        self.running += 1

        async def run() -> None:
            try:
                async with self._limiter:
                    await job()
            except Exception as err:
                log.warning("could not keep gs://%s in the SSD tier: %s", name, err)
            finally:
                try:
                    cleanup()
                finally:  # (a clean-up that raises must not leave unmount waiting)
                    self.running -= 1
                    if not self.running:
                        self._idle.set()

        spawn(run)

    async def wait_idle(self) -> None:
        while self.running:
            await self._idle.wait()


if TYPE_CHECKING:  # a part of `Filesystem`: its state is the core's (typed loosely
    # until the parts take collaborators instead of sharing one object)
    from typing import Any as _Base
else:
    _Base = object


class Uploads(_Base):
    """Streams, uploads of staged files, and the background uploader's attempts."""

    async def _start_stream(self, inode: Inode, object_name: str) -> None:
        upload = await self.bucket.open_upload(
            object_name,
            if_generation_match=0,
            chunk_bytes=self.settings.stream_chunk_bytes,
            content_type=mimetypes.guess_type(object_name)[0],
        )
        inode.stream = Stream(upload, max_pending=STREAM_QUEUE_WRITES)
        self._streams += 1
        assert self.background.running
        self.background.spawn(inode.stream.run)

    def _end_stream(self, inode: Inode) -> None:
        """Abandon the inode's streaming upload (in the background); the staged file has
        every byte, so the file simply becomes a staged write."""
        stream, inode.stream = inode.stream, None
        if stream is not None:
            self._streams -= 1
            assert self.background.running
            self.background.spawn(stream.abort)

    async def _send(self, inode: Inode, staged: Staged, object_name: str) -> ObjectInfo:
        """Make the object from the staged file: by finishing its stream if it has one that
        holds every byte, else by uploading the file whole."""
        stream, inode.stream = inode.stream, None
        version, landed = staged.version, False
        if stream is not None:
            self._streams -= 1
            if staged.size < self.settings.stream_chunk_bytes:
                # Nothing was sent yet: one plain upload is cheaper than finishing a
                # resumable session (and the emulator honours its precondition).
                await stream.abort()
            elif stream.holds(staged.size) and not staged.clobbered:
                try:
                    info = await stream.finish()
                except PreconditionFailed:
                    raise
                except UploadedOtherBytes as err:
                    log.warning("%s; uploading whole over it", err)
                    staged.base_generation = err.generation  # (ours: replaced, not a conflict)
                except Exception as err:
                    log.warning(
                        "%s: streaming upload failed (%s); uploading whole", object_name, err
                    )
                    landed = True  # (its last request may have made the object, answer lost)
                else:
                    staged.base_generation = info.generation
                    staged.uploaded_version = version
                    return info
            else:
                await stream.abort()
        try:
            return await staged.upload(self.bucket, object_name, self._upload_metadata(inode))
        except PreconditionFailed:
            own = await self._own_stream(staged, object_name, version) if landed else None
            if own is None:
                raise
            return own

    async def _own_stream(
        self, staged: Staged, object_name: str, version: int
    ) -> ObjectInfo | None:
        """The object a streaming upload made although its finish failed (a stalled last
        request cut while GCS completed it, then 404 for the session): the whole upload
        after it fails its precondition on that very object, and close said ESTALE with
        the bytes in GCS (seen in the bench, 1 GiB streamed to the emulator). It is ours
        when it holds exactly the staged bytes (size and CRC32C); else None."""
        try:
            info = await self.bucket.stat(object_name)
        except Exception:  # (nothing there, or GCS unreachable: the ESTALE stands)
            return None
        if info.size != staged.size or info.crc32c is None:
            return None
        crc = await trio.to_thread.run_sync(file_crc32c, f"/proc/self/fd/{staged.fd}")
        if crc != info.crc32c:
            return None
        log.warning("%s: made by the streaming upload after all", object_name)
        staged.base_generation = info.generation
        staged.uploaded_version = version
        return info

    async def run_uploads(self, workers: int, retry_s: float = 5.0) -> None:
        """The write-back uploader and deleter (run until cancelled): `tierfs.core.uploader`,
        `tierfs.core.deletes`."""
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self.uploads.run, workers, retry_s)
            nursery.start_soon(self.deletes.run, DELETE_WORKERS, retry_s)

    def uploads_idle(self) -> bool:
        return self.uploads.idle()

    async def _upload_in_background(self, inode: Inode) -> bool:
        """One queued upload; False when it should be tried again later."""
        if inode.open_handles:
            return True  # opened again while queued: its last release queues it again
        staged = inode.staged
        large = staged is not None and staged.size > LARGE_UPLOAD_BYTES
        try:
            async with self._large_uploads if large else contextlib.nullcontext():
                async with self._lock(inode):
                    # Checked again with the lock held (an open waits for it from here):
                    # opened while it waited for a slot or the lock, a file being
                    # rewritten would be published half done.
                    if inode.open_handles:
                        return True
                    await self._sync_locked(inode)
        except PreconditionFailed:
            log.error(
                "write-back: gs://%s was changed by another client; this mount's version "
                "is kept in %s",
                self.names.file_object(inode.path),
                self.journal.conflicts_dir if self.journal else "?",
            )
        except Exception as err:
            self.writeback_counts["failed"] += 1
            self._failed[inode.ino] = f"{self.names.file_object(inode.path)}: {err}"
            log.error("write-back: upload of gs://%s failed, will retry: %s", inode.path, err)
            return False
        self._retire(inode)
        return True

    def _upload_metadata(self, inode: Inode) -> dict[str, str]:
        if inode.kind is Kind.DIR:  # a placeholder, as mkdir writes it (+ a time set on it)
            return dict(inode.metadata)
        metadata = dict(inode.metadata)
        metadata[MTIME_KEY] = format_mtime(inode.mtime_ns)
        return metadata

    async def _upload(self, inode: Inode, object_name: str) -> None:
        if inode.remote is not None and inode.file_move is None:
            await self._settle(inode.path)  # its directory's move is still moving it here
        staged = inode.staged
        assert staged is not None
        try:
            info = await self._send(inode, staged, object_name)
        except UploadedOtherBytes as err:
            # In GCS now, if not these bytes (`Staged.upload` replaces it next): an unlink
            # or a rename meanwhile must know that an object is there.
            inode.generation = err.generation
            raise
        except PreconditionFailed:
            if inode.kind is Kind.DIR:  # another client made this directory too: it exists
                info = await self.bucket.stat(object_name)
                staged.uploaded_version = staged.version
                await self._uploaded_placeholder(inode, staged, info)
                return
            staged.clobbered = True
            self.names.forget(inode.path)
            if staged.committed_version is not None:
                # close() already said yes to these bytes: keep them for the user.
                assert self.journal is not None
                self.writeback_counts["conflicts"] += 1
                with contextlib.suppress(FileNotFoundError):
                    await trio.to_thread.run_sync(self.journal.keep_conflict, self._record(inode))
            raise
        if inode.kind is Kind.DIR:
            await self._uploaded_placeholder(inode, staged, info)
            return
        if object_name == self.names.file_object(inode.path):  # (else its old name: moving)
            self.names.learned(inode.path, Found(False, info))
        await self._uploaded(inode, staged)
        if self.background.running and self.settings.file_cache:
            self._cache_upload(staged, object_name, info)
        inode.generation = info.generation
        inode.metageneration = info.metageneration
        inode.size = info.size
        inode.metadata = dict(info.metadata)
        inode.crc32c = info.crc32c

    async def _uploaded(self, inode: Inode, staged: Staged) -> None:
        """An upload of a staged file succeeded: its journal record is done."""
        self._failed.pop(inode.ino, None)
        if staged.committed_version is not None:
            assert self.journal is not None and staged.record_id is not None
            if staged.uploaded_version >= staged.committed_version:
                if self.journal.inline:  # two syscalls: less than a thread's round trip
                    self.journal.done(staged.record_id)
                else:
                    await trio.to_thread.run_sync(self.journal.done, staged.record_id)
            self.writeback_counts["uploaded"] += 1

    async def _uploaded_placeholder(self, inode: Inode, staged: Staged, info: ObjectInfo) -> None:
        self.names.learned(inode.path, Found(True, info, placeholder=True))
        await self._uploaded(inode, staged)
        inode.generation = info.generation
        inode.metageneration = info.metageneration

    def _cache_upload(self, staged: Staged, object_name: str, info: ObjectInfo) -> None:
        """Keep what was just uploaded in the SSD tier too (in the background, from a dup of
        the staged file, which may be closed meanwhile), unless it is written again first.
        A write-back journal's file on the SSD tier's file system is not copied: the tier
        takes the file itself when the journal lets go of it (`_adopt_staged`)."""
        assert self.background.running
        version = staged.uploaded_version  # what the file held when the upload began
        if staged.version != version:
            return  # written during the upload: the object is not what the file holds
        if (
            staged.record_id is not None
            and self.journal is not None
            and self.blocks.adopts_from(self.journal.dir)
        ):
            staged.cache_as = (object_name, info.generation, info.size, version)
            return
        if self._copies.full():
            return
        fd = os.dup(staged.fd)

        def unchanged() -> bool:
            return staged.version == version

        self._copies.start(
            self.background.spawn,
            object_name,
            lambda: self.blocks.store_local(fd, object_name, info.generation, info.size, unchanged),
            lambda: os.close(fd),
        )
