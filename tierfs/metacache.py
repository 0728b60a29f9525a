"""The metadata cache: what a path resolved to, kept for gcsfuse's TTLs.

One entry per path: a `Found` (a file's object, or a directory) or None
("nothing there"). It plays the part of gcsfuse's stat cache and type cache
together, since one lookup answers both questions:

* positive entries live ``metadata-cache:ttl-secs`` (-1: forever, 0: not cached);
* negative entries live ``metadata-cache:negative-ttl-secs`` (same rules);
* the whole cache holds at most ``stat-cache-max-size-mb`` (-1: unlimited,
  0: off), accounted in bytes by an estimate of each entry's size, LRU first.

The mount's own changes update it at once (`put`, `forget`), so close-to-open
holds for this mount whatever the TTL; changes by other clients show once the
entry expires. Time is injected (``clock``) so tests never sleep.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

from cachetools import TLRUCache

from tierfs.namespace import MISSING, Found

ENTRY_OVERHEAD_BYTES = 320  # dict slot, key, tuple, Found and ObjectInfo objects


def ttl_s(secs: int) -> float:
    """gcsfuse's TTL convention: -1 = forever, 0 = off."""
    return math.inf if secs < 0 else float(secs)


def size_limit(max_size_mb: int) -> float:
    return math.inf if max_size_mb < 0 else float(max_size_mb) * (1 << 20)


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
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.ttl_s = ttl_s
        self.negative_ttl_s = negative_ttl_s
        self.enabled = max_bytes > 0 and (ttl_s > 0 or negative_ttl_s > 0)
        self._entries: TLRUCache[str, tuple[Found | None, int]] = TLRUCache(
            maxsize=max_bytes if max_bytes > 0 else 1,
            ttu=self._expires,
            timer=clock,
            getsizeof=lambda entry: entry[1],
        )
        self.hits = 0
        self.negative_hits = 0
        self.misses = 0

    def _expires(self, _path: str, entry: tuple[Found | None, int], now: float) -> float:
        return now + (self.ttl_s if entry[0] is not None else self.negative_ttl_s)

    def get(self, path: str) -> Found | None:
        """The cached result, None for a cached "nothing there", or `MISSING`."""
        entry = self._entries.get(path, MISSING) if self.enabled else MISSING
        if entry is MISSING:
            self.misses += 1
            return MISSING
        if entry[0] is None:
            self.negative_hits += 1
        else:
            self.hits += 1
        return entry[0]

    def put(self, path: str, found: Found | None) -> None:
        ttl = self.ttl_s if found is not None else self.negative_ttl_s
        if not self.enabled or ttl <= 0:
            self._entries.pop(path, None)
            return
        size = _entry_bytes(path, found)
        if size > self._entries.maxsize:
            return
        self._entries[path] = (found, size)

    def forget(self, path: str) -> None:
        self._entries.pop(path, None)

    def forget_below(self, path: str) -> None:
        """Drop ``path`` and everything under it (a directory renamed or removed)."""
        prefix = path + "/"
        for key in [k for k in self._entries if k == path or k.startswith(prefix)]:
            self._entries.pop(key, None)

    def forget_implied_above(self, path: str) -> None:
        """Something below these directories went away: directories that exist only by
        implication (no placeholder) may have gone with it, so ask GCS next time."""
        parts = path.split("/")[:-1]
        for depth in range(len(parts), 0, -1):
            ancestor = "/".join(parts[:depth])
            entry = self._entries.get(ancestor)
            if entry is not None and entry[0] is not None and entry[0].is_dir:
                if not entry[0].placeholder:
                    self._entries.pop(ancestor, None)

    def statistics(self) -> dict[str, int]:
        self._entries.expire()
        used = self._entries.currsize
        return {
            "hits": self.hits,
            "negative_hits": self.negative_hits,
            "misses": self.misses,
            "entries": len(self._entries),
            "used_bytes": int(used),
        }
