"""Directories in the filesystem core: listings, mkdir and rmdir.

Listings merge what GCS lists with what this mount made and has not uploaded,
and may be kept by the kernel (``kernel-list-cache-ttl-secs``). With write-back,
mkdir is local (`tierfs.core.owned`: the placeholder goes up with the files) and
names under a directory made here are answered without GCS.

A mixin of `tierfs.core.filesystem.Filesystem`: it shares that class's state.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from tierfs.core.deletes import delete_named
from tierfs.core.handles import DirHandle
from tierfs.core.inodes import Inode, Kind
from tierfs.core.namespace import DirListing, Found
from tierfs.core.prefill import MAX_ENTRIES as PREFILL_MAX_ENTRIES
from tierfs.core.writer import Staged, parse_mtime
from tierfs.errors import AlreadyExists, NotADirectory, NotEmpty, PreconditionFailed

if TYPE_CHECKING:  # a part of `Filesystem`: its state is the core's (typed loosely
    # until the parts take collaborators instead of sharing one object)
    from typing import Any as _Base
else:
    _Base = object

log = logging.getLogger("tierfs.fs")


class Directories(_Base):
    """opendir/readdir/releasedir, mkdir and rmdir."""

    def opendir(self, ino: int, *, prefill: bool = False) -> int:
        """A handle for listing ``ino``; ``prefill``: the daemon's own read through the mount
        (`tierfs.core.prefill`), which lists nothing ahead and is no walker's."""
        inode = self._dir(ino)
        if not prefill:
            self.dir_counts["opens"] += 1
        return self.dirs.add(DirHandle(self.dirs.next_number(), inode, prefill=prefill)).fh

    def kernel_may_keep_listing(self, fh: int) -> bool:
        """Whether the kernel may keep the listing it cached of this handle's directory
        (``kernel-list-cache-ttl-secs``): only while the listing it was last given is still
        the one kept here, that is within the TTL and with no change made through this
        mount since. Otherwise the kernel drops its copy and asks again."""
        listings = self.names.listings
        inode = self.dirs[fh].inode
        given = self._listed.get(inode.path)
        keep = (
            listings is not None
            and given is not None
            and listings.get(inode.path) is given[0]
            and self.inodes.by_path.get(inode.path) is inode
            and not self.pending_moves
        )
        if keep:
            self.dir_counts["kept"] += 1
        return keep

    async def readdir(self, fh: int, start: int) -> list[tuple[str, Inode, int]]:
        """Entries from offset ``start``: (name, inode, next offset)."""
        handle = self.dirs[fh]
        if handle.entries is None or start == 0:
            if not handle.prefill:
                self.dir_counts["listings_served"] += 1
            handle.entries = await self._list(handle.inode, prefill=handle.prefill)
        return [
            (name, inode, index)
            for index, (name, inode) in enumerate(handle.entries[start:], start + 1)
        ]

    def releasedir(self, fh: int) -> None:
        self.dirs.pop(fh)

    def _local_children(self, dir_path: str) -> list[Inode]:
        """Children not (wholly) in GCS yet: staged, made here and not uploaded, or renamed
        here with their objects still under the old names."""
        return [
            inode
            for inode in self.inodes.children(dir_path)
            if inode.staged is not None or inode.local_only or inode.file_move is not None
        ]

    async def _list(self, directory: Inode, *, prefill: bool = False) -> list[tuple[str, Inode]]:
        """The entries of a directory: GCS's listing merged with what this mount knows. With
        write-back, a directory not made here is remembered with the names listed, for the
        metadata TTL from when the listing was sent (`OwnedDirs.listed`), so that the rmdir
        `rm -rf` makes after removing them needs no listing of its own."""
        count = self.owned.watch(directory.path)
        try:
            entries, sent_s = await self._list_entries(directory, prefill)
        finally:
            unchanged = self.owned.unwatch(directory.path, count)
        ttl_s = self.settings.metadata_ttl_s
        if unchanged and self.journal is not None and ttl_s != 0 and sent_s is not None:
            until_s = sent_s + ttl_s if ttl_s > 0 else float("inf")
            self.owned.listed(directory.path, (name for name, _ in entries), until_s)
        return entries

    async def _list_entries(
        self, directory: Inode, prefill: bool = False
    ) -> tuple[list[tuple[str, Inode]], float | None]:
        """`_list`'s entries, and when their listing was sent (None: while renames move
        objects, a listing is not one directory's whole answer). A ``prefill`` lists
        nothing ahead (its directory's subdirectories were listed with it already) and
        answers nothing for a directory of more than `PREFILL_MAX_ENTRIES` entries."""
        walker = not prefill and not self.pending_moves
        # What is local, or being deleted, before GCS is asked: an upload or a delete that
        # ends while the listing is on its way is not in the answer (it was sent before),
        # so the state from before the request counts too. (Measured: a listing stalled 3 s
        # on a faulty link lost a directory whose placeholder went up meanwhile.)
        local_before = self._local_children(directory.path)
        # GCS's answer about those is older than what this mount knows: they are listed
        # from local state below (an answer naming the generation an upload that ended
        # meanwhile replaced made the inode that one again: ESTALE, or a tier's old bytes).
        paths_before = {inode.path for inode in local_before}
        hidden_before = self.pending_deletes.hidden_in(directory.path)
        source = self.pending_moves.source_of(directory.path) if self.pending_moves else None
        old = None
        if source is not None:
            # The old prefix first: an object moved between the two listings is in both,
            # never in neither (it is copied before it is deleted).
            old = await self.names.list_dir(source, fresh=True)
        listing = None
        if old is None and not self.names.kept(directory.path):
            if walker:
                self._list_ahead_of_walker(directory)
            listing = await self._listed_ahead(directory.path)
            if listing is not None:
                self.names.keep(directory.path, listing)
        if listing is None and prefill and old is None and not self.names.kept(directory.path):
            # No listing made ahead answers it (the prefetch's was cut at a page, or is
            # stale): one of its own, as an ls would make, but of at most MAX_ENTRIES.
            listing = await self.names.prefetch(directory.path, PREFILL_MAX_ENTRIES)
            if not listing.complete:
                return [], None  # too large to teach the kernel whole: nothing
        if listing is None:
            if prefill and old is not None:
                return [], None  # (a rename is moving it: no time to teach the kernel)
            listing = await self.names.list_dir(directory.path, fresh=old is not None)
        if walker:  # (a walker's next readdirs)
            self._walks.listed(directory.path, listing.dirs)
            if listing.dirs:
                self._list_ahead(directory.path, listing.dirs)
        entries = self._reuse_listed(directory.path, listing)
        if entries is None:
            entries, skipped = [], False
            for part in listing.dirs:
                path = self.names.child_path(directory.path, part)
                if path in paths_before or path in hidden_before or self._removed_here(path):
                    # (Made again as an inode, a directory removed here would stand for its
                    # path after its delete: a mkdir of that name then said EEXIST.)
                    skipped = True
                    continue
                inode = self.inodes.current(path)
                placeholder = listing.placeholders.get(part)
                if inode is None or inode.kind is not Kind.DIR:
                    inode = self.inodes.make(
                        Kind.DIR,
                        path,
                        mtime_ns=self._dir_mtime(placeholder),
                        placeholder=placeholder is not None,
                    )
                elif placeholder is not None:
                    inode.placeholder = True  # (the kernel may keep the name: `_confirmed`)
                entries.append((part, inode))
            for entry_name, info in listing.files:
                path = self.names.child_path(directory.path, entry_name)
                if path in paths_before:
                    skipped = True
                    continue
                entries.append((entry_name, await self._file_inode(path, info)))
            if self.names.listings is not None and not self.pending_moves and not skipped:
                # (Not with names left out: reused once they are no longer local, it would
                # lack them.)
                paths = [inode.path for _, inode in entries]  # (else a new object each time)
                self._listed[directory.path] = (listing, entries, paths)
        if self.pending_moves:
            entries = await self._list_moving(directory, entries, old)
        if self.pending_deletes or hidden_before:  # removed here, maybe still in GCS
            hides = self.pending_deletes.hides
            entries = [
                e for e in entries if not hides(e[1].path) and e[1].path not in hidden_before
            ]
        local = self._local_children(directory.path)
        current, now_local = self.inodes.current, {id(inode) for inode in local}
        for inode in local_before:  # uploaded while the listing was on its way
            if inode.unlinked or id(inode) in now_local or inode.parent_path != directory.path:
                continue  # removed, still local (counted), or moved elsewhere
            now = current(inode.path)
            if now is None:
                # Let go of as its upload ended (the kernel had forgotten it): still there,
                # and this listing is all that can say so.
                self.inodes.restore(inode)
                now = inode
            if id(now) not in now_local:  # (or the inode its path has now)
                now_local.add(id(now))
                local.append(now)
        sent_s = None if self.pending_moves or old is not None else listing.sent_s
        if not local:
            return entries, sent_s
        seen = {name for name, _ in entries}
        return entries + [(inode.name, inode) for inode in local if inode.name not in seen], sent_s

    def _removed_here(self, path: str) -> bool:
        """A name this mount removed or renamed away whose objects GCS still has."""
        return self.pending_deletes.hides(path) or (
            bool(self.pending_moves) and self.pending_moves.hides(path)
        )

    def _reuse_listed(self, dir_path: str, listing: DirListing) -> list[tuple[str, Inode]] | None:
        """The entries built from this very listing last time, if each is still the current
        inode of its path. A kept listing (``kernel-list-cache-ttl-secs``) is the same object
        at every ``ls``; rebuilding its inodes was half of a warm ``ls -lR``'s daemon time."""
        kept = self._listed.get(dir_path)
        if kept is None or kept[0] is not listing:
            return None
        current = self.inodes.by_path.get
        for (_, inode), path in zip(kept[1], kept[2], strict=True):
            # Still this path's inode, and still at this path (not renamed meanwhile).
            if current(path) is not inode or inode.path != path:
                return None
        return kept[1]

    async def mkdir(self, parent_ino: int, name: str) -> Inode:
        path = self._new_path(parent_ino, name)
        placeholder = self.names.new_dir_object(path)
        await self._settle(path)
        if self.journal is not None:
            return await self._mkdir_local(path)
        try:
            info = await self.bucket.write_bytes(placeholder, b"", if_generation_match=0)
        except PreconditionFailed:
            self.names.forget(path)
            raise AlreadyExists(path) from None
        self.names.learned(path, Found(True, info, placeholder=True))
        inode = self.inodes.make(
            Kind.DIR, path, mtime_ns=parse_mtime(info.metadata, info.updated_s), placeholder=True
        )
        self.inodes.remember(inode)
        self.owned.added(path)
        self._entries_changed(path)
        return inode

    async def _mkdir_local(self, path: str) -> Inode:
        """mkdir with write-back: no GCS request. The kernel has just looked the name up;
        the placeholder object is a journal record of an empty file, uploaded with the
        files (and moved with the directory if it is renamed first)."""
        self.uploads.busy()
        current = self.inodes.current(path)
        if current is not None and not current.unlinked:
            raise AlreadyExists(path)
        inode = self.inodes.make(Kind.DIR, path, mtime_ns=self.clock_ns(), placeholder=True)
        with self._staging():
            inode.staged = Staged.new(self.settings.temp_dir, journal=self.journal)
        self.names.forget(path)  # a negative entry, and the parent's kept listing
        self.owned.made(path)
        self._entries_changed(path)
        self.inodes.remember(inode)
        await self._commit(inode)
        self._queue_if_closed(inode)
        return inode

    async def rmdir(self, parent_ino: int, name: str, *, now: bool = False) -> None:
        """rmdir. With write-back it asks GCS nothing when the mount knows the directory is
        empty (made here, or listed here within the metadata TTL and emptied since: the
        listing ``rm -rf`` has just made) and its placeholder's delete is journaled and run
        in the background, as a file's unlink is (`tierfs.core.deletes`). ``now``: deleted
        before this returns, write-back or not (a directory a rename replaces: a delete
        still pending under the name hid the directory moved there, and one that named no
        generation deleted its new placeholder)."""
        # (Not for the deletes below it: `rm -rf` removes a directory right after its files.)
        path = self.names.child_path(self._dir(parent_ino).path, name)
        await self._settle(path, deletes=False)
        self._writable()
        inode = self._known_dir(path)
        if inode is None:
            path, inode = await self._existing(parent_ino, name)
        if inode.kind is not Kind.DIR:
            raise NotADirectory(path)
        if any(child.local_only for child in self.inodes.below(path)):
            raise NotEmpty(path)
        placeholder = self.names.dir_object(path)
        owned = self.owned.children(path)
        if owned is not None:  # made here: its own table says whether it is empty
            if owned:
                raise NotEmpty(path)
        elif not self._known_empty(path):
            # Objects whose deletes are still running do not count: ask for enough to see
            # past them. (Taken before the listing: one may finish while it runs.)
            deleting = {d.object for d in self.pending_deletes.below(path)}
            listing = await self.bucket.list(
                placeholder, delimiter=None, max_results=2 + len(deleting)
            )
            if any(
                info.name != placeholder and info.name not in deleting for info in listing.objects
            ):
                raise NotEmpty(path)
        async with self._lock(inode):  # (its placeholder may be uploading)
            # Made here, its placeholder is not in GCS only while it is still a journal
            # record. (Not `inode.generation`: an inode made again after the kernel forgot
            # the first, by a lookup or a listing, knows none, yet the placeholder is there.)
            in_gcs = owned is None or not inode.local_only
            log.debug(
                "rmdir %s: placeholder %s (generation %d, %s)",
                path,
                "in GCS" if in_gcs else "a journal record only",
                inode.generation,
                "made here" if owned is not None else "not made here",
            )
            self._drop_staged(inode)
            if in_gcs and self.journal is not None and not now:
                await self._delete_later(path, self._placeholder_generation(inode), placeholder)
            elif in_gcs:
                # (an implicit directory has no placeholder: nothing to delete)
                await delete_named(self.bucket, placeholder, self._placeholder_generation(inode))
        self._removed(path, is_dir=True)
        self.owned.removed(path, is_dir=True)
        self._entries_changed(path)
        self.pending_deletes.dir_removed(path)
        self._emptied.pop(path, None)
        inode.unlinked = True  # (as a file's unlink: a listing under way must not show it)
        self.inodes.detach(inode)

    def _known_dir(self, path: str) -> Inode | None:
        """With write-back, the directory inode this mount holds for ``path``, if it holds
        one, that nothing removed or renamed: the kernel has just named it, and asking GCS
        again (a lookup of an implied directory is three requests) would only find what a
        directory another client removed meanwhile changes nothing to (its delete finds
        nothing)."""
        if self.journal is None:
            return None
        inode = self.inodes.current(path)
        if inode is None or inode.kind is not Kind.DIR or inode.unlinked:
            return None
        if self.pending_deletes.hides(path) or self.pending_moves.hides(path):
            return None
        if self.pending_moves.source_of(path) is not None:
            return None  # a new name of a move under way: resolved as usual
        return inode

    def _known_empty(self, path: str) -> bool:
        """With write-back: a directory not made here that this mount listed within the
        metadata TTL and has removed every name of since, with no inode below it either
        (a name the kernel looked up after the listing: another client's new object)."""
        if self.journal is None:
            return False
        listed = self.owned.listed_children(path, self._monotonic_s())
        return listed is not None and not listed and not self.inodes.children(path)

    def _placeholder_generation(self, inode: Inode) -> int | None:
        """The generation of a directory's placeholder, where the mount knows it (its
        upload, or the lookup the kernel made before the rmdir); None deletes whatever is
        there (an implicit directory has nothing: the background delete finds nothing)."""
        if inode.generation:
            return int(inode.generation)
        found = self.metadata.get(inode.path)
        if isinstance(found, Found) and found.placeholder and found.info is not None:
            return found.info.generation
        return None
