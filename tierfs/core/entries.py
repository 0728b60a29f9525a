"""create, unlink, symlink and readlink; and times: a parent's mtime when an entry comes or goes,
and the setters `setattr` uses for a file's, a directory's or a symlink's mtime.

Deletes with write-back are queued (`tierfs.core.deletes`) so an ``rm -rf`` is local; a part
of `tierfs.core.filesystem.Filesystem`, sharing its state.
"""

from __future__ import annotations

import errno
import logging
import time
from typing import TYPE_CHECKING

import trio

from tierfs.core.deletes import Delete, delete_named, delete_one
from tierfs.core.handles import FileHandle
from tierfs.core.inodes import ROOT_INO, Inode, Kind
from tierfs.core.namespace import (
    SYMLINK_FLAG_KEY,
    SYMLINK_TARGET_KEY,
    Found,
)
from tierfs.core.writer import MTIME_KEY, Staged, format_mtime, parse_mtime
from tierfs.errors import (
    AlreadyExists,
    IsADirectory,
    NotFound,
    PreconditionFailed,
    Unsupported,
    root_cause,
)
from tierfs.storage import ObjectInfo

if TYPE_CHECKING:  # a part of `Filesystem`: its state is the core's (typed loosely
    # until the parts take collaborators instead of sharing one object)
    from typing import Any as _Base
else:
    _Base = object

log = logging.getLogger("tierfs.fs")


class Entries(_Base):
    """unlink, symlink, readlink, and the mtimes of entries and their parents."""

    def _entries_changed(self, *paths: str) -> None:
        """An entry was added or removed at each of ``paths``: their directories' mtime (and
        so ctime) is now, as on a local file system. Kept in memory: a placeholder object
        is not rewritten for every file created in its directory (gcsfuse does not either)."""
        now = self.clock_ns()
        for path in paths:
            parent = self.inodes.current(path.rsplit("/", 1)[0] if "/" in path else "")
            if parent is not None and parent.kind is Kind.DIR:
                parent.mtime_ns = now

    async def _set_dir_mtime(self, inode: Inode, mtime_ns: int) -> None:
        """A directory's mtime lives in its placeholder's metadata (gcsfuse_mtime), written
        now, or with the placeholder if it is still a write-back record. A directory with no
        placeholder (implied by the objects below it, or the mount root) keeps it for this
        mount only: nothing in GCS can carry it (docs/semantics.md)."""
        inode.mtime_ns = mtime_ns
        if not inode.placeholder or inode.ino == ROOT_INO:
            return
        async with self._lock(inode):  # (its placeholder may be uploading)
            if inode.staged is not None:  # still a write-back record: goes up with it
                inode.metadata = {**inode.metadata, MTIME_KEY: format_mtime(mtime_ns)}
                inode.staged.touch()
                return
            found = await self.names.lookup(inode.path)
            if found is None or not found.placeholder or found.info is None:
                return  # the placeholder went away meanwhile: implied, this mount only
            info = await self.bucket.update_metadata(
                self.names.dir_object(inode.path),
                {MTIME_KEY: format_mtime(mtime_ns)},
                generation=found.info.generation,
            )
            self.names.learned(inode.path, Found(True, info, placeholder=True))

    async def _patch_mtime(self, inode: Inode, object_name: str, mtime_ns: int) -> None:
        """Set gcsfuse_mtime on the inode's uploaded object (a file or a symlink) without
        rewriting its bytes. Its object deleted or replaced by another client meanwhile:
        the mtime stays this mount's, and the call succeeds, as gcsfuse's (``touch``,
        ``cp -p``, ``rsync -t`` on a shared bucket failed with ENOENT or ESTALE)."""
        async with self._lock(inode):
            try:
                info = await self.bucket.update_metadata(
                    object_name, {MTIME_KEY: format_mtime(mtime_ns)}, generation=inode.generation
                )
            except (NotFound, PreconditionFailed):
                self.names.forget(inode.path)  # the next lookup finds what is there now
                return
            inode.metageneration = info.metageneration
            inode.metadata = dict(info.metadata)
            self.names.learned(inode.path, Found(False, info))

    async def _set_mtime(self, inode: Inode, mtime_ns: int) -> None:
        inode.mtime_ns = mtime_ns
        self._end_stream(inode)  # the mtime goes in the object's metadata, set at upload
        if inode.staged is not None or inode.generation == 0:
            if inode.staged is not None:
                inode.staged.touch()
            return
        await self._patch_mtime(inode, self.names.file_object(inode.path), mtime_ns)

    # -- create, unlink, symlink ------------------------------------------------------------------

    async def create(self, parent_ino: int, name: str, flags: int) -> tuple[FileHandle, Inode]:
        self.uploads.busy()
        path = self._new_path(parent_ino, name)
        await self._settle(path)
        object_name = self.names.file_object(path)
        existing = self.inodes.current(path)
        if existing is not None and not existing.unlinked and existing.kind is not Kind.FILE:
            raise AlreadyExists(path)
        with self._staging():
            staged = Staged.new(self.settings.temp_dir, journal=self.journal)
        inode = self.inodes.make(Kind.FILE, path, mtime_ns=self.clock_ns())
        inode.staged = staged
        self.owned.added(path)
        self._entries_changed(path)
        self._make_spares()
        try:
            if self.settings.create_empty_file:
                await self._upload(inode, object_name)
            elif self.background.running and self._streams < self.settings.max_streams:
                await self._start_stream(inode, object_name)
        except BaseException:
            self._unmake(inode, existing)
            raise
        self.inodes.remember(inode)
        handle = self._open_handle(inode, writable=True, flags=flags)
        if (
            self.journal is not None
            and self.settings.write_passthrough
            and staged.record_id is not None
            and inode.stream is None
        ):
            handle.backing_id = self.backings.open_staged(inode, staged.fd)
            staged.direct = bool(handle.backing_id)
        return handle, inode

    def _unmake(self, inode: Inode, existing: Inode | None) -> None:
        """A create that failed after its inode was made (GCS refused the upload session,
        or the empty object): it leaves no name behind. (It did: a file listed and looked
        up, which the next sync or unmount uploaded, for a create that said EACCES.)"""
        self._drop_staged(inode)
        inode.unlinked = True
        self.inodes.detach(inode)
        if existing is not None and not existing.unlinked:
            self.inodes.restore(existing)
        else:
            self.owned.removed(inode.path)
        self.names.forget(inode.path)
        self._entries_changed(inode.path)

    async def unlink(self, parent_ino: int, name: str) -> None:
        await self._settle(self.names.child_path(self._dir(parent_ino).path, name))
        path, inode = await self._existing(parent_ino, name)
        if inode.kind is Kind.DIR:
            raise IsADirectory(path)
        async with self._lock(inode):
            if inode.generation:
                if inode.open_handles and inode.staged is None and inode.kind is Kind.FILE:
                    await self._stage_unlocked(inode)
                if self.journal is not None:
                    await self._delete_later(path, inode.generation)
                else:
                    await delete_named(self.bucket, self.names.file_object(path), inode.generation)
            inode.unlinked = True
            self._end_stream(inode)
            self._removed(path, below=False)
            self.owned.removed(path)
            self._entries_changed(path)
            self.inodes.detach(inode)
            if inode.open_handles == 0:
                self._drop_staged(inode)  # a write-back file not uploaded yet: never will be
                self.inodes.release(inode)
            else:  # its handles keep its bytes (their fd); a crash must not bring it back
                self._forget_record(inode)

    async def _stage_unlocked(self, inode: Inode) -> None:
        """Keep an unlinked file readable by its open handles: copy it locally first. A
        copy that fails (GCS, a full temp-dir) does not fail the unlink, as gcsfuse's,
        which copies nothing: those handles then read ESTALE (it said EIO, the file kept)."""
        info = ObjectInfo(
            self.names.file_object(inode.path), inode.size, inode.generation, inode.metageneration
        )
        try:
            with self._staging():
                inode.staged = await Staged.from_object(
                    self.bucket, info, self.settings.temp_dir, inode.size
                )
        except NotFound:
            return
        except Exception as err:  # (not a cancel: an interrupted unlink stays undone)
            log.warning(
                "unlink of %s: could not keep a copy for its open handles (%s); they will "
                "read ESTALE",
                inode.path,
                root_cause(err),
            )
            return
        inode.staged.uploaded_version = inode.staged.version

    async def _delete_later(
        self, path: str, generation: int | None, object_name: str | None = None
    ) -> None:
        """Write-back: journal the delete of ``path``'s object (a file's, or ``object_name``:
        a directory's placeholder) and hide it; a background worker deletes it from GCS
        (`tierfs.core.deletes`). ``generation`` None: whatever generation is there."""
        assert self.journal is not None
        self.deletes.busy()  # the deletes wait for the `rm -rf` to pause: it is what waits
        self._delete_count += 1
        delete = Delete(
            f"{time.time_ns():020d}-{self._delete_count}",
            path,
            object_name if object_name is not None else self.names.file_object(path),
            generation,
        )
        try:
            await trio.to_thread.run_sync(self.journal.deletes.begin, delete)
        except OSError as err:  # a full journal disk: delete now, as without write-back
            log.debug("write-back journal: cannot record a delete (%s): deleting now", err)
            await delete_named(self.bucket, delete.object, delete.generation)
            return
        self.pending_deletes.add(delete)
        self.deletes.queue(self._delete_count, delete)

    async def _delete_in_background(self, delete: Delete) -> bool:
        """One queued delete; False: try again later (it stays hidden meanwhile)."""
        try:
            await delete_one(self.bucket, delete)
        except Exception as err:
            self.delete_errors += 1
            level = logging.WARNING if self.delete_errors == 1 else logging.DEBUG
            log.log(
                level, "write-back: delete of gs://%s failed, will retry: %s", delete.object, err
            )
            self.pending_deletes.failed(delete, str(root_cause(err)))
            return False
        try:
            await trio.to_thread.run_sync(self.journal.deletes.end, delete)  # type: ignore[union-attr]
        except OSError as err:  # the next mount deletes it again: NotFound, harmless
            log.warning("write-back journal: cannot drop a delete record: %s", err)
        self.pending_deletes.finished(delete)
        self.names.deleted(delete.path, is_dir=delete.object.endswith("/"))
        return True

    async def symlink(self, parent_ino: int, name: str, target: str) -> Inode:
        path = self._new_path(parent_ino, name)
        await self._settle(path)
        metadata = {SYMLINK_TARGET_KEY: target}
        body = b""
        if self.settings.standard_symlinks:
            metadata[SYMLINK_FLAG_KEY] = "true"
            body = target.encode("utf-8")
        metadata[MTIME_KEY] = format_mtime(self.clock_ns())
        try:
            info = await self.bucket.write_bytes(
                self.names.file_object(path), body, if_generation_match=0, metadata=metadata
            )
        except PreconditionFailed:
            self.names.forget(path)
            raise AlreadyExists(path) from None
        self.names.learned(path, Found(False, info))
        inode = self.inodes.make(
            Kind.SYMLINK,
            path,
            size=len(target.encode()),
            generation=info.generation,
            metageneration=info.metageneration,
            mtime_ns=parse_mtime(info.metadata, info.updated_s),
            target=target,
            metadata=dict(info.metadata),
        )
        self.inodes.remember(inode)
        self.owned.added(path)
        self._entries_changed(path)
        return inode

    def readlink(self, ino: int) -> str:
        inode = self._inode(ino)
        if inode.kind is not Kind.SYMLINK:
            raise Unsupported("not a symlink", errno.EINVAL)
        return inode.target
