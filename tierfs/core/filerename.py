"""A file's rename in the filesystem core; with write-back, one that never waits for GCS.

Without write-back a file in GCS is renamed as gcsfuse renames it: copied server-side
to its new name, then its generation deleted, before rename() returns.

With write-back rename() returns after local work only, whatever state the file is in.
DCP commits with ``.metadata.tmp`` -> ``.metadata``, and other savers rename single
files the same way; each GCS round trip there is time training waits.

- Its bytes are local and newer than GCS (made here and not uploaded, or changed since
  its upload), and no upload of it is under way: the rename is local. Its journal
  record names the new object, replacing the generation the new name holds (so nothing
  is deleted first), and an old object of the file is deleted in the background
  (`tierfs.core.deletes`), hidden meanwhile.
- Otherwise (in GCS and unchanged, or its upload under way): a *file move*. A record
  ``{"source", "destination", "file": true}`` in the journal's ``moves/`` is made
  durable; the mount shows the new name at once (the inode moves, and reads its old
  object, ``remote``, until the copy exists); a background task takes the file's lock
  (an upload under way ends first), uploads what was committed since to the old name,
  copies the object to the new name and deletes the generation it copied. A failed
  attempt is retried with backoff. The record goes last, so after kill -9 the next
  mount finishes the move (`tierfs.core.dirmove.recover_moves`, after the uploads:
  while a move is pending a file's uploads and journal records name its old object).

While a file move runs, a change to either name (an open for writing, unlink, rename,
truncate) waits for it, as for directory moves; lookups, listings and reads do not.

A mixin of `tierfs.core.filesystem.Filesystem`: it shares that class's state.
"""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

import trio

from tierfs.core.dirmove import Move, MoveWaits, Moving
from tierfs.core.inodes import Inode, Kind
from tierfs.core.namespace import Found
from tierfs.errors import IsADirectory, NotFound, PreconditionFailed

log = logging.getLogger("tierfs.fs")

if TYPE_CHECKING:  # a part of `Filesystem`: its state is the core's (typed loosely
    # until the parts take collaborators instead of sharing one object)
    from typing import Any as _Base
else:
    _Base = object


@dataclass(eq=False)
class FileMove:
    """One file rename whose object is moved in the background (see the module docstring)."""

    inode: Inode
    moving: Moving
    move: Move
    old_object: str
    new_object: str
    target: Inode | None  # the file it replaced: an upload of that one ends first
    replaces: int = 0  # the generation the new name held (the target's, once settled)
    copied: int = 0  # the generation of the old object that was copied (0: not yet)


class FileRenames(_Base):
    """rename() of a file (see the module docstring)."""

    async def _rename_file(self, source: Inode, target: Inode | None, new_path: str) -> None:
        if target is not None and target.kind is Kind.DIR:
            raise IsADirectory(new_path)
        if source.staged is not None and source.staged.clobbered:
            raise PreconditionFailed(source.path)
        if self.journal is None:
            async with self._lock(source):
                await self._rename_file_now(source, target, new_path)
            return
        try:
            source.lock.acquire_nowait()
        except trio.WouldBlock:  # an upload of it is under way: the move waits, not rename()
            await self._start_file_move(source, target, new_path)
            return
        try:
            staged = source.staged
            if source.local_only or (staged is not None and staged.dirty):
                # Never wait for the target's lock holding ours: a directory rename takes
                # its files' locks in inode order, and may hold the target's and wait for
                # ours. Taken, or the move is made in the background, as when ours is.
                if target is None:
                    await self._rename_file_locally(source, None, new_path)
                    return
                try:
                    target.lock.acquire_nowait()
                except trio.WouldBlock:
                    pass
                else:
                    try:
                        await self._rename_file_locally(source, target, new_path)
                    finally:
                        target.lock.release()
                    return
        finally:
            source.lock.release()
        await self._start_file_move(source, target, new_path)

    async def _rename_file_now(self, source: Inode, target: Inode | None, new_path: str) -> None:
        """Without write-back: upload what is staged, copy, delete (gcsfuse's rename)."""
        staged = source.staged
        if source.local_only:  # a new file still being written (its close uploads it)
            self._end_stream(source)  # its streaming upload named the old object
            # The target's object stays until the close replaces it, conditionally on its
            # generation: deleted here, the name held nothing in GCS until then, and a
            # writer that died (or a close whose upload failed) lost both files.
            replaces = 0
            if target is not None:
                replaces = target.generation
                self._unlink_target(target, new_path)
            self.names.forget(new_path)
            self.inodes.move(source, new_path)
            source.generation = replaces
            if source.staged is not None:
                source.staged.base_generation = replaces
            return
        if staged is not None and staged.dirty:
            await self._upload(source, self.names.file_object(source.path))
        try:
            info = await self.bucket.copy(
                self.names.file_object(source.path),
                self.names.file_object(new_path),
                source_generation=source.generation,
                if_generation_match=target.generation if target is not None else 0,
            )
        except NotFound:
            raise PreconditionFailed(source.path) from None
        try:
            await self.bucket.delete(
                self.names.file_object(source.path), if_generation_match=source.generation
            )
        except NotFound:
            pass
        except PreconditionFailed:
            # Another client wrote the old name since: theirs stays (as with write-back).
            # The rename itself is done, its copy made: no ESTALE for it.
            log.warning(
                "rename: gs://%s was written again by another client; left in place",
                self.names.file_object(source.path),
            )
        if target is not None:
            self._unlink_target(target, new_path)
        self._removed(source.path)
        self.names.learned(new_path, Found(False, info))
        self.inodes.move(source, new_path)
        copied, source.generation = source.generation, info.generation
        source.metageneration = info.metageneration
        self.backings.copied(source, copied)
        if source.staged is not None:
            source.staged.base_generation = info.generation

    def _unlink_target(self, target: Inode, path: str) -> None:
        """The file a rename replaces is gone from the mount; local state it had that no
        handle needs (a write-back record never uploaded) goes with it."""
        target.unlinked = True
        self.names.learned(path, None)
        self.inodes.detach(target)
        if not target.lock.locked():
            self._drop_unlinked(target)

    def _drop_unlinked(self, inode: Inode) -> None:
        if inode.open_handles == 0:  # (else its last release does)
            self._drop_staged(inode)
            self.inodes.release(inode)

    async def _rename_file_locally(
        self, source: Inode, target: Inode | None, new_path: str
    ) -> None:
        """Write-back, the file's bytes newer than GCS, its lock and the target's held: its
        upload goes to the new name, replacing what is there; an old object is a background
        delete."""
        old_path, old_generation = source.path, source.generation
        if old_generation:
            # The old object's delete is journaled below: the bytes it stood for must be
            # first (a file still open has changes no close committed yet).
            await self._commit_locked(source, durable=True)
        replaces = 0
        if target is not None:
            replaces = target.generation
            self._unlink_target(target, new_path)
            # Its record too (we hold its lock: no upload of it runs), or the next mount,
            # after a crash, uploads it and finds the renamed file in conflict.
            self._drop_unlinked(target)
        self._end_stream(source)  # its streaming upload named the old object
        self.names.forget(new_path)
        self.inodes.move(source, new_path)
        source.generation = replaces  # the object its upload replaces (0: none)
        if source.staged is not None:
            source.staged.base_generation = replaces
        await self._rename_records([source], durable=True)
        if old_generation:
            self._removed(old_path, below=False)
            await self._delete_later(old_path, old_generation)

    async def _start_file_move(self, source: Inode, target: Inode | None, new_path: str) -> None:
        """Journal the move, show the new name, and move the object in the background."""
        assert self.journal is not None
        old_path = source.path
        old_object = self.names.file_object(old_path)
        new_object = self.names.file_object(new_path)
        begin = functools.partial(self.journal.moves.begin, old_object, new_object, file=True)
        move = await trio.to_thread.run_sync(begin)
        if target is not None:
            self._unlink_target(target, new_path)
        self._removed(old_path, below=False)
        self.names.forget(new_path)
        self.inodes.move(source, new_path)
        source.remote = old_object
        moving = Moving(old_path, new_path, file=True)
        replaces = target.generation if target is not None else 0
        file_move = FileMove(source, moving, move, old_object, new_object, target, replaces)
        source.file_move = file_move
        self.pending_moves.add(moving)
        if self.background.running:
            self.background.spawn(self._finish_file_move, file_move)
        else:  # core tests without a nursery
            await self._finish_file_move(file_move)

    async def _finish_file_move(self, file_move: FileMove) -> None:
        """Move the object (retried until it works), then drop the record. Never raises."""
        await self._retrying(
            file_move.moving,
            file_move.old_object,
            file_move.new_object,
            lambda attempt: self._move_file(file_move),
        )
        inode = file_move.inode
        inode.file_move = None
        inode.remote = None
        await self._end_move(file_move.moving, file_move.move)
        self.inodes.release(inode)

    async def _move_file(self, file_move: FileMove) -> None:
        """One attempt: copy the object (once), then delete the generation copied."""
        target = file_move.target
        if target is not None:
            async with self._lock(target):  # an upload of it under way ends before the copy
                file_move.replaces = target.generation
                self._drop_unlinked(target)
            file_move.target = None
        if not file_move.copied:
            async with self._lock(file_move.inode):
                if not await self._copy_moved_file(file_move):
                    return
        try:
            await self.bucket.delete(file_move.old_object, if_generation_match=file_move.copied)
        except (NotFound, PreconditionFailed):
            pass  # gone, or replaced by another client: theirs stays

    async def _copy_moved_file(self, file_move: FileMove) -> bool:
        """Under the file's lock: put the file's latest bytes under the new name. False when
        no old object is left to delete."""
        inode = file_move.inode
        staged = inode.staged
        if inode.unlinked or (staged is not None and staged.clobbered):
            return False  # lost to another writer (ESTALE, its bytes kept), or dropped
        if staged is not None and staged.dirty:
            if inode.generation == 0:  # never uploaded after all: a local rename
                inode.remote = None
                inode.generation = staged.base_generation = file_move.replaces
                await self._rename_records([inode], durable=True)
                return False
            if inode.open_handles:
                raise MoveWaits("open with changes: the move waits for its last close")
            try:
                await self._sync_locked(inode)  # to the old name, which is then copied
            except PreconditionFailed:
                return False  # another client changed it: our bytes are kept aside
        generation = inode.generation
        try:
            # Over what the rename replaced, and nothing newer: another client's object
            # written at the new name since is theirs (the copy is made once: a retry of
            # the move after it has ``copied`` set and only deletes).
            copy = await self.bucket.copy(
                file_move.old_object,
                file_move.new_object,
                source_generation=generation,
                if_generation_match=file_move.replaces,
            )
        except NotFound:
            log.warning(
                "write-back: gs://%s was deleted by another client before its rename to %s",
                file_move.old_object,
                file_move.new_object,
            )
            return False
        except PreconditionFailed:
            log.error(
                "write-back: gs://%s was written by another client after this mount renamed "
                "gs://%s over it; theirs stays, and this file stays under its old name",
                file_move.new_object,
                file_move.old_object,
            )
            return False
        file_move.copied = generation
        self._moved_to(inode, copy)
        self.names.learned(inode.path, Found(False, copy))
        return True
