"""Listings listed ahead of a walker, each answering one readdir soon after.

A cold ``ls -lR`` or ``find`` opens one directory after another, and with
``kernel-list-cache-ttl-secs`` 0 (the default) each readdir lists GCS: one round trip
per directory, one after the other, ~7 ms each against the emulator, 30 ms or more
against GCS. When a directory is listed, its subdirectories are listed in the
background (the metadata prefetch does this already, to fill the stat cache); the
listings are kept here so that the walker's readdir of each finds its answer waiting.

What keeps this as fresh as a listing made at readdir:
* a listing answers at most one readdir, and only within `FRESH_S` of when it was sent
  (and never past the metadata TTL, the staleness the user set for stats): a later
  ``ls`` lists GCS again, as gcsfuse does;
* a change made through this mount since it was sent (any: an upload ending, a create,
  a rename, a delete) makes every listing here unusable, so a listing never hides this
  mount's own changes;
* only whole listings (one page that was not cut) are kept, and at most `MAX_ENTRIES`
  entries in all, the oldest dropped first, so memory stays bounded.

A warm walk (the same tree again within the metadata TTL) has its stats in the metadata
cache, so nothing lists ahead of it for the stat cache's sake; yet each readdir must
list GCS again. `Walks` sees a walker going through the subdirectories of a directory
(a readdir of a second one of them) and names the next `WALK_AHEAD` siblings, in the
order the listing gave them, to be listed ahead: a sliding window, one more listing
per readdir, so a walker that stops leaves at most `WALK_AHEAD` listings unused, and a
single ``ls`` of a directory lists nothing ahead. (Measured on the shaped link, +20 ms
per request: a warm ``ls -lR`` of 100 directories ran at 3,487 entries/s against a
cold one's 15,841.)
"""

from __future__ import annotations

from collections import OrderedDict
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tierfs.core.namespace import DirListing

FRESH_S = 2.0  # a listing listed ahead answers a readdir sent at most this long after it
MAX_ENTRIES = 50_000  # entries of the listings kept, in all (~25 MiB of ObjectInfo)
WALK_AHEAD = 16  # siblings listed ahead of a warm walker (`Walks`)
WALK_GAP_S = 10.0  # readdirs of two subdirectories at most this far apart make a walk
MAX_WALKS = 256  # directories whose subdirectories `Walks` remembers
MAX_WALK_NAMES = 100_000  # their names, in all (~10 MiB with the index of those visited)


class ListedAhead:
    """Whole directory listings made in the background, taken once by a readdir."""

    def __init__(self, ttl_s: float) -> None:
        self.fresh_s = min(FRESH_S, ttl_s) if ttl_s >= 0 else FRESH_S
        self._kept: OrderedDict[str, tuple[DirListing, int]] = OrderedDict()
        self._entries = 0
        self.used = 0  # readdirs answered from here
        self.stale = 0  # listings dropped: too old, or a change came after them

    def __len__(self) -> int:
        return len(self._kept)

    def put(self, path: str, listing: DirListing, changes: int) -> None:
        """Keep ``listing`` of ``path``, sent when the mount had made ``changes`` changes."""
        if self.fresh_s <= 0 or not listing.complete:
            return
        self._drop(path)
        size = _size(listing)
        if size > MAX_ENTRIES:
            return
        while self._kept and self._entries + size > MAX_ENTRIES:
            self._drop(next(iter(self._kept)))
        self._kept[path] = (listing, changes)
        self._entries += size

    def take(self, path: str, now_s: float, changes: int) -> DirListing | None:
        """The listing of ``path`` if one is kept and still answers a readdir now (see the
        module doc); it is dropped either way."""
        kept = self._drop(path)
        if kept is None:
            return None
        listing, changes_then = kept
        if changes_then != changes or now_s - listing.sent_s > self.fresh_s:
            self.stale += 1
            return None
        self.used += 1
        return listing

    def holds(self, path: str, now_s: float, changes: int) -> bool:
        """Whether `take` would answer a readdir of ``path`` now (it is not taken)."""
        kept = self._kept.get(path)
        return kept is not None and kept[1] == changes and now_s - kept[0].sent_s <= self.fresh_s

    def _drop(self, path: str) -> tuple[DirListing, int] | None:
        kept = self._kept.pop(path, None)
        if kept is not None:
            self._entries -= _size(kept[0])
        return kept


def _size(listing: DirListing) -> int:
    return len(listing.files) + len(listing.dirs) + 1


class _Seen:
    """A directory's subdirectories as its last readdir listed them, and the walker's
    visits to them."""

    __slots__ = ("dirs", "index", "last_at", "last_s", "visited", "visits")

    def __init__(self, dirs: tuple[str, ...]) -> None:
        self.dirs = dirs
        self.index: dict[str, int] | None = None  # built at the first visit
        self.visits = 0
        self.last_at = -1  # where in ``dirs`` the walker was last
        self.visited: set[str] = set()  # (listed by their own readdir: not again ahead)
        self.last_s = float("-inf")


class Walks:
    """Which directories to list ahead of a warm walker (see the module doc)."""

    def __init__(self, ahead: int = WALK_AHEAD) -> None:
        self.ahead = ahead
        self._seen: OrderedDict[str, _Seen] = OrderedDict()
        self._names = 0

    def __len__(self) -> int:
        return len(self._seen)

    def listed(self, path: str, dirs: tuple[str, ...]) -> None:
        """A readdir of ``path`` listed these subdirectories (names, in listing order)."""
        gone = self._seen.pop(path, None)
        if gone is not None:
            self._names -= len(gone.dirs)
        if not dirs or len(dirs) > MAX_WALK_NAMES:
            return
        self._seen[path] = _Seen(dirs)
        self._names += len(dirs)
        while len(self._seen) > MAX_WALKS or self._names > MAX_WALK_NAMES:
            self._names -= len(self._seen.popitem(last=False)[1].dirs)

    def entering(self, parent: str, name: str, now_s: float) -> tuple[str, ...]:
        """A readdir of ``parent``'s subdirectory ``name`` begins: the names of the
        siblings after it to list ahead (those the walker has not been in; "after" in
        the direction it went from the sibling before), if this is the second such
        readdir within `WALK_GAP_S` of the one before (none for the first: one ``ls`` is
        no walk)."""
        seen = self._seen.get(parent)
        if seen is None:
            return ()
        self._seen.move_to_end(parent)
        if seen.index is None:
            seen.index = {part: i for i, part in enumerate(seen.dirs)}
        at = seen.index.get(name)
        if at is None:
            return ()
        seen.visits = seen.visits + 1 if now_s - seen.last_s <= WALK_GAP_S else 1
        seen.last_s = now_s
        seen.visited.add(name)
        backwards, seen.last_at = at < seen.last_at, at
        if seen.visits < 2:
            return ()
        if backwards:  # (a walker that stacks the names and takes the last first)
            after = seen.dirs[max(0, at - self.ahead) : at][::-1]
        else:
            after = seen.dirs[at + 1 : at + 1 + self.ahead]
        return tuple(part for part in after if part not in seen.visited)
