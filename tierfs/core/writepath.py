"""The write path of the filesystem core: from a file's last close to GCS.

flush, fsync and release; staging a local copy for writes; and, with write-back, the
commit to the local journal (`tierfs.core.writeback`) and the queueing of background
uploads (`tierfs.core.uploader`). How the bytes are sent (streams, uploads, what their
success changes) is `tierfs.core.uploads`. Which close publishes is decided in
`tierfs.fuse.closes` (a forked child's or a dup's FLUSH publishes nothing).

A mixin of `tierfs.core.filesystem.Filesystem`: it shares that class's state.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import logging
import mimetypes
import os
from collections.abc import Iterator
from typing import TYPE_CHECKING

import trio

from tierfs.core.handles import FileHandle
from tierfs.core.inodes import Inode, Kind
from tierfs.core.writeback import SPARE_FILES, Record
from tierfs.core.writer import Staged
from tierfs.errors import NotFound, PreconditionFailed, Unsupported
from tierfs.storage import ObjectInfo

log = logging.getLogger("tierfs.fs")


if TYPE_CHECKING:  # a part of `Filesystem`: its state is the core's (typed loosely
    # until the parts take collaborators instead of sharing one object)
    from typing import Any as _Base
else:
    _Base = object


class WritePath(_Base):
    """flush, fsync, release, staging and commits."""

    _spares_coming: bool  # set up by Filesystem.__init__

    async def flush(self, fh: int, *, last: bool = True) -> None:
        """close() of one descriptor. One that is not the file's last close (``last``
        False: a forked child's exit, a dup'd fd; see tierfs.fuse.closes) publishes nothing
        without write-back, so no partial object appears: release uploads what is left."""
        if not last and self.journal is None:
            self.flushes_held += 1
            return
        await self._persist(self.files[fh].inode)

    async def fsync(self, fh: int) -> None:
        """Without write-back: upload now; a file streaming (`tierfs.core.streaming`) only
        has what was written so far handed to its upload, the object is made at close, as
        gcsfuse's (an fsync made the object, and the next close uploaded the whole file
        again: a log fsync'd at each line went up whole each time). With write-back: the
        data and its journal record are durable on the local tier when this returns (the
        upload waits for the last close); ``write:fsync-to-gcs`` makes it wait for GCS too
        (and retry a failed background upload: its error is this call's error)."""
        inode = self.files[fh].inode
        stream = inode.stream
        if self.journal is None and stream is not None and stream.failed is None:
            await stream.handed()
            if inode.stream is stream and stream.failed is None:
                return
        if self.journal is not None and not self.settings.fsync_to_gcs:
            await self._commit(inode, durable=True)
        else:
            await self._sync(inode)

    async def release(self, fh: int) -> None:
        handle = self.files.pop(fh)
        if handle is None:
            return
        self._observe(handle.inode)  # what the kernel wrote directly, before it lets go
        self._release_backing(handle)  # first: a next open must see the kernel's state
        try:
            await self._persist(handle.inode)
        except Exception as err:
            # The kernel does not wait for RELEASE: nobody else will hear of this.
            log.warning("%s: upload at the last close failed: %s", handle.inode.path, err)
            raise
        finally:
            self._close_handle(handle)
        self._queue_if_closed(handle.inode)

    async def _persist(self, inode: Inode) -> None:
        """close() and flush(): upload now, or, with write-back, commit to the journal (a
        flush also comes from a forked child's exit or a dup'd fd's close while the file is
        still being written: the upload itself waits for the last release)."""
        self.uploads.busy()
        if self.journal is None:
            await self._sync(inode)
        else:
            await self._commit(inode)
            self._queue_if_closed(inode)  # (a path-based truncate or utime: nothing is open)

    def _release_backing(self, handle: FileHandle) -> None:
        if handle.backing_id:
            handle.backing_id = 0
            inode = handle.inode
            self.backings.release(inode)
            if inode.staged is not None and not self.backings.holds_staged(inode):
                inode.staged.direct = False

    def _observe(self, inode: Inode) -> None:
        """Take in what the kernel wrote straight into a staged file (passthrough)."""
        staged = inode.staged
        if staged is not None and staged.direct:
            mtime_ns = staged.observe()
            if mtime_ns is not None:
                inode.mtime_ns = mtime_ns

    def _close_handle(self, handle: FileHandle) -> None:
        self._release_backing(handle)
        self.files.pop(handle.fh)
        inode = handle.inode
        inode.open_handles -= 1
        self._writers -= handle.writable
        if handle.reader is not None:
            handle.reader.close()
        self._retire(inode)

    def _retire(self, inode: Inode) -> None:
        """Let go of a closed file's staged copy once GCS has the truth: it was uploaded,
        lost to another writer (the caller got ESTALE), or unlinked."""
        staged = inode.staged
        if (
            inode.open_handles == 0
            and staged is not None
            and (not staged.dirty or staged.clobbered or inode.unlinked)
        ):
            self._drop_staged(inode)
            self._failed.pop(inode.ino, None)  # (nothing of it is tried again)
            if staged.clobbered:
                self.inodes.detach(inode)
        self.inodes.release(inode)

    def _drop_staged(self, inode: Inode) -> None:
        self._end_stream(inode)
        staged = inode.staged
        if staged is None:
            return
        staged.close()
        inode.staged = None
        if staged.record_id is not None and self.journal is not None:
            cache_as = staged.cache_as
            if (
                cache_as is not None
                and cache_as[3] == staged.version == staged.uploaded_version
                and not staged.clobbered
                and not inode.unlinked
                and self.background.running
            ):
                self._adopt_staged(staged.record_id, cache_as)
                return
            self.journal.discard(staged.record_id)  # two unlinks; a conflict was moved aside

    async def _after_upload(self, inode: Inode) -> None:
        """Before a change to a file's bytes (an open for writing, a truncate, a write
        through another handle): an upload of it under way (its lock held) ends first, as
        gcsfuse's inode lock makes it. It reads the file as it sends it: changed meanwhile,
        GCS got bytes of a file still being written (write-back: and the journal let go of
        the closed version's record), or the closer got EIO. Bounded by the upload's own."""
        if inode.staged is not None and inode.lock.locked():
            async with self._lock(inode):
                pass

    def _forget_record(self, inode: Inode) -> None:
        """An unlinked write-back file still open: drop its journal record and file now
        (its handles read and write through the open descriptor), or the next mount, after
        a crash, would upload it again."""
        staged = inode.staged
        if staged is None or staged.record_id is None or self.journal is None:
            return
        self.journal.discard(staged.record_id)
        staged.record_id = None

    def _adopt_staged(self, record_id: str, cache_as: tuple[str, int, int, int]) -> None:
        """Let the SSD tier take an uploaded journal file as the object's data file (a
        rename, in the background, after the copies waiting before it), then drop what the
        journal has left of it. Crash before: the next mount deletes the file (no record)."""
        assert self.journal is not None
        journal = self.journal
        name, generation, size, _ = cache_as
        self._copies.start(
            self.background.spawn,
            name,
            lambda: self.blocks.adopt_local(journal.data_path(record_id), name, generation, size),
            # what is left: the file if not taken, a record file
            lambda: journal.discard(record_id),
        )

    async def _sync(self, inode: Inode) -> None:
        """Upload the inode's staged data if it has changes (fsync; flush and close unless
        write-back is on)."""
        async with self._lock(inode):
            await self._sync_locked(inode)

    async def _sync_locked(self, inode: Inode) -> None:
        self._observe(inode)
        staged = inode.staged
        if staged is None or not staged.dirty or inode.unlinked:
            return
        if staged.clobbered:
            raise PreconditionFailed(inode.path)
        if staged.write_error:
            self._abandon(inode)
        await self._upload(inode, self._object_of(inode))

    def _object_of(self, inode: Inode) -> str:
        """The object an inode's staged file becomes: a directory's is its placeholder."""
        if inode.kind is Kind.DIR:
            return self.names.dir_object(inode.path)
        if inode.file_move is not None and inode.remote is not None:
            return inode.remote  # renamed: its object is moved once this upload ends
        return self.names.file_object(inode.path)

    @staticmethod
    def _check_writes(handle: FileHandle) -> None:
        """A write through ``handle``: EBADF unless it was opened for writing; once its
        changes were dropped (`_abandon`), the dropped write's errno until it is closed."""
        if not handle.writable:
            raise Unsupported("file not open for writing", errno.EBADF)
        if handle.failed:
            raise OSError(handle.failed, os.strerror(handle.failed), handle.inode.path)

    def _abandon(self, inode: Inode) -> None:
        """A local write failed (ENOSPC...): drop the changes rather than upload a file that
        is not what was written; a new file disappears. Raises that write's error."""
        staged = inode.staged
        assert staged is not None
        code = staged.write_error
        for handle in self.files.values():
            if handle.inode is inode and handle.writable:
                handle.failed = code
        self._drop_staged(inode)
        if inode.generation == 0:
            inode.unlinked = True
            self._removed(inode.path)
            self.owned.removed(inode.path)
            self.inodes.detach(inode)
        log.error("%s: a local write failed (%s); changes dropped", inode.path, os.strerror(code))
        raise OSError(code, os.strerror(code), inode.path)

    async def _commit(self, inode: Inode, *, durable: bool = False) -> None:
        """Commit the staged file to the journal (`_queue_if_closed` uploads it): safe from
        a daemon crash once this returns, and with ``durable`` (fsync) from a machine crash
        too. close() is not durable, as on a local disk: an fsync per close would cap a
        save of small files at a few hundred per second."""
        if self._committed_already(inode, durable):
            return  # (a reader's close never waits for the lock an upload holds)
        async with self._lock(inode):
            await self._commit_locked(inode, durable=durable)

    async def _commit_locked(self, inode: Inode, *, durable: bool = False) -> None:
        """`_commit`, the inode's lock held."""
        self._observe(inode)
        staged = inode.staged
        if self._committed_already(inode, durable, observed=True):
            return
        assert staged is not None
        if staged.clobbered:
            raise PreconditionFailed(inode.path)
        if staged.write_error:
            self._abandon(inode)
        assert self.journal is not None and staged.record_id is not None
        version = staged.version
        commit = functools.partial(
            self.journal.commit, staged.fd, self._record(inode), durable=durable
        )
        if self.journal.inline and not durable:
            commit()  # one fsetxattr: a thread's round trip would cost more
        else:
            await trio.to_thread.run_sync(commit)
        staged.committed_version = version
        if durable:
            staged.durable_version = version
        self.writeback_counts["committed"] += 1

    @staticmethod
    def _committed_already(inode: Inode, durable: bool, *, observed: bool = False) -> bool:
        """Nothing for `_commit` to do (unless the kernel wrote to the file directly and
        that is not ``observed`` yet: only the lock's holder may look)."""
        staged = inode.staged
        if staged is None or inode.unlinked:
            return True
        if staged.direct and not observed:
            return False
        if not staged.dirty:
            return True
        return staged.committed and (not durable or staged.durable_version == staged.version)

    def _queue_if_closed(self, inode: Inode) -> None:
        """With write-back, once no handle is open: queue the upload of what was committed.
        Never while open, so no object is made from a file still being written."""
        staged = inode.staged
        if (
            self.journal is not None
            and inode.open_handles == 0
            and not inode.unlinked
            and staged is not None
            and staged.committed
            and staged.dirty
        ):
            self._queue_upload(inode, self.settings.write_back_delay_s)

    def _record(self, inode: Inode) -> Record:
        staged = inode.staged
        assert staged is not None and staged.record_id is not None
        object_name = self._object_of(inode)
        return Record(
            staged.record_id,
            object_name,
            staged.base_generation,
            self._upload_metadata(inode),
            mimetypes.guess_type(object_name)[0],
            staged.size,
        )

    def _queue_upload(self, inode: Inode, delay_s: float = 0.0) -> None:
        self.uploads.queue(inode.ino, inode, delay_s)

    @staticmethod
    def _committed_again(inode: Inode) -> bool:
        """Written and committed again while its upload ran: upload once more (once it is
        closed: the release of an open one queues it)."""
        staged = inode.staged
        return inode.open_handles == 0 and staged is not None and staged.committed and staged.dirty

    async def _stage(self, inode: Inode, length: int) -> None:
        """Give a clean file inode a local copy of (the first ``length`` bytes of) its object."""
        async with self._lock(inode):
            if inode.staged is not None:
                return
            if inode.generation == 0:
                with self._staging():
                    inode.staged = Staged.new(self.settings.temp_dir, journal=self.journal)
                return
            info = ObjectInfo(
                self.names.file_object(inode.path),
                inode.size,
                inode.generation,
                inode.metageneration,
            )
            try:
                with self._staging():
                    inode.staged = await Staged.from_object(
                        self.bucket,
                        info,
                        self.settings.temp_dir,
                        min(length, inode.size),
                        self.journal,
                    )
            except NotFound:
                raise PreconditionFailed(inode.path) from None

    def _make_spares(self) -> None:
        """Have a thread make empty journal files ahead (`Journal.new_file`): on a disk where
        a create costs ~1 ms, a save of small files would otherwise wait for each."""
        journal = self.journal
        if journal is None or not self.background.running or self._spares_coming:
            return
        if journal.spares >= SPARE_FILES // 2:
            return
        self._spares_coming = True

        async def make() -> None:
            try:
                await trio.to_thread.run_sync(journal.make_spares, SPARE_FILES)
            except Exception as err:  # a full disk: the next create() says so itself
                log.debug("write-back journal: no spare files made: %s", err)
            finally:
                self._spares_coming = False

        self.background.spawn(make)

    @contextlib.contextmanager
    def _staging(self) -> Iterator[None]:
        """Around making a local file for writes: a failure (a full or vanished ``temp-dir``
        or write-back directory) still reaches the caller as its errno, and is counted in
        `tierfs stats`; the first one is also said at WARNING, since the mount itself looks
        healthy while every create fails."""
        try:
            yield
        except OSError as err:
            self.staging_errors += 1
            level = logging.WARNING if self.staging_errors == 1 else logging.DEBUG
            log.log(
                level, "cannot make a local file for writing: %s (counted in tierfs stats)", err
            )
            raise
