"""Directories this mount created, and every name made in them: negative lookups without GCS.

Before every create the kernel looks the new name up, and a lookup that finds nothing
costs one or two GCS requests (the file, the directory placeholder): most of the time of
a checkpoint's thousands of small files went there. With write-back, a directory this
mount made with mkdir is *owned*: everything in it was made through this mount, so a name
absent from its table is absent, and the lookup answers ENOENT at once. A name present
is resolved as usual (its inode, the metadata cache, or GCS).

The promise is the mount's own view: another client writing into a directory this mount
just created is not seen there until the directory leaves the table (an unmount, or
eviction from the table, which is bounded; an evicted directory is simply asked of GCS
again, which is always correct). Paths are relative to the mount root, without a
trailing ``/``. Synchronous and I/O-free, like the inode table.

Directories this mount did not make but listed whole (``listed``: a readdir, as ``rm -rf``
makes before it removes what it found) are kept too, for the metadata TTL from when the
listing was sent, with the names it gave, less those removed here since: an rmdir with
write-back takes an empty set for "empty" instead of listing GCS again. Once a name is made
in such a directory, or anything changed in it while its listing was on its way (`watch`),
the set no longer answers (a name made here, uploaded and forgotten by the kernel would be
in neither the listing nor the inode table).
"""

from __future__ import annotations

from collections.abc import Iterable

from cachetools import LRUCache

OWNED_DIRS_KEPT = 10_000
LISTED_DIRS_KEPT = 256  # an `rm -rf` needs the listings of the directories it is inside


class OwnedDirs:
    def __init__(self, max_dirs: int = OWNED_DIRS_KEPT, max_listed: int = LISTED_DIRS_KEPT) -> None:
        self._children: LRUCache[str, set[str]] = LRUCache(maxsize=max_dirs)
        # path -> (monotonic time it stops answering, the names still there)
        self._listed: LRUCache[str, tuple[float, set[str]]] = LRUCache(maxsize=max_listed)
        self._watched: dict[str, list[int]] = {}  # path listed now -> [listings, changes]

    def __len__(self) -> int:
        return len(self._children)

    def made(self, path: str) -> None:
        """``mkdir path`` by this mount: a new, empty, owned directory."""
        self._children[path] = set()
        self.added(path)

    def added(self, path: str) -> None:
        """A name made at ``path`` (create, mkdir, symlink, the target of a rename)."""
        parent, _, name = path.rpartition("/")
        self._change(parent)
        children = self._children.get(parent)
        if children is not None:
            children.add(name)
        self._listed.pop(parent, None)

    def removed(self, path: str, *, is_dir: bool = False) -> None:
        """``path`` is gone (unlink, rmdir, the source of a rename), with all below it."""
        parent, _, name = path.rpartition("/")
        self._change(parent)
        children = self._children.get(parent)
        if children is not None:
            children.discard(name)
        listed = self._listed.get(parent)
        if listed is not None:
            listed[1].discard(name)
        if is_dir:
            for key in self._below(path):
                self._children.pop(key, None)
            for key in [k for k in self._listed if k == path or k.startswith(path + "/")]:
                self._listed.pop(key, None)

    def _change(self, parent: str) -> None:
        watched = self._watched.get(parent)
        if watched is not None:
            watched[1] += 1

    def watch(self, path: str) -> int:
        """A listing of ``path`` is sent: the count of changes in it to give `unwatch`."""
        watched = self._watched.setdefault(path, [0, 0])
        watched[0] += 1
        return watched[1]

    def unwatch(self, path: str, count: int) -> bool:
        """The listing of ``path`` is back: whether nothing changed in it meanwhile."""
        watched = self._watched[path]
        watched[0] -= 1
        if not watched[0]:
            del self._watched[path]
        return watched[1] == count

    def listed(self, path: str, names: Iterable[str], until_s: float) -> None:
        """A whole listing of ``path`` (not owned) named ``names``; it answers until
        ``until_s`` (monotonic)."""
        if path not in self._children:
            self._listed[path] = (until_s, set(names))

    def listed_children(self, path: str, now_s: float) -> set[str] | None:
        """The names still in a directory listed here, removals since counted; None when
        no listing answers (none kept, made stale, or older than its TTL)."""
        entry = self._listed.get(path)
        if entry is None or now_s >= entry[0]:
            return None
        return entry[1]

    def moved(self, old: str, new: str, *, is_dir: bool) -> None:
        """``rename old new``: names leave one table and join another; an owned directory
        stays owned under its new name, and so do those below it."""
        moving = {key: self._children[key] for key in self._below(old)} if is_dir else {}
        self.removed(old, is_dir=is_dir)
        for key, children in moving.items():
            self._children[new + key[len(old) :]] = children
        self.added(new)

    def absent(self, path: str) -> bool:
        """True when ``path`` is known not to exist: its parent is owned and never had it."""
        parent, _, name = path.rpartition("/")
        children = self._children.get(parent)
        return children is not None and name not in children

    def owns(self, path: str) -> bool:
        return path in self._children

    def children(self, path: str) -> set[str] | None:
        """The names made in an owned directory (None: not owned)."""
        return self._children.get(path)

    def _below(self, path: str) -> list[str]:
        """Owned directories at or below ``path`` (a scan: directories only, bounded)."""
        return [k for k in self._children if k == path or k.startswith(path + "/")]
