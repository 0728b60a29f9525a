"""The metadata cache: what a path resolved to, kept for gcsfuse's TTLs.

One entry per path: a `Found` (a file's object, or a directory) or None
("nothing there"). It plays the part of gcsfuse's stat cache and type cache
together, since one lookup answers both questions:

* positive entries live ``metadata-cache:ttl-secs`` (-1: forever, 0: not cached);
* negative entries live ``metadata-cache:negative-ttl-secs`` (same rules);
* files and "nothing there" entries hold at most ``stat-cache-max-size-mb``, and
  directories at most ``type-cache-max-size-mb`` (gcsfuse's type cache is what
  says a name is a directory); each -1: unlimited, 0: off, accounted in bytes by
  an estimate of each entry's size, LRU first within each.

Each entry carries its expiry, checked when it is read: an expired entry is dropped then,
or evicted as the least recently used, and `statistics` drops those among the longest
stored (`SWEEP_ENTRIES`) before it counts what is held. (Not a time-aware cache that
expires on every call: a listing stores every entry it names, and that cost 4-9 times as
much per entry; see `_store`.)

The mount's own changes update it at once (`put`, `forget`), so close-to-open
holds for this mount whatever the TTL; changes by other clients show once the
entry expires. An answer from GCS (a stat, a listing) is stored with `put_answer`,
which drops it if the mount changed that path after the request was sent: an
upload or delete that ends in the background while a listing is on its way must
not be undone by the older answer (`asking` / `answered` bracket each request).
Time is injected (``clock``) so tests never sleep.
"""

from __future__ import annotations

import itertools
import math
import time
from collections import Counter
from collections.abc import Callable

from cachetools import Cache, LRUCache

from tierfs.core.namespace import MISSING, Found

# The LRU's slot, the key, the tuple, the Found and ObjectInfo objects and their dicts:
# measured (tracemalloc, 100,000 entries) at ~760 bytes besides the names and metadata.
# It was 320: a cache given 32 MiB held more than twice that
# (`test_metacache_model.py::test_the_byte_budget_counts_what_an_entry_really_takes`).
ENTRY_OVERHEAD_BYTES = 760
_Entry = tuple[Found | None, int, float]  # what the path is, its size in bytes, expiry
_Cache = LRUCache[str, _Entry]
PRUNE_AT = 1024  # changes remembered before `answered` drops those no request needs
# Entries `statistics` looks at for expiry, the longest stored first, in each cache: a
# sweep of all of them took 26 ms at 100,000 entries and 417 ms at 1,000,000, on the
# event loop, at every metrics scrape. The rest go when read, or evicted.
SWEEP_ENTRIES = 4096


def _entry_bytes(path: str, found: Found | None) -> int:
    size = ENTRY_OVERHEAD_BYTES + len(path.encode("utf-8", "surrogatepass"))
    if found is not None and found.info is not None:
        info = found.info
        size += len(info.name) + sum(len(k) + len(v) for k, v in info.metadata.items())
    return size


class MetadataCache:
    """Path -> lookup result, with positive and negative TTLs and a byte budget."""

    def __init__(
        self,
        *,
        ttl_s: float,
        negative_ttl_s: float,
        max_bytes: float,
        type_max_bytes: float = math.inf,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.ttl_s = ttl_s
        self.negative_ttl_s = negative_ttl_s
        self.enabled = (max_bytes > 0 or type_max_bytes > 0) and (ttl_s > 0 or negative_ttl_s > 0)
        self._clock = clock
        self._entries = self._cache(max_bytes)  # files and "nothing there"
        self._types = self._cache(type_max_bytes)  # directories
        self._caches = (self._entries, self._types)
        self.hits = 0
        self.negative_hits = 0
        self.misses = 0
        # Changes made while answers are awaited: path -> the change's number (see
        # `put_answer`). Kept only as long as a request older than the change is out (a
        # busy mount always has some out: `answered` prunes what none can need).
        self._sequence = 0
        self._asked: Counter[int] = Counter()  # requests out, by the number they were sent at
        self._touched: dict[str, int] = {}
        self._touched_below: dict[str, int] = {}

    @staticmethod
    def _cache(max_bytes: float) -> _Cache:
        return LRUCache(maxsize=max_bytes if max_bytes > 0 else 0, getsizeof=lambda entry: entry[1])

    def _held(self, path: str) -> _Entry | None:
        """The live entry for ``path`` (an expired one is dropped on the way)."""
        for cache in self._caches:
            entry = cache.get(path)
            if entry is not None:
                if self._clock() < entry[2]:
                    return entry
                del cache[path]
        return None

    def get(self, path: str, *, found_only: bool = False) -> Found | None:
        """The cached result, None for a cached "nothing there", or `MISSING`. With
        ``found_only``, `MISSING` for all but something found, and only that counted (an
        answer at once, `Lookups.lookup_now`: what it cannot use, `get` counts next)."""
        entry = self._held(path) if self.enabled else None
        if entry is None or (found_only and entry[0] is None):
            if not found_only:
                self.misses += 1
            return MISSING
        if entry[0] is None:
            self.negative_hits += 1
        else:
            self.hits += 1
        return entry[0]

    def asking(self) -> int:
        """A request to GCS is about to be sent; give its answer's `put_answer`, and then
        `answered`, this."""
        self._asked[self._sequence] += 1
        return self._sequence

    def answered(self, asked: int) -> None:
        """The request of an `asking` has its answer (or failed), and it is stored."""
        self._asked[asked] -= 1
        if self._asked[asked] <= 0:
            del self._asked[asked]
        if not self._asked:
            self._touched.clear()
            self._touched_below.clear()
        elif len(self._touched) + len(self._touched_below) > PRUNE_AT:
            oldest = min(self._asked)  # changes before it concern no request still out
            for touched in (self._touched, self._touched_below):
                for path in [p for p, number in touched.items() if number < oldest]:
                    del touched[path]

    def _touch(self, path: str, *, below: bool = False) -> None:
        if self._asked:
            (self._touched_below if below else self._touched)[path] = self._sequence
            self._sequence += 1

    def _changed_since(self, path: str, asked: int) -> bool:
        if self._touched.get(path, -1) >= asked:
            return True
        if self._touched_below:
            parts = path.split("/")
            for depth in range(len(parts), -1, -1):
                if self._touched_below.get("/".join(parts[:depth]), -1) >= asked:
                    return True
        return False

    def put_answer(self, path: str, found: Found | None, asked: int) -> None:
        """GCS's answer about ``path`` to a request sent at ``asked`` (`asking`): kept
        unless this mount changed the path since (its own state is newer)."""
        if not self._changed_since(path, asked):
            self._store(path, found)

    def put(self, path: str, found: Found | None) -> None:
        """This mount's own knowledge of ``path``."""
        self._touch(path)
        self._store(path, found)

    def _store(self, path: str, found: Found | None) -> None:
        """Keep ``found`` for ``path`` in its cache, replacing what either held. Run for
        every entry of every listing: look-ups, a delete and a set in plain LRU caches
        (with `TLRUCache`, two pops and a set, each reading the clock and expiring,
        `put_answer` took 10.4 us an entry into an empty cache and 13.4 into one holding
        them, against 2.4 and 2.8 now, 10,100 entries; a warm ``ls -lR`` of 10,100 entries
        spent 132 ms of its daemon's main thread in `put_answer`, 43 after).
        """
        ttl = self.ttl_s if found is not None else self.negative_ttl_s
        cache, other = self._caches
        if found is not None and found.is_dir:
            cache, other = other, cache
        if path in other:
            del other[path]
        if path in cache:
            del cache[path]  # (stored again: last in store order, for `_expire`)
        size = _entry_bytes(path, found)
        if self.enabled and ttl > 0 and size <= cache.maxsize:
            cache[path] = (found, size, self._clock() + ttl)

    def forget(self, path: str) -> None:
        self._touch(path)
        for cache in self._caches:
            cache.pop(path, None)

    def forget_below(self, path: str) -> None:
        """Drop ``path`` and everything under it (a directory renamed or removed)."""
        self._touch(path, below=True)
        prefix = path + "/"
        for cache in self._caches:
            for key in [k for k in cache if k == path or k.startswith(prefix)]:
                cache.pop(key, None)

    def forget_implied_above(self, path: str) -> None:
        """Something below these directories went away: directories that exist only by
        implication (no placeholder) may have gone with it, so ask GCS next time."""
        parts = path.split("/")[:-1]
        for depth in range(len(parts), 0, -1):
            ancestor = "/".join(parts[:depth])
            entry = self._types.get(ancestor)
            if entry is not None and entry[0] is not None and not entry[0].placeholder:
                self._types.pop(ancestor, None)

    def _expire(self) -> None:
        """Drop the expired among the `SWEEP_ENTRIES` longest stored of each cache (a
        cache iterates in store order: `_store` deletes before it stores again), without
        touching the LRU order (`Cache.__getitem__`, not the LRU's own)."""
        if all(ttl <= 0 or ttl == math.inf for ttl in (self.ttl_s, self.negative_ttl_s)):
            return  # nothing kept ever expires (the checkpointing line: ttl-secs -1)
        now = self._clock()
        for cache in self._caches:
            for path in list(itertools.islice(cache, SWEEP_ENTRIES)):
                if Cache.__getitem__(cache, path)[2] <= now:
                    del cache[path]

    def statistics(self) -> dict[str, int]:
        self._expire()
        return {
            "hits": self.hits,
            "negative_hits": self.negative_hits,
            "misses": self.misses,
            "entries": len(self._entries) + len(self._types),
            "used_bytes": int(self._entries.currsize),
            "type_entries": len(self._types),
            "type_used_bytes": int(self._types.currsize),
        }
