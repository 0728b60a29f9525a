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
"""

from __future__ import annotations

from collections import OrderedDict
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tierfs.core.namespace import DirListing

FRESH_S = 2.0  # a listing listed ahead answers a readdir sent at most this long after it
MAX_ENTRIES = 50_000  # entries of the listings kept, in all (~25 MiB of ObjectInfo)


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

    def _drop(self, path: str) -> tuple[DirListing, int] | None:
        kept = self._kept.pop(path, None)
        if kept is not None:
            self._entries -= _size(kept[0])
        return kept


def _size(listing: DirListing) -> int:
    return len(listing.files) + len(listing.dirs) + 1
