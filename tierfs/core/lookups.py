"""Lookups: a path to an inode, through the metadata cache and GCS.

``lookup`` and what answers it: the metadata prefetch of a directory on its first
lookup, ``_resolve`` (inode table, then `Namespace`), and the inode of a file found in
GCS. A part of `tierfs.core.filesystem.Filesystem`, sharing its state.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import trio

from tierfs.core.inodes import ROOT_INO, Inode, Kind
from tierfs.core.namespace import MISSING, DirListing, Found, is_symlink
from tierfs.core.writer import parse_mtime
from tierfs.errors import (
    NotFound,
)
from tierfs.storage import ObjectInfo

if TYPE_CHECKING:  # a part of `Filesystem`: its state is the core's (typed loosely
    # until the parts take collaborators instead of sharing one object)
    from typing import Any as _Base
else:
    _Base = object

log = logging.getLogger("tierfs.fs")
PREFETCH_CHILDREN = 128  # subdirectories listed ahead when their parent is listed
CHILD_ENTRIES = 1000  # of each: one page of a GCS listing
# How long after a directory's metadata prefetch was sent its lookups still wait for it
# (and, at most, for it to be sent: it waits for a slot, urged). A prefetch of the
# default 5,000 entries is 5 pages; one of every entry
# (``metadata-prefetch-entries-limit=-1``) of a directory of a million names is a
# thousand, and the first stat there waited for all of them, where gcsfuse's prefetch
# never holds a lookup. Past this, lookups ask GCS themselves (a stat or two each) while
# the listing goes on for their siblings.
LISTING_WAIT_S = 1.0


@dataclass
class ListingUnderWay:
    """A directory's metadata prefetch under way (`Lookups._prefetch_listing`): queued for
    a slot until ``sent`` is set, with when (``began``, trio's clock), then listing."""

    sent: trio.Event = field(default_factory=trio.Event)
    done: trio.Event = field(default_factory=trio.Event)
    began: float = math.inf

    def send(self) -> None:
        self.began = trio.current_time()
        self.sent.set()

    async def wait(self) -> None:
        """Until the listing is done, or `LISTING_WAIT_S` after it was sent (counted from
        the slot, not the queue: list-ahead queues 128 listings for 10 slots, and a stat
        then found its listing past the bound before it was even sent), waiting at most
        as long for it to be sent."""
        with trio.move_on_after(LISTING_WAIT_S):
            await self.sent.wait()
        if not self.sent.is_set():
            return
        with trio.move_on_at(self.began + LISTING_WAIT_S):
            await self.done.wait()


def _newer_here(current: Inode | None) -> bool:
    """Whether this mount's own state of an inode is newer than anything GCS can say:
    made here and not yet uploaded, or being written (staged)."""
    return current is not None and (current.local_only or current.staged is not None)


class Lookups(_Base):
    """Lookups: a path to an inode, through the metadata cache and GCS."""

    async def lookup(self, parent_ino: int, name: str) -> Inode:
        """The inode of ``name`` in a directory; the caller hands it to the kernel (+1 lookup)."""
        parent = self._dir(parent_ino)
        path = self.names.child_path(parent.path, name)
        if not self.owned.owns(parent.path):  # (an owned one holds only what we made)
            self._prefetch_listing(parent.path)
        listing = self._listing_in_flight.get(parent.path)
        if listing is not None and self.inodes.current(path) is None:
            self._prefetch_slots.urge(parent.path)  # (before the listings bet on: `Slots`)
            # One listing answers this and its siblings, with no requests of their own; a
            # long one only for `LISTING_WAIT_S`.
            await listing.wait()
        inode = await self._resolve(path)
        if inode is None:
            raise NotFound(path)
        self.inodes.remember(inode)
        self.prefill.found(parent.path)
        return inode

    def _prefetch_listing(
        self, dir_path: str, *, children: bool = True, again: bool = False
    ) -> None:
        """gcsfuse's metadata prefetch: the first lookup in a directory lists it in the
        background, so the stats of its siblings (``ls -l``, a data loader opening every
        file) come from the metadata cache instead of one or two requests each.

        With ``children``, the subdirectories that listing names are listed too (up to
        `PREFETCH_CHILDREN`, one level: theirs are listed when a lookup reaches them), so a
        walk or a stat storm over an unknown tree finds each directory's listing under way
        or done, instead of waiting for one listing after another: a cold stat of 10,000
        files in 100 directories went from one listing wait per directory to a few.

        With ``again``, even a directory prefetched within the metadata TTL is listed, as
        far as a prefetch lists: a warm walker's readdir will take it
        (`_list_ahead_of_walker`)."""
        s = self.settings
        if not self.background.running or not s.metadata_prefetch or s.metadata_ttl_s <= 0:
            return
        if dir_path in self._listing_in_flight:
            return
        now = self._monotonic_s()
        last = self._prefetched_dirs.get(dir_path)
        if last is not None and now - last < s.metadata_ttl_s and not again:
            return
        if len(self._prefetched_dirs) > 100_000:
            self._prefetched_dirs.clear()
        self._prefetched_dirs[dir_path] = now
        self._listing_in_flight[dir_path] = ListingUnderWay()
        self.background.spawn(self._list_in_background, dir_path, children, again)

    async def _list_in_background(self, dir_path: str, children: bool, walked: bool) -> None:
        subdirs: tuple[str, ...] = ()
        try:
            async with self._prefetch_slots.slot(dir_path):
                self._listing_in_flight[dir_path].send()
                entries = self.settings.metadata_prefetch_entries
                if not children and not walked:  # maybe never walked: one page at most
                    entries = min(entries, CHILD_ENTRIES) if entries >= 0 else CHILD_ENTRIES
                changes = self.names.changes  # (before it is sent: see `ListedAhead`)
                listing = await self.names.prefetch(dir_path, entries)
                self._ahead.put(dir_path, listing, changes)
                self.prefill.listed(dir_path, listing)
                subdirs = listing.dirs
        except Exception as err:  # a failed prefetch only means lookups ask GCS themselves
            log.debug("metadata prefetch of %r failed: %s", dir_path, err)
        finally:
            self._listing_in_flight.pop(dir_path).done.set()
        if children:
            self._list_ahead(dir_path, subdirs)

    def _list_ahead(self, dir_path: str, subdirs: tuple[str, ...]) -> None:
        """List the subdirectories a listing named, in the background (up to
        `PREFETCH_CHILDREN`): a walker's readdir of each then finds its listing waiting
        (`tierfs.core.listahead`), and a stat storm its names in the metadata cache."""
        for part in subdirs[:PREFETCH_CHILDREN]:
            child = self.names.child_path(dir_path, part)
            if not self.owned.owns(child):
                self._prefetch_listing(child, children=False)

    def _list_ahead_of_walker(self, directory: Inode) -> None:
        """A readdir of ``directory`` begins: if it is a walker's, going through its
        parent's subdirectories (`tierfs.core.listahead.Walks`), list the next siblings
        ahead, those with no listing here or on its way already."""
        if directory.path == "":
            return
        now = self._monotonic_s()
        parent = directory.parent_path
        for part in self._walks.entering(parent, directory.name, now):
            child = self.names.child_path(parent, part)
            if child in self._listing_in_flight or self.owned.owns(child) or self.names.kept(child):
                continue  # (on its way, made here, or kept for the list cache's TTL)
            if not self._ahead.holds(child, now, self.names.changes):
                self._prefetch_listing(child, children=False, again=True)

    async def _listed_ahead(self, dir_path: str) -> DirListing | None:
        """A listing of ``dir_path`` made in the background that may answer a readdir now
        (`ListedAhead.take`), after waiting for one on its way."""
        in_flight = self._listing_in_flight.get(dir_path)
        if in_flight is not None:
            self._prefetch_slots.urge(dir_path)
            await in_flight.done.wait()  # (a readdir would list it all the same)
        return self._ahead.take(dir_path, self._monotonic_s(), self.names.changes)

    def remember(self, inode: Inode) -> None:
        """The kernel accepted ``inode`` in a readdir reply."""
        self.inodes.by_ino.setdefault(inode.ino, inode)
        self.inodes.remember(inode)

    def forget(self, ino: int, count: int) -> None:
        self.inodes.forget(ino, count)

    async def _resolve(self, path: str) -> Inode | None:
        current = self.inodes.current(path)
        if _newer_here(current):
            return current  # local state is newer than anything GCS can say
        if self._gone_here(path, current):
            return None
        if self.pending_moves:
            source = self.pending_moves.source_of(path)
            if source is not None:
                return current if current is not None else await self._resolve_moving(path, source)
        found = await self.names.lookup(path)
        current = self.inodes.current(path)  # may have changed while we awaited
        if _newer_here(current):
            return current
        if found is not None and not found.is_dir:
            assert found.info is not None
            return await self._file_inode(path, found.info)
        return self._dir_or_nothing(path, found, current)

    def _gone_here(self, path: str, current: Inode | None) -> bool:
        """Whether ``path`` is known to be absent from what this mount did, whatever GCS
        says: never made in a directory this mount made, or removed or renamed away
        here while GCS still has its objects (their delete or move is under way)."""
        if current is None and self.owned.absent(path):
            return True
        if self.pending_deletes and self.pending_deletes.hides(path):
            return True
        return bool(self.pending_moves) and self.pending_moves.hides(path)

    def _dir_or_nothing(
        self, path: str, found: Found | None, current: Inode | None
    ) -> Inode | None:
        """The inode for a directory GCS (or the metadata cache) found at ``path``, or for
        nothing found there."""
        if found is None:
            if self._monotonic_s() < self._emptied.get(path, 0.0):
                # An implied directory whose last object this mount removed: still there,
                # empty, for the metadata TTL (gcsfuse's type cache), so that the rmdir
                # `rm -rf` makes of it next succeeds (the kernel may have forgotten it).
                if current is not None and current.kind is Kind.DIR:
                    return current
                return self.inodes.make(Kind.DIR, path, mtime_ns=self.inodes[ROOT_INO].mtime_ns)
            if current is not None:
                log.debug("%s: GCS has nothing there; inode %d let go", path, current.ino)
                self.inodes.detach(current)
            return None
        if current is not None and current.kind is Kind.DIR:
            current.placeholder = found.placeholder
            return current
        return self.inodes.make(
            Kind.DIR, path, mtime_ns=self._dir_mtime(found.info), placeholder=found.placeholder
        )

    def lookup_now(self, parent_ino: int, name: str) -> Inode | None:
        """`lookup`'s answer when it needs no wait: the metadata cache knows the name as a
        directory or a file (not a symlink, whose target is read first), no listing of
        its directory is under way, and no background rename covers it. None: await
        `lookup`, which decides everything else (errors, nothing there, GCS).

        Why: a request that waits for nothing needs none of the machinery that lets a
        waiting one be interrupted (`tierfs.fuse.operations._AT_ONCE`): that cancel scope
        was 6 of 16 us in-process for a stat whose name the metadata cache holds."""
        parent = self.inodes.by_ino.get(parent_ino)
        if parent is None or parent.kind is not Kind.DIR:
            return None
        path = self.names.child_path(parent.path, name)
        if not self.owned.owns(parent.path):
            self._prefetch_listing(parent.path)
        current = self.inodes.current(path)
        inode: Inode | None
        if _newer_here(current):
            inode = current
        elif parent.path in self._listing_in_flight and current is None:
            return None
        elif self._gone_here(path, current):
            return None
        elif self.pending_moves and self.pending_moves.source_of(path) is not None:
            return None
        else:
            found = self.names.cached(path)
            if found is MISSING:
                return None
            if found.is_dir:
                inode = self._dir_or_nothing(path, found, current)
            else:
                inode = self._file_inode_now(path, found.info)
        if inode is not None:
            self.inodes.remember(inode)
            self.prefill.found(parent.path)
        return inode

    async def _settle(self, *paths: str, deletes: bool = True) -> None:
        """Before a change to ``paths``: wait for the background renames covering them and,
        with ``deletes``, for the background deletes at or below them."""
        if self.pending_moves:
            await self.pending_moves.settled(*paths)
        if deletes and self.pending_deletes:
            await self.pending_deletes.settled(*paths)

    async def _file_inode(self, path: str, info: ObjectInfo) -> Inode:
        """The inode for one generation of a file or symlink object (reused if unchanged).
        An answer older than what this inode stands for (GCS generations only grow: a
        lookup or listing sent before this mount's own upload of the file ended) is stale
        and changes nothing; taken, it read a truncated file back at its old size."""
        inode = self._file_inode_now(path, info)
        if inode is not None:
            return inode
        target = await self.names.symlink_target(info)
        current = self.inodes.current(path)
        if _newer_here(current):
            return current
        if current is not None and current.kind is not Kind.DIR:
            if current.generation > info.generation:
                return current  # (uploaded while the symlink's target was read)
        return self._new_file_inode(path, info, Kind.SYMLINK, target, current)

    def _file_inode_now(self, path: str, info: ObjectInfo | None) -> Inode | None:
        """`_file_inode` when it needs no wait; None for a new symlink (its target is read
        first)."""
        assert info is not None
        current = self.inodes.current(path)
        if current is not None and current.kind is not Kind.DIR:
            if current.generation > info.generation:
                return current
            if current.generation == info.generation:
                current.metageneration = info.metageneration
                current.mtime_ns = parse_mtime(info.metadata, info.updated_s)
                current.crc32c = info.crc32c
                return current
        if is_symlink(info):
            return None
        if _newer_here(current):
            return current
        return self._new_file_inode(path, info, Kind.FILE, "", current)

    def _new_file_inode(
        self, path: str, info: ObjectInfo, kind: Kind, target: str, current: Inode | None
    ) -> Inode:
        if current is not None:
            log.debug(
                "%s: GCS has generation %d; inode %d (generation %d) replaced",
                path,
                info.generation,
                current.ino,
                current.generation,
            )
        return self.inodes.make(
            kind,
            path,
            size=len(target.encode()) if kind is Kind.SYMLINK else info.size,
            generation=info.generation,
            metageneration=info.metageneration,
            mtime_ns=parse_mtime(info.metadata, info.updated_s),
            target=target,
            metadata=dict(info.metadata),
            crc32c=info.crc32c,
        )

    def _dir_mtime(self, info: ObjectInfo | None) -> int:
        if info is None:
            return self.inodes[ROOT_INO].mtime_ns
        return parse_mtime(info.metadata, info.updated_s)
