"""Renames in the filesystem core: rename() itself, a directory's, and background moves.

A file's rename is `tierfs.core.filerename`. A directory renamed without write-back
is copied and deleted object by object, up to ``rename-dir-limit`` (EMFILE beyond),
as gcsfuse does. With write-back, a directory rename is journaled, shown at once
under the new name, and carried out in the background (`tierfs.core.dirmove`):
lookups, reads and listings under either name see through it (`_resolve_moving`,
`_read_object`, `_list_moving`), and changes to the moving tree wait for it (`_settle`).

A mixin of `tierfs.core.filesystem.Filesystem`: it shares that class's state.
"""

from __future__ import annotations

import contextlib
import errno
import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

import trio

from tierfs.core.dirmove import (
    MAX_MOVE_RETRY_S,
    MAX_MOVE_WAIT_S,
    MOVE_RETRY_S,
    MOVE_WAIT_S,
    Move,
    MoveWaits,
    Moving,
    move_objects,
)
from tierfs.core.inodes import ROOT_INO, Inode, Kind
from tierfs.core.namespace import DirListing, check_new_name
from tierfs.errors import (
    AlreadyExists,
    NotADirectory,
    NotFound,
    TooManyObjects,
    Unsupported,
    root_cause,
)
from tierfs.storage import ObjectInfo

log = logging.getLogger("tierfs.fs")
RENAME_NOREPLACE = 1
RENAME_EXCHANGE = 2


if TYPE_CHECKING:  # a part of `Filesystem`: its state is the core's (typed loosely
    # until the parts take collaborators instead of sharing one object)
    from typing import Any as _Base
else:
    _Base = object


class Renames(_Base):
    """rename() and the background moves it starts (see the module docstring)."""

    async def _resolve_moving(self, path: str, source: str) -> Inode | None:
        """A new name of a directory rename still moving its objects: under the old name
        until its object is moved, then under the new one."""
        found = await self.names.lookup(source)
        if found is None:
            found = await self.names.lookup(path)
        current = self.inodes.current(path)
        if found is None or current is not None:
            return current
        if found.is_dir:
            return self.inodes.make(
                Kind.DIR, path, mtime_ns=self._dir_mtime(found.info), placeholder=found.placeholder
            )
        assert found.info is not None
        return self._still_moving(await self._file_inode(path, found.info), found.info)

    def _still_moving(self, inode: Inode, info: ObjectInfo) -> Inode:
        """``inode`` reads ``info``'s object, which may still be under its old name."""
        if info.name != self.names.file_object(inode.path) and inode.kind is not Kind.DIR:
            inode.remote = info.name
            self._remote_readers[info.name] = inode
        return inode

    def _read_object(self, inode: Inode) -> str:
        """The object a clean file's bytes are read from."""
        return inode.remote or self.names.file_object(inode.path)

    async def _list_moving(
        self, directory: Inode, entries: list[tuple[str, Inode]], old: DirListing | None
    ) -> list[tuple[str, Inode]]:
        """A listing while directory renames move objects: without the names they took
        away, with the new names (``old``: the listing under the old prefix, for objects
        not moved yet)."""
        moves = self.pending_moves
        entries = [(name, inode) for name, inode in entries if not moves.hides(inode.path)]
        seen = {name for name, _ in entries}
        if old is not None:
            for part in old.dirs:
                path = self.names.child_path(directory.path, part)
                inode = self.inodes.current(path)
                if part not in seen and (inode is None or inode.kind is Kind.DIR):
                    inode = inode or self.inodes.make(
                        Kind.DIR, path, mtime_ns=self.inodes[ROOT_INO].mtime_ns
                    )
                    entries.append((part, inode))
                    seen.add(part)
            for entry_name, info in old.files:
                if entry_name not in seen:
                    path = self.names.child_path(directory.path, entry_name)
                    inode = self._still_moving(await self._file_inode(path, info), info)
                    entries.append((entry_name, inode))
                    seen.add(entry_name)
        for destination in moves.destinations_in(directory.path):
            inode = self.inodes.current(destination)
            if inode is None:  # let go of (the kernel forgot it): the rename made it all the same
                inode = self.inodes.make(
                    Kind.DIR, destination, mtime_ns=self.inodes[ROOT_INO].mtime_ns, placeholder=True
                )
            if inode.name not in seen:
                entries.append((inode.name, inode))
                seen.add(inode.name)
        return entries

    async def rename(
        self, old_parent: int, old_name: str, new_parent: int, new_name: str, flags: int = 0
    ) -> None:
        self._writable()
        self.uploads.busy()  # a rename is part of a save: files it moves had better wait
        if flags & RENAME_EXCHANGE:
            raise Unsupported("RENAME_EXCHANGE", errno.EINVAL)
        check_new_name(new_name)
        old_path = self.names.child_path(self._dir(old_parent).path, old_name)
        new_path = self.names.child_path(self._dir(new_parent).path, new_name)
        if old_path == new_path:
            return
        await self._settle(old_path, new_path)
        source = await self._resolve(old_path)
        if source is None:
            raise NotFound(old_path)
        if new_path.startswith(old_path + "/"):
            raise Unsupported("cannot move a directory into itself", errno.EINVAL)
        target = await self._resolve(new_path)
        if target is not None and flags & RENAME_NOREPLACE:
            raise AlreadyExists(new_path)
        if source.kind is Kind.DIR:
            await self._rename_dir(source, target, new_path)
        else:
            await self._rename_file(source, target, new_path)
        self.owned.moved(old_path, new_path, is_dir=source.kind is Kind.DIR)
        self._entries_changed(old_path, new_path)

    async def _rename_dir(self, source: Inode, target: Inode | None, new_path: str) -> None:
        if target is not None:
            if target.kind is not Kind.DIR:
                raise NotADirectory(new_path)
            if self.journal is None:  # a rename refused for its size leaves the target be
                self._within_rename_limit(source, await self.names.list_below(source.path))
            await self.rmdir_path(target, now=True)
        async with contextlib.AsyncExitStack() as held:
            # Files never uploaded move with the directory as local state (their uploads
            # go to the new names); holding their locks keeps a background upload from
            # starting under the old name meanwhile. Others are uploaded, then copied.
            local: list[Inode] = []
            if source.staged is not None:  # its own placeholder is still a journal record
                await _hold(held, source.lock)
                if source.local_only:
                    local.append(source)
            for inode in sorted(self.inodes.below(source.path), key=lambda i: i.ino):
                if inode.staged is None or inode.unlinked:
                    continue
                await _hold(held, inode.lock)
                if inode.staged is None or inode.unlinked:
                    continue  # uploaded and let go while we waited for its lock
                if inode.local_only:
                    self._end_stream(inode)  # its upload named the old path
                    local.append(inode)
                elif inode.staged.dirty:
                    await self._sync_locked(inode)
            moves = self.journal.moves if self.journal is not None else None
            move = None
            if moves is not None:  # journaled: a crash from here on is finished at remount
                move = await trio.to_thread.run_sync(
                    moves.begin, self.names.dir_object(source.path), self.names.dir_object(new_path)
                )
            if moves is None or move is None:
                await self._rename_dir_objects(source, new_path)
                return
            _, finish = self._move_locally(source, new_path)
            await self._rename_records(local, durable=False)
        # The locks are let go: the objects are moved in the background (or here, in core
        # tests without a nursery).
        if not self.background.running:
            await finish(move)
        else:
            self.background.spawn(finish, move)

    def _move_locally(
        self, source: Inode, new_path: str
    ) -> tuple[Moving, Callable[[Move], Awaitable[None]]]:
        """The mount's side of a background directory rename: the tree has its new names
        at once; files already in GCS read their old objects until they are moved. Returns
        the move and the task that moves the objects."""
        old_path = source.path
        old_prefix = self.names.dir_object(old_path)
        new_prefix = self.names.dir_object(new_path)
        placeholder_coming = source.local_only  # its journal record moves with it
        remote = {
            inode.ino: self._read_object(inode)
            for inode in self.inodes.below(old_path)
            if inode.kind is not Kind.DIR and inode.generation and not inode.unlinked
        }
        self._removed(old_path, is_dir=True)
        self.names.forget(new_path, below=True)
        self.inodes.move(source, new_path)
        source.placeholder = True
        for inode in self.inodes.below(new_path):
            if inode.ino in remote:
                inode.remote = remote[inode.ino]
                self._remote_readers[inode.remote] = inode
        moving = Moving(old_path, new_path)
        self.pending_moves.add(moving)

        async def finish(move: Move) -> None:
            await self._finish_move(moving, move, old_prefix, new_prefix, placeholder_coming)

        return moving, finish

    def _object_moved(self, source: ObjectInfo, copy: ObjectInfo) -> None:
        """One object of a background rename is under its new name (its old one is deleted
        next): the inode reading it reads the copy from now on, if the copy is of the
        generation it stands for (another client's, written under the old name since, is
        not: its reads find theirs gone, ESTALE)."""
        inode = self._remote_readers.pop(source.name, None)
        if inode is not None:
            self._moved_to(inode, copy if source.generation == inode.generation else None)

    def _moved_to(self, inode: Inode, copy: ObjectInfo | None) -> None:
        if inode.remote is None:
            return
        inode.remote = None
        if copy is not None:  # the object under its new name is a new generation
            copied, inode.generation = inode.generation, copy.generation
            inode.metageneration = copy.metageneration
            self.backings.copied(inode, copied)
            if inode.staged is not None:
                inode.staged.base_generation = copy.generation

    async def _finish_move(
        self, moving: Moving, move: Move, old_prefix: str, new_prefix: str, placeholder: bool
    ) -> None:
        """Move the objects of a renamed directory (retried until it works: the journal
        record stays until then, and a next mount would finish it), then let the mount
        forget the old names. Never raises: a background task."""
        copies: dict[str, ObjectInfo] = {}

        listed: dict[str, int] | None = None

        async def attempt(number: int) -> None:
            nonlocal copies, listed
            listing = await self.bucket.list(old_prefix, delimiter=None)
            if listed is None:  # what the move is: a replay at the next mount moves it alone
                listed = {info.name: info.generation for info in listing.objects}
                assert self.journal is not None
                try:
                    await trio.to_thread.run_sync(self.journal.moves.listed, move, listed)
                except OSError as err:  # (a replay then judges by time: `Move.covers`)
                    log.warning("write-back: could not record what a rename moves: %s", err)
            if not placeholder and not any(o.name == old_prefix for o in listing.objects):
                # An implicit directory: give the new one a placeholder either way.
                await self.bucket.write_bytes(new_prefix, b"", if_generation_match=None)
            copies = await move_objects(
                self.bucket,
                # (not another client's written under the old name since: as a replay)
                [info for info in listing.objects if move.covers(info, listed)],
                old_prefix,
                new_prefix,
                skip_existing=number > 0,
                on_moved=self._object_moved,
            )

        await self._retrying(moving, old_prefix, new_prefix, attempt)
        for inode in self.inodes.below(moving.destination):
            if inode.remote is not None:  # its object vanished meanwhile: reads say ESTALE
                self._moved_to(inode, copies.get(self.names.file_object(inode.path)))
        for name in [n for n in self._remote_readers if n.startswith(old_prefix)]:
            del self._remote_readers[name]
        await self._end_move(moving, move)

    async def _retrying(
        self,
        moving: Moving,
        source: str,
        destination: str,
        attempt: Callable[[int], Awaitable[None]],
    ) -> None:
        """Run ``attempt(number)`` of a background move until it succeeds, backing off
        between failures (said in the log and to `Moving.wait`). Never raises."""
        delay = MOVE_RETRY_S
        number = 0
        waited_s = MOVE_WAIT_S
        while True:
            try:
                await attempt(number)
                return
            except MoveWaits:  # not a failure: it waits for something local (a close)
                await trio.sleep(waited_s)
                waited_s = min(waited_s * 2, MAX_MOVE_WAIT_S)
            except Exception as err:  # exception groups included: nothing ends the daemon
                number += 1
                self.writeback_counts["move_errors"] += 1
                moving.tried(str(root_cause(err)))
                log.error(
                    "write-back: renaming gs://%s to %s failed, will retry in %.0f s: %s",
                    source,
                    destination,
                    delay,
                    root_cause(err),
                )
                await trio.sleep(delay)
                delay = min(delay * 2, MAX_MOVE_RETRY_S)

    async def _end_move(self, moving: Moving, move: Move) -> None:
        """A background move is done: drop its record, and let the mount forget both names
        (the next lookups ask GCS, which now has the new ones)."""
        assert self.journal is not None
        try:
            await trio.to_thread.run_sync(self.journal.moves.end, move)
        except OSError as err:  # replayed at the next mount: finds nothing left to move
            log.warning("write-back: could not drop the record of a finished rename: %s", err)
        self.names.forget(moving.source, below=True)
        self.names.forget(moving.destination, below=True)
        self.pending_moves.remove(moving)
        moving.tried(None)

    async def _rename_records(self, inodes: list[Inode], *, durable: bool) -> None:
        """Point the journal records of moved write-back files at their new names, in one
        thread. A file's own rename is ``durable`` (nothing else would redo it after a
        machine crash); a directory's is not: a record that a crash takes back to its old
        name is moved by the directory's journaled rename, which the next mount finishes
        after the uploads, and an fsync per file made renaming an Orbax step take seconds."""
        journal = self.journal
        if journal is None:
            return
        records = [
            self._record(inode)
            for inode in inodes
            if inode.staged is not None and inode.staged.committed
        ]

        def rewrite() -> None:
            for record in records:
                journal.write_record(record, durable=durable)

        if records:
            await trio.to_thread.run_sync(rewrite)

    def _within_rename_limit(self, source: Inode, objects: tuple[ObjectInfo, ...]) -> None:
        """Without write-back, gcsfuse's ``rename-dir-limit``: EMFILE past it."""
        old_prefix = self.names.dir_object(source.path)
        descendants = [o for o in objects if o.name != old_prefix]
        if len(descendants) > self.settings.rename_dir_limit:
            raise TooManyObjects(
                f"{source.path}: {len(descendants)} objects > rename-dir-limit "
                f"{self.settings.rename_dir_limit}"
            )

    async def _rename_dir_objects(self, source: Inode, new_path: str) -> None:
        old_prefix = self.names.dir_object(source.path)
        new_prefix = self.names.dir_object(new_path)
        objects = await self.names.list_below(source.path)
        if self.journal is None:
            self._within_rename_limit(source, objects)
        if not source.local_only and not any(o.name == old_prefix for o in objects):
            # An implicit directory: give the new one a placeholder so it exists either way.
            # (A directory made here has one coming: its journal record moves with it.)
            await self.bucket.write_bytes(new_prefix, b"", if_generation_match=None)
        copies = await move_objects(self.bucket, objects, old_prefix, new_prefix)
        self._removed(source.path, is_dir=True)
        self.names.forget(new_path, below=True)
        self.inodes.move(source, new_path)
        source.placeholder = True
        for inode in self.inodes.below(new_path):
            copy = copies.get(self.names.file_object(inode.path))
            if copy is not None and inode.kind is not Kind.DIR:
                # The object under its new name is a new generation: writes continue from it.
                inode.generation = copy.generation
                inode.metageneration = copy.metageneration
                if inode.staged is not None:
                    inode.staged.base_generation = copy.generation

    async def rmdir_path(self, inode: Inode, *, now: bool = False) -> None:
        parent = self.inodes.current(inode.parent_path)
        if parent is None:
            raise NotFound(inode.parent_path)
        await self.rmdir(parent.ino, inode.name, now=now)


async def _hold(held: contextlib.AsyncExitStack, lock: trio.Lock) -> None:
    """Take ``lock`` until ``held`` closes. A free lock is taken without a checkpoint: a
    rename holding the locks of thousands of files would otherwise let the uploader start
    on the ones it has not reached yet, which it would then have to copy."""
    try:
        lock.acquire_nowait()
    except trio.WouldBlock:
        await lock.acquire()
    held.callback(lock.release)
