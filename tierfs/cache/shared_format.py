"""The shared tier's files: block files, fetch markers and the eviction scan.

Everything here is blocking and a pure function of paths, bytes and times (no tier
state): `tierfs.cache.shared.SharedTier` runs it in worker threads. Several nodes (or
several mounts of one machine) use one directory at once, with no lock between them
beyond what ``rename`` and ``O_EXCL`` give, so every function here assumes that another
node may create, replace or delete any file at any moment.

One file per block, header then payload, in the SSD tier's header layout
(`tierfs.cache.ssd_format.HEADER`) under its own magic::

    <dir>/tierfs-shared/v1/<sha256(bucket)[:16]>/<hh>/<h>.<generation>.<block_size>.<index>

``h`` and ``hh`` as in the SSD tier (a hash of the object name: no name can reach
outside the directory). Why one file per block, not the SSD tier's one data file per
object: a block file is written whole under a temporary name and published with
``os.replace``, so a reader on any node sees the whole block or nothing, and eviction
is a plain ``unlink`` that needs no hole punching (which NFS may not have).

- *Publish*: `_publish` (the SSD tier's): temporary ``.tmp-<name>-<random>`` in the
  final directory, mode 0600, then rename. A writer killed mid-publish leaves only a
  temporary, which no reader opens; the scan deletes temporaries older than
  `TMP_MAX_AGE_S` (another node may still be writing a young one).
- *Read*: every header field is checked against the key, the file's size against
  header + payload, and the payload's CRC32C: a torn, truncated or rotten file is
  never served (`_read_block` says why, the tier deletes it).
- *Recency*: a hit sets the file's mtime, at most once per `TOUCH_EVERY_S`, so a
  busy block costs one ``utime`` a minute, not one per read; eviction removes the
  oldest mtimes first.
- *Fetch marker*: ``<block>.fetching``, created with ``O_EXCL`` and holding the
  wall-clock time it expires at. A node that misses a block it finds a live marker
  for waits for the block instead of fetching it from GCS too.
"""

from __future__ import annotations

import contextlib
import errno
import os
from dataclasses import dataclass
from pathlib import Path

import google_crc32c

from tierfs.cache.ssd_format import (
    _FILE_MODE,
    _TMP_PREFIX,
    HEADER,
    _check_header,
    _header,
    _make_dir,
    _open_ours,
    _pread_exact,
    _publish,
    _unlink,
)

SHARED_DIR_NAME = "tierfs-shared"
SHARED_FORMAT_DIR = "v1"
SHARED_MAGIC = b"TFSC"
SHARED_VERSION = 1
MARKER_SUFFIX = ".fetching"
TOUCH_EVERY_S = 60.0
TMP_MAX_AGE_S = 600.0
OK = "ok"
MISSING = "missing"


def block_bytes(
    name: bytes, generation: int, index: int, block_size: int, data: bytes | memoryview
) -> bytes:
    """A block file's whole content: header, object name, payload."""
    head = _header(
        name, generation, index, block_size, data, magic=SHARED_MAGIC, version=SHARED_VERSION
    )
    return head + data


def _ensure_dirs(path: Path, top: Path) -> None:
    """Create the directories below ``top`` down to ``path``'s parent, 0700 each. Puts and
    claims pass the share's root, which is never made (not mounted: not a local
    directory), so that tierfs's folder inside a share mounted after it started, or
    mounted again empty, is made anew."""
    missing = []
    parent = path.parent
    while parent != top and not parent.is_dir():
        missing.append(parent)
        parent = parent.parent
    for directory in reversed(missing):
        _make_dir(directory)


def write_block(path: Path, top: Path, content: bytes) -> bool:
    """Publish ``content`` at ``path`` unless a copy is there already; whether it wrote.

    Another node's copy of the same key holds the same bytes (generations never change),
    so it is kept, not replaced: a reader of it is not disturbed."""
    if os.path.exists(path):
        return False
    _ensure_dirs(path, top)
    _publish(path, content)
    return True


def read_block(
    path: Path, name: bytes, generation: int, index: int, block_size: int, now: float
) -> tuple[str, bytes]:
    """(``"ok"``, payload), (``"missing"``, b"") or (why the file is damaged, b"").

    A file another node deletes while we read it is still ours to read once open (POSIX
    keeps an unlinked file's bytes for its readers; NFS renames it aside for us)."""
    fd = _open_ours(path)
    if isinstance(fd, str):
        return fd, b""
    try:
        status, payload, st = _checked(fd, name, generation, index, block_size)
        if status == OK and now - st.st_mtime >= TOUCH_EVERY_S:
            with contextlib.suppress(OSError):
                os.utime(fd)  # recency for eviction, cheaply
        return status, payload
    finally:
        os.close(fd)


def _checked(
    fd: int, name: bytes, generation: int, index: int, block_size: int
) -> tuple[str, bytes, os.stat_result]:
    """The block file open as ``fd``: (``"ok"``, payload) or (why it is damaged, b""), and
    its status."""
    st = os.fstat(fd)
    head_size = HEADER.size + len(name)
    head = _pread_exact(fd, head_size, 0)
    if len(head) < head_size:
        return f"short file ({st.st_size} bytes)", b"", st
    problem, length, crc = _check_header(
        head, name, generation, index, block_size,
        magic=SHARED_MAGIC, version=SHARED_VERSION, what="header",
    )  # fmt: skip
    if problem:
        return problem, b"", st
    if st.st_size != head_size + length:
        return f"wrong length ({st.st_size} bytes, header says {head_size + length})", b"", st
    payload = _pread_exact(fd, length, head_size)
    if len(payload) != length:
        return "short payload", b"", st
    if google_crc32c.value(payload) != crc:
        return "CRC32C mismatch", b"", st
    return OK, payload, st


def remove_damaged(path: Path, name: bytes, generation: int, index: int, block_size: int) -> None:
    """Unlink the block file at ``path`` if the file there now is damaged too: a good copy
    another node published in place of the damaged one we read stays (removed, it cost
    that node's readers and this one another fetch from GCS)."""
    fd = _open_ours(path)
    if isinstance(fd, str):
        if fd != MISSING:
            _unlink(path)  # not a regular file: never a good copy
        return
    try:
        status, _, st = _checked(fd, name, generation, index, block_size)
    finally:
        os.close(fd)
    if status != OK:
        remove_if_same(path, st.st_ino)


def exists(path: Path) -> bool:
    return os.path.exists(path)


def remove(path: Path) -> None:
    """Unlink ``path``; one another node removed first is fine."""
    _unlink(path)


def remove_if_same(path: Path, ino: int) -> None:
    """Unlink ``path`` if it is still the file ``ino`` (a damaged copy we read), not a good
    copy another node has published in its place since."""
    with contextlib.suppress(FileNotFoundError):
        if os.stat(path, follow_symlinks=False).st_ino == ino:
            _unlink(path)


# --- fetch markers ---------------------------------------------------------------------


def create_marker(path: Path, top: Path, expires_at: float, now: float) -> bool:
    """Claim a block's fetch: make ``path`` hold when the claim ends, atomically (written in
    a temporary, then hard-linked into place: ``link`` fails on an existing name, on NFS
    too, as ``O_EXCL`` does), so that no marker is ever seen empty or half written.

    False if a live marker is there already (another node is fetching); an expired one is
    replaced (its node died or gave up). (A marker made with ``O_EXCL`` and then written
    could stay empty, its write failing on a full share or its node dying in between;
    read as live for ever, it held every reader of that block, on every node, for the
    whole wait, and no scan removed it.)"""
    _ensure_dirs(path, top)
    temporary = path.with_name(f"{_TMP_PREFIX}{os.urandom(8).hex()}.marker")
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(temporary, flags, _FILE_MODE)
    try:
        try:
            os.write(fd, f"{expires_at:.3f}\n".encode())
        finally:
            os.close(fd)
        for _attempt in range(2):
            try:
                _link_once(temporary, path)
            except FileExistsError:
                expiry = marker_expiry(path)
                if expiry is not None and expiry > now:
                    return False
                _unlink(path)  # expired (or vanished): take it over
                continue
            return True
        return False
    finally:
        _unlink(temporary)


def _link_once(temporary: Path, path: Path) -> None:
    """``link(temporary, path)``, or where the file system has no hard links, ``path`` made
    with ``O_EXCL`` and written (a torn marker then reads as expired: `marker_expiry`).
    FileExistsError if ``path`` exists."""
    try:
        os.link(temporary, path)
    except OSError as exc:
        if exc.errno not in (errno.EPERM, errno.EOPNOTSUPP, errno.EXDEV, errno.EMLINK):
            raise
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        fd = os.open(path, flags, _FILE_MODE)
        try:
            os.write(fd, temporary.read_bytes())
        finally:
            os.close(fd)


def remove_marker(path: Path, expires_at: float) -> None:
    """Unlink the marker at ``path`` if it is still ours (holds ``expires_at``): once ours
    expired, another node may have taken the claim over, and its live marker must stay
    (removed, a third node would fetch the block beside it)."""
    if marker_expiry(path) == float(f"{expires_at:.3f}"):
        _unlink(path)


def marker_expiry(path: Path) -> float | None:
    """When the marker at ``path`` expires; None if there is none. One that does not say
    (empty, torn: never made by `create_marker`, which links it whole) has expired."""
    try:
        with open(path, "rb") as marker:
            text = marker.read(64)
    except FileNotFoundError:
        return None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            return None
        raise
    try:
        return float(text)
    except ValueError:
        return 0.0


def poll(marker: Path, path: Path) -> tuple[float | None, bool]:
    """(the marker's expiry or None, whether the block file is there), in that order: the
    marker goes only after the block is published, so "no marker, no block" means the
    fetch it stood for failed."""
    return marker_expiry(marker), os.path.exists(path)


# --- eviction ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Listing:
    """What one scan found: block files as (mtime, size, path), oldest first, and their
    total size; temporaries and markers it removed as stale."""

    blocks: list[tuple[float, int, Path]]
    used_bytes: int
    stale_removed: int
    total_bytes: int = 0  # the shared volume's size and free space (for the AUTO cap)
    free_bytes: int = 0


def scan(top: Path, now: float, marker_now: float) -> Listing:
    """List the block files under ``top`` (a per-bucket directory); remove temporaries older
    than `TMP_MAX_AGE_S` and markers expired by ``marker_now``."""
    blocks: list[tuple[float, int, Path]] = []
    stale = 0
    try:
        fanouts = list(os.scandir(top))
    except FileNotFoundError:
        return Listing([], 0, 0)
    for sub in fanouts:
        if not sub.is_dir(follow_symlinks=False):
            continue
        try:
            entries = list(os.scandir(sub.path))
        except FileNotFoundError:
            continue
        for entry in entries:
            try:
                st = entry.stat(follow_symlinks=False)
            except FileNotFoundError:
                continue  # another node evicted it
            path = Path(entry.path)
            if entry.name.startswith(_TMP_PREFIX):
                if now - st.st_mtime > TMP_MAX_AGE_S:
                    _unlink(path)
                    stale += 1
                continue
            if entry.name.endswith(MARKER_SUFFIX):
                expiry = marker_expiry(path)
                if expiry is not None and expiry <= marker_now:
                    _unlink(path)
                    stale += 1
                continue
            blocks.append((st.st_mtime, st.st_size, path))
    blocks.sort()
    vfs = os.statvfs(top)
    used = sum(size for _, size, _ in blocks)
    return Listing(blocks, used, stale, vfs.f_blocks * vfs.f_frsize, vfs.f_bavail * vfs.f_frsize)


def evict(blocks: list[tuple[float, int, Path]], excess: int) -> tuple[int, int]:
    """Unlink the oldest ``blocks`` until ``excess`` bytes are gone; (files, bytes) we removed.

    Two nodes evicting at once see the same oldest files: a file the other node removed
    first counts as freed (it is), so together they remove about ``excess``, not twice
    it. A file read since the scan (its mtime moved) is kept: someone needs it."""
    files = removed = freed = 0
    for mtime, size, path in blocks:
        if freed >= excess:
            break
        try:
            st = os.stat(path, follow_symlinks=False)
        except FileNotFoundError:
            freed += size  # the other node freed it
            continue
        if st.st_mtime != mtime:
            continue
        try:
            os.unlink(path)
        except FileNotFoundError:
            freed += size
            continue
        files += 1
        removed += size
        freed += size
    return files, removed
