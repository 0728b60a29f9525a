"""Names: how paths under the mountpoint map to object names, exactly as gcsfuse maps them.

* A file ``a/b`` is the object ``PREFIX + "a/b"`` (``PREFIX`` is ``only-dir/``).
* A directory ``a`` exists when the placeholder object ``a/`` exists, or, with
  ``implicit-dirs``, when any object's name starts with ``a/``.
* When both ``foo`` and ``foo/`` exist the directory is shown as ``foo`` and
  the file as ``foo\\n`` (gcsfuse's convention).
* Objects whose names cannot be paths (``a//b``, ``./x``, ``../x``, a part
  longer than 255 bytes, a NUL) are hidden from listings and never looked up,
  so no object name can reach outside the mount. So are names that end in a
  line feed: ``foo\n`` already names the file ``foo`` beside a directory
  ``foo`` (GCS refuses such names anyway; only an emulator holds them), and
  that name resolves only while the directory exists. One name, one object,
  always. Hidden names are counted (`hidden_names`).
* Symlinks: an object with metadata ``gcsfuse_symlink_target`` (old format,
  empty body) or ``goog-reserved-file-is-symlink: true`` (new format, the
  target is the body; gcsfuse >= 3.9 writes both keys).

This module asks the bucket and returns plain data; it keeps no state and
knows nothing of inodes or FUSE.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import trio
from cachetools import LRUCache, TTLCache

from tierfs.errors import InvalidName, NameTooLong, NotFound
from tierfs.storage import Bucket, Listing, ObjectInfo, check_name

if TYPE_CHECKING:
    from tierfs.core.metacache import MetadataCache

log = logging.getLogger("tierfs.names")
MISSING: Any = object()  # "not in the metadata cache" (None means "cached: nothing there")
SYMLINK_TARGET_KEY = "gcsfuse_symlink_target"
SYMLINK_FLAG_KEY = "goog-reserved-file-is-symlink"
CONFLICT_SUFFIX = "\n"
LISTINGS_KEPT = 4096
HIDDEN_KEPT = 100_000  # distinct hidden names remembered, to count and log each once
NAME_MAX_BYTES = 255
OBJECT_NAME_MAX_BYTES = 1024


@dataclass(frozen=True)
class Found:
    """What a lookup found at one path: a directory (placeholder or implied) or an object."""

    is_dir: bool
    info: ObjectInfo | None = None  # the file/symlink object, or the dir placeholder
    placeholder: bool = False


@dataclass(frozen=True)
class DirListing:
    files: tuple[tuple[str, ObjectInfo], ...]  # (entry name, object)
    dirs: tuple[str, ...]
    sent_s: float = 0.0  # when its request was sent (the namespace's clock)
    # The placeholder objects of those of ``dirs`` that have one (entry name -> object):
    # an explicit directory, known as one without a lookup of its own.
    placeholders: Mapping[str, ObjectInfo] = field(default_factory=dict)
    complete: bool = True  # False: cut at a number of entries (a prefetch's one page)


def valid_part(part: str) -> bool:
    """Whether an object's name part can be an entry of its own (see the module doc)."""
    return (
        part not in ("", ".", "..")
        and "\0" not in part
        and "/" not in part
        and not part.endswith(CONFLICT_SUFFIX)
        and len(part.encode("utf-8", "surrogatepass")) <= NAME_MAX_BYTES
    )


def decode_name(raw: bytes) -> str:
    """A name from the kernel; GCS names are UTF-8, so other bytes cannot name an object."""
    try:
        name = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise InvalidName("name is not valid UTF-8") from None
    if len(raw) > NAME_MAX_BYTES:
        raise NameTooLong(name)
    return name


def check_new_name(name: str) -> None:
    """A name about to become part of an object name: GCS's rules (no CR/LF...)."""
    check_name(name)


def decode_target(raw: bytes) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise InvalidName("symlink target is not valid UTF-8") from None


def is_symlink(info: ObjectInfo) -> bool:
    return SYMLINK_TARGET_KEY in info.metadata or info.metadata.get(SYMLINK_FLAG_KEY) == "true"


class Namespace:
    """Path <-> object-name mapping and the GCS requests that resolve one path."""

    def __init__(
        self,
        bucket: Bucket,
        *,
        only_dir: str = "",
        implicit_dirs: bool = False,
        cache: MetadataCache | None = None,
        list_ttl_s: float = 0.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.bucket = bucket
        self.prefix = only_dir.strip("/") + "/" if only_dir.strip("/") else ""
        self.implicit_dirs = implicit_dirs
        self.cache = cache
        self._clock = clock
        # Listings kept for ``file-system:kernel-list-cache-ttl-secs``: a repeated `ls` costs
        # no GCS request, and this mount's own changes evict the parent's listing at once.
        # The kernel's own cache of a listing (FOPEN_CACHE_DIR, with the pyfuse3 of
        # deploy/pyfuse3) is kept exactly as long as the listing it came from stays here.
        self.listings: TTLCache[str, DirListing] | None = (
            TTLCache(maxsize=LISTINGS_KEPT, ttl=list_ttl_s, timer=clock) if list_ttl_s > 0 else None
        )
        self._hidden: LRUCache[str, None] = LRUCache(maxsize=HIDDEN_KEPT)
        self.hidden_names = 0  # distinct object names listed that no entry shows
        self._changes = 0  # this mount's changes so far (a listing that saw one is not kept)

    def _hide(self, name: str) -> None:
        if name not in self._hidden:
            self.hidden_names += 1
            log.info("gs://%s/%s: hidden (no path can name it)", self.bucket.name, name)
        self._hidden[name] = None

    def learned(self, path: str, found: Found | None) -> None:
        """This mount changed ``path``: its new state is known without asking GCS."""
        self._changed(path)
        if self.cache is not None:
            self.cache.put(path, found)

    def forget(self, path: str, *, below: bool = False) -> None:
        self._changed(path, below=below)
        if self.cache is not None:
            if below:
                self.cache.forget_below(path)
            else:
                self.cache.forget(path)

    def removed(self, path: str, *, below: bool = True, is_dir: bool = False) -> None:
        """This mount removed ``path``: it is gone, and implied parents may be too.
        ``below`` False: a file, with nothing below it to forget (that scan is the cost of
        an unlink in a large cache). ``is_dir``: a directory, whose name is forgotten, not
        known absent: a file of the same name GCS may hold (``foo`` beside ``foo/``) is
        what the name shows once the directory is gone."""
        self._changed(path, below=below)
        if self.cache is not None:
            if below:
                self.cache.forget_below(path)
            if is_dir:
                self.cache.forget(path)
            else:
                self.cache.put(path, None)
            self.cache.forget_implied_above(path)

    def deleted(self, path: str, *, is_dir: bool = False) -> None:
        """The object of ``path``, already removed from this mount, is gone from GCS too:
        nothing learned of it while its delete ran may stay (cheaper than `removed`)."""
        self._changed(path)
        if self.cache is not None:
            if is_dir:
                self.cache.forget(path)
            else:
                self.cache.put(path, None)
            self.cache.forget_implied_above(path)  # (learned from listings meanwhile)

    def _changed(self, path: str, *, below: bool = False) -> None:
        """Drop kept listings that ``path`` changing makes stale (its ancestors' too: an
        implied directory may appear or vanish with it)."""
        self._changes += 1
        if self.listings is None:
            return
        parts = path.split("/")
        for depth in range(len(parts)):
            self.listings.pop("/".join(parts[:depth]), None)
        if below:
            for key in [k for k in self.listings if k == path or k.startswith(path + "/")]:
                self.listings.pop(key, None)

    def file_object(self, path: str) -> str:
        """The object of a file; ``foo\\n`` (the file beside a directory ``foo``) is ``foo``."""
        if path.endswith(CONFLICT_SUFFIX):
            path = path[: -len(CONFLICT_SUFFIX)]
        name = self.prefix + path
        if len(name.encode("utf-8")) > OBJECT_NAME_MAX_BYTES:
            raise NameTooLong(path)
        return name

    def dir_object(self, path: str) -> str:
        """The placeholder object of a directory ('' for the mount root)."""
        return self.prefix + path + "/" if path else self.prefix

    def new_dir_object(self, path: str) -> str:
        """The placeholder a mkdir makes: `dir_object`, within GCS's name limit (a directory
        made with write-back is a journal record that could never be uploaded otherwise)."""
        name = self.dir_object(path)
        if len(name.encode("utf-8")) > OBJECT_NAME_MAX_BYTES:
            raise NameTooLong(path)
        return name

    def child_path(self, parent: str, name: str) -> str:
        return f"{parent}/{name}" if parent else name

    def cached(self, path: str) -> Found:
        """What the metadata cache found at ``path``, or `MISSING` (not cached, or cached
        as nothing there: `lookup` answers that)."""
        found = MISSING if self.cache is None else self.cache.get(path, found_only=True)
        return MISSING if found is None else found

    async def lookup(self, path: str) -> Found | None:
        """Resolve one path: from the metadata cache, else by asking GCS."""
        if self.cache is not None:
            cached = self.cache.get(path)
            if cached is not MISSING:
                return cached
        if self.cache is None:
            return await self._lookup(path)
        asked = self.cache.asking()
        try:
            found = await self._lookup(path)
            # Only the answer is cached: asking GCS changed nothing, so the kept listings
            # of the parents stay (dropping them made every cold stat re-list every
            # ancestor, the root included, and the kernel drop its copies).
            self.cache.put_answer(path, found, asked)
        finally:
            self.cache.answered(asked)  # (after put_answer: it forgets what changed meanwhile)
        return found

    async def _lookup(self, path: str) -> Found | None:
        """Resolve one path with up to three concurrent requests (file, placeholder, implied)."""
        if path.endswith(CONFLICT_SUFFIX):
            return await self._lookup_beside(path[: -len(CONFLICT_SUFFIX)])
        file_name, dir_name = self.file_object(path), self.dir_object(path)
        results: dict[str, object] = {}

        async def stat_into(key: str, name: str) -> None:
            results[key] = await self._stat(name)

        async def implied() -> None:
            listing = await self.bucket.list(dir_name, delimiter=None, max_results=1)
            results["implied"] = bool(listing.objects or listing.prefixes)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(stat_into, "file", file_name)
            nursery.start_soon(stat_into, "dir", dir_name)
            if self.implicit_dirs:
                nursery.start_soon(implied)
        placeholder = results.get("dir")
        if isinstance(placeholder, ObjectInfo):
            return Found(True, placeholder, placeholder=True)
        if results.get("implied"):
            return Found(True)
        file_info = results.get("file")
        if isinstance(file_info, ObjectInfo):
            return Found(False, file_info)
        return None

    async def _lookup_beside(self, path: str) -> Found | None:
        """``path + "\\n"``: the file ``path`` while a directory ``path`` exists, else
        nothing (it is not a second name of a lone file)."""
        if path.endswith(CONFLICT_SUFFIX):
            return None  # (``foo\n\n`` would be a hidden object's name)
        found = await self.lookup(path)
        if found is None or not found.is_dir:
            return None
        info = await self._stat(self.file_object(path))
        return Found(False, info) if info is not None else None

    def kept(self, path: str) -> bool:
        """Whether a listing of ``path`` is kept (``kernel-list-cache-ttl-secs``)."""
        return self.listings is not None and path in self.listings

    def keep(self, path: str, listing: DirListing) -> None:
        """Keep a listing made ahead, and taken by a readdir, as ``path``'s listing (what
        `list_dir` keeps), so the kernel may keep its copy of it as well."""
        if self.listings is not None:
            self.listings[path] = listing

    async def list_dir(self, path: str, *, fresh: bool = False) -> DirListing:
        """A directory's listing; ``fresh``: from GCS now, and not kept (a tree that a
        background rename is moving changes under it)."""
        if self.listings is not None and not fresh:
            kept = self.listings.get(path)
            if kept is not None:
                return kept
        changes = self._changes
        listing = await self._list_dir(path)
        if self.listings is not None and not fresh and changes == self._changes:
            self.listings[path] = listing  # (kept only if nothing changed while it came)
        return listing

    @property
    def changes(self) -> int:
        """How many changes this mount has made so far (a listing sent before the count
        last grew may not show one of them)."""
        return self._changes

    async def prefetch(self, path: str, max_entries: int) -> DirListing:
        """Fill the metadata cache from (the first ``max_entries`` of) a directory's listing
        (-1: all), without keeping the listing as the directory's (`list_dir`)."""
        return await self._list_dir(path, None if max_entries < 0 else max(1, max_entries))

    async def _list_dir(self, path: str, max_results: int | None = None) -> DirListing:
        prefix = self.dir_object(path)
        cache = self.cache
        asked = cache.asking() if cache is not None else 0
        sent_s = self._clock()
        try:
            listing = await self.bucket.list(prefix, delimiter="/", max_results=max_results)
            return self._listed(path, prefix, listing, max_results, asked, sent_s)
        finally:
            if cache is not None:
                cache.answered(asked)  # (after the answers are stored, see `put_answer`)

    def _listed(
        self,
        path: str,
        prefix: str,
        listing: Listing,
        max_results: int | None,
        asked: int,
        sent_s: float,
    ) -> DirListing:
        cache = self.cache
        truncated = max_results is not None and (
            len(listing.objects) + len(listing.prefixes) >= max_results
        )
        dirs = []
        for sub in listing.prefixes:
            part = sub[len(prefix) : -1]
            if valid_part(part):
                dirs.append(part)
            else:
                self._hide(sub)
        dir_set = set(dirs)
        # A cut listing stops at its last name, and 'foo/' sorts after 'foo-v2' and
        # 'foo.bak': a file whose directory twin would sort past that name may have one.
        last = _last_name(listing) if truncated else ""
        files = []
        for info in listing.objects:
            part = info.name[len(prefix) :]
            if not valid_part(part):
                if part:  # (not the placeholder itself)
                    self._hide(info.name)
                continue
            entry = part + CONFLICT_SUFFIX if part in dir_set else part
            files.append((entry, info))
            if cache is not None and not (truncated and info.name + "/" > last):
                cache.put_answer(self.child_path(path, entry), Found(False, info), asked)
        placeholders = {
            info.name[len(prefix) : -1]: info
            for info in listing.placeholders
            if info.name[len(prefix) : -1] in dir_set
        }
        if cache is not None:
            for part in dirs:  # without implicit-dirs a prefix alone is not a directory
                own = placeholders.get(part)
                if own is not None:
                    found = Found(True, own, placeholder=True)
                elif self.implicit_dirs:
                    found = Found(True)
                else:
                    continue
                cache.put_answer(self.child_path(path, part), found, asked)
        return DirListing(tuple(files), tuple(dirs), sent_s, placeholders, not truncated)

    async def list_below(self, path: str) -> tuple[ObjectInfo, ...]:
        """Every object below a directory (recursively), its placeholder included."""
        listing = await self.bucket.list(self.dir_object(path), delimiter=None)
        return listing.objects

    async def symlink_target(self, info: ObjectInfo) -> str:
        target = info.metadata.get(SYMLINK_TARGET_KEY)
        if target is not None:
            return target
        body = await self.bucket.read(
            info.name, generation=info.generation, offset=0, length=info.size
        )
        return bytes(body).decode("utf-8", "replace")

    async def _stat(self, name: str) -> ObjectInfo | None:
        if not name:
            return None
        try:
            return await self.bucket.stat(name)
        except NotFound:
            return None


def _last_name(listing: Listing) -> str:
    """The name a listing ends at (objects, placeholders and prefixes sort together)."""
    return max(
        (
            *(info.name for info in listing.objects),
            *(info.name for info in listing.placeholders),
            *listing.prefixes,
        ),
        default="",
    )
