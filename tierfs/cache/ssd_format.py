"""The SSD tier's files on disk: names and block headers (the start-up scan that reads
them back is `tierfs.cache.ssd_scan`; the seals of whole objects, `tierfs.cache.ssd_seals`).

Everything here is a pure function of paths and bytes (no tier state), so the format
can be read and checked on its own; `tierfs.cache.ssd.SsdTier` keeps the index, the
budget and the pins on top of it.

Record format (little-endian)::

    magic  b"TFSB"         4 bytes
    version                u16  (FORMAT_VERSION)
    reserved               u16  (0)
    name_len               u32  UTF-8 bytes of the object name (diagnostics, and checked)
    generation             u64
    index                  u64
    block_size             u64
    length                 u64  payload bytes (<= block_size), at index * block_size
    crc32c                 u32  CRC32C of the payload (crc32c: hardware, ~25 GB/s)
    name                   name_len bytes

A get checks every record field against the key it asked for, that the record is
exactly header + name long, and the CRC32C of the payload read from the data file.
Any mismatch, a short file or a file that is not ours (a symlink is not followed) is
counted as ``corrupt``, dropped, and answered as a miss: the reader fetches the block
again from GCS. A file that cannot be read at all (EIO...) is counted in ``errors``
and dropped the same way.

Crash guarantee. A block's payload is written into the data file first, then its
record is written to ``.tmp-<name>-<random>`` and published with ``os.replace``;
nothing is fsync'd on that path. A daemon crash (kill -9) loses nothing the kernel
already holds. A machine crash can lose recent records (the block is then absent: a
miss) or publish a record whose payload never reached the disk: the CRC check catches
that, as it catches a broken disk, bit rot or someone editing a file, and the damaged
copy is never served. Orphaned temporaries and data files with no record left are
deleted at the next `open`. (An fdatasync per block halved the write rate on the
benchmark machine, 237 vs 539 MB/s, and bought no correctness the checks do not
already give.)

What the tier does not resist is a deliberate forgery with a valid record and CRC, or
a forged seal; hence the 0700 directories. Recency survives restarts too: a hit sets
its record's mtime, and `open` orders the rebuilt LRU by it (a crash may lose a few of
those touches, which only changes eviction order).
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import errno
import fcntl
import functools
import hashlib
import logging
import os
import re
import secrets
import stat
import struct
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from crc32c import crc32c as crc32c_of

from tierfs.cache.ssd_direct import write_payload

log = logging.getLogger("tierfs.cache")

MiB = 1 << 20
GiB = 1 << 30
AUTO = -1
"""``max_bytes``/``max_size_mb`` value: the volume's free space less `safety_margin`."""
CACHE_DIR_NAME = "tierfs-cache"
FORMAT_DIR = "v3"
FORMAT_VERSION = 3  # 2: CRC32C instead of zlib's CRC32; 3: one data file per object
MAGIC = b"TFSB"
HEADER = struct.Struct("<4sHHIQQQQI")
DEFAULT_MAX_ENTRIES = 1 << 20
_NAME_HASH_HEX = 32
_TMP_PREFIX = ".tmp-"
_OBJECT = r"[0-9a-f]{32}\.[0-9]{1,20}\.[0-9]{1,20}"
_STEM = re.compile(_OBJECT + r"\.[0-9]{1,20}")
_DATA = re.compile(_OBJECT + r"\.data")
_SEAL_NAME = re.compile(_OBJECT + r"\.seal")
_FANOUT = re.compile(r"[0-9a-f]{2}")
_DIR_MODE = 0o700
_FILE_MODE = 0o600
_U64 = 1 << 64
_PUNCH_HOLE = 0x01 | 0x02  # FALLOC_FL_KEEP_SIZE | FALLOC_FL_PUNCH_HOLE


def safety_margin(total_bytes: int) -> int:
    """Space left free on a volume the cache may fill: 5% of it, at most 1 GiB."""
    return min(total_bytes // 20, GiB)


def capacity_for(root: Path, max_size_mb: int, *, cached_bytes: int = 0) -> int:
    """The SSD tier's capacity in bytes for ``file-cache:max-size-mb``.

    ``0`` disables the cache; ``N > 0`` is N MiB; ``-1`` is the free space (for an
    unprivileged user) of the volume holding ``root`` plus ``cached_bytes`` (what the
    cache already occupies there, since it may keep that space) less
    `safety_margin` of the volume, never below 0. ``root`` need not exist yet: its
    nearest existing ancestor is measured. `SsdTier` given ``max_bytes=AUTO`` does
    this itself after its scan, with the right ``cached_bytes``: prefer that to
    calling this with -1 before the tier exists.
    """
    if max_size_mb == 0:
        return 0
    if max_size_mb > 0:
        return max_size_mb * MiB
    if max_size_mb != AUTO:
        raise ValueError(f"file cache size must be -1, 0 or a number of MiB, not {max_size_mb}")
    st = os.statvfs(_nearest_existing(Path(root)))
    return _auto_capacity(st.f_blocks * st.f_frsize, st.f_bavail * st.f_frsize, cached_bytes)


def _auto_capacity(total_bytes: int, free_bytes: int, cached_bytes: int) -> int:
    return max(0, free_bytes + cached_bytes - safety_margin(total_bytes))


def _nearest_existing(path: Path) -> Path:
    path = path.absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def _name_bytes(name: str) -> bytes:
    return name.encode("utf-8", "surrogatepass")


@functools.lru_cache(maxsize=4096)
def _name_hash(name_bytes: bytes) -> str:
    """Remembered: every read of the tier names its object (a SHA-256 per random read was
    3 % of the daemon's time in QD1 random reads of a cached object)."""
    return hashlib.sha256(name_bytes).hexdigest()[:_NAME_HASH_HEX]


def _round_up(size: int, unit: int) -> int:
    return -(-size // unit) * unit


def _object_of(stem: str) -> str:
    """``h.generation.block_size`` of a record stem ``h.generation.block_size.index``."""
    return stem.rsplit(".", 1)[0]


def _index_of(stem: str) -> int:
    return int(stem.rsplit(".", 1)[1])


# --- blocking helpers: run in worker threads, see only immutable arguments ---------------


_libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
_fallocate = _libc.fallocate
_fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]


def _punch(path: Path, offset: int, length: int) -> None:
    """Give the disk space of a range of ``path`` back; the file keeps its size.

    A volume without hole punching keeps the bytes (no record points at them, so they
    are never served; they only occupy space until the object's file goes)."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return
    try:
        if _fallocate(fd, _PUNCH_HOLE, offset, length) != 0:
            code = ctypes.get_errno()
            if code not in (errno.EOPNOTSUPP, errno.ENOSYS):
                raise OSError(code, os.strerror(code), str(path))
    finally:
        os.close(fd)


def lock_for_life(path: Path) -> int | None:
    """Hold ``path``'s lock for the life of this process: its descriptor, or None if another
    process holds it. A POSIX record lock: the kernel drops it when the process ends (kill
    -9 included), and one process may take it again (the tests' next mounts, in one)."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, _FILE_MODE)
    try:
        fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as err:
        os.close(fd)
        if err.errno not in (errno.EAGAIN, errno.EACCES):
            raise
        return None
    return fd


def _make_dir(path: Path) -> None:
    """Create ``path`` 0700 (whatever the umask); fix the mode of an existing one."""
    try:
        os.mkdir(path, _DIR_MODE)
    except FileExistsError:
        st = os.stat(path, follow_symlinks=False)
        if (st.st_mode & 0o777) == _DIR_MODE:
            return
    os.chmod(path, _DIR_MODE, follow_symlinks=False)


def _unlink(path: Path) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


@dataclass(frozen=True)
class _Drop:
    """Blocks of one object to remove from disk: their records, then their ranges of
    the data file (``punch``), or the whole data file (``punch is None``)."""

    records: tuple[Path, ...]
    data: Path
    seal: Path
    punch: tuple[tuple[int, int], ...] | None


def _apply_drops(drops: list[_Drop]) -> list[tuple[Path, OSError]]:
    """Carry out ``drops``; return what could not be deleted (the rest is done anyway)."""
    failures = []
    for drop in drops:
        targets: list[tuple[Path, int, int] | Path] = [*drop.records, drop.seal]
        if drop.punch is None:
            targets.append(drop.data)
        else:
            targets.extend((drop.data, offset, length) for offset, length in drop.punch)
        for target in targets:
            try:
                if isinstance(target, tuple):
                    _punch(*target)
                else:
                    _unlink(target)
            except OSError as exc:
                failures.append((target[0] if isinstance(target, tuple) else target, exc))
    return failures


def write_all(fd: int, data: bytes | memoryview, offset: int | None = None) -> None:
    """All of ``data`` at ``offset`` (None: the file position): a short write goes on."""
    view = memoryview(data)
    while view:
        if offset is None:
            done = os.write(fd, view)
        else:
            done = os.pwrite(fd, view, offset)
            offset += done
        view = view[done:]


def _header(
    name: bytes,
    generation: int,
    index: int,
    block_size: int,
    data: bytes | memoryview,
    *,
    magic: bytes = MAGIC,
    version: int = FORMAT_VERSION,
) -> bytes:
    """A block's record: the header (its CRC32C of ``data`` included), then the object
    name. The shared tier writes the same header under its own magic and version."""
    fields = HEADER.pack(
        magic,
        version,
        0,
        len(name),
        generation,
        index,
        block_size,
        len(data),
        crc32c_of(data),  # (google_crc32c takes no memoryview: a block buffer's)
    )
    return fields + name


def _publish(path: Path, content: bytes) -> None:
    """Write a small file under a temporary name in its final directory, then rename."""
    tmp = path.with_name(f"{_TMP_PREFIX}{path.name}-{secrets.token_hex(4)}")
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(tmp, flags, _FILE_MODE)
    try:
        try:
            os.fchmod(fd, _FILE_MODE)
            write_all(fd, content)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            _unlink(tmp)
        raise


def _write_block(
    record: Path,
    data_path: Path,
    header: Callable[[], bytes],
    data: bytes | memoryview,
    offset: int,
    drops: list[_Drop],
) -> list[tuple[Path, OSError]]:
    """Carry out ``drops``, write one block's payload into its object's data file, then
    publish its record (``header()``: made here, in the worker thread, because its CRC32C
    of the payload on the event loop held up the FUSE requests behind it) atomically;
    return failed deletes.

    Raises OSError (ENOSPC...): the record is then not published (a partial payload in
    the data file is never served, and goes with the file)."""
    failures = _apply_drops(drops)
    _make_dir(record.parent)
    write_payload(data_path, data, offset, _FILE_MODE)  # past the page cache (ssd_direct)
    _publish(record, header())
    return failures


_OK = "ok"
_MISSING = "missing"


def _pread_exact(fd: int, length: int, offset: int) -> bytes:
    data = os.pread(fd, length, offset)
    if len(data) == length or not data:
        return data
    parts = [data]
    got = len(data)
    while got < length:
        part = os.pread(fd, length - got, offset + got)
        if not part:
            break
        parts.append(part)
        got += len(part)
    return b"".join(parts)


def _read_payload(fd: int, length: int, offset: int) -> bytes:
    """``length`` bytes at ``offset`` (fewer at end of file) with one ``pread`` into one new
    bytes object, after asking the kernel to read the whole range ahead.

    Why this shape: the daemon serving SSD hits was CPU-bound in the kernel (85 % sys),
    mostly faulting in and zeroing fresh buffers: reading into a zeroed ``bytearray`` and
    copying it into ``bytes`` touched 16 MiB of new memory per 8 MiB block. ``pread``
    allocates the result once, uninitialised. ``POSIX_FADV_WILLNEED`` first queues the
    block's disk reads all at once, so the single ``pread`` does not wait for the
    kernel's small sequential read-ahead windows one after another."""
    with contextlib.suppress(OSError):
        os.posix_fadvise(fd, offset, length, os.POSIX_FADV_WILLNEED)
    return _pread_exact(fd, length, offset)


def _read_part(data_path: Path, offset: int, length: int) -> bytes | None:
    """``length`` bytes at ``offset`` of an object's data file (fewer at its end), or None
    when the file is not there or not ours."""
    fd = _open_ours(data_path)
    if isinstance(fd, str):
        return None
    try:
        return _pread_exact(fd, length, offset)
    finally:
        os.close(fd)


def _open_ours(path: Path) -> int | str:
    """A read-only descriptor of our regular file at ``path``, or why not."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return _MISSING
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            return "not a regular file"
        raise
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        return "not a regular file"
    return fd


def _check_header(
    head: bytes,
    name: bytes,
    generation: int,
    index: int,
    block_size: int,
    *,
    magic: bytes = MAGIC,
    version: int = FORMAT_VERSION,
    what: str = "record",
) -> tuple[str, int, int]:
    """(problem or "", payload length, CRC32C) of a header `_header` wrote, checked
    against the key it must be for (the SSD tier's records, the shared tier's files)."""
    got_magic, got_version, reserved, name_len, gen, idx, bsize, length, crc = HEADER.unpack_from(
        head
    )
    if got_magic != magic or got_version != version or reserved != 0:
        return "bad magic or version", 0, 0
    if (name_len, gen, idx, bsize) != (len(name), generation, index, block_size):
        return f"{what} does not match the key", 0, 0
    if head[HEADER.size :] != name:
        return f"{what} names another object", 0, 0
    if length > block_size:
        return f"{what} says {length} bytes, more than a block", 0, 0
    return "", length, crc


def _read_block(
    record: Path, data_path: Path, name: bytes, generation: int, index: int, block_size: int
) -> tuple[str, bytes]:
    """(``"ok"``, payload), (``"missing"``, b"") or (reason it is damaged, b"")."""
    fd = _open_ours(record)
    if isinstance(fd, str):
        return fd, b""
    try:
        size = os.fstat(fd).st_size
        head_size = HEADER.size + len(name)
        head = _pread_exact(fd, head_size, 0)
        if len(head) < head_size:
            return f"short record ({size} bytes)", b""
        problem, length, crc = _check_header(head, name, generation, index, block_size)
        if problem:
            return problem, b""
        if size != head_size:
            return f"wrong length ({size} bytes on disk, record of {head_size})", b""
        data_fd = _open_ours(data_path)
        if isinstance(data_fd, str):
            return f"data file {'missing' if data_fd == _MISSING else data_fd}", b""
        try:
            payload = _read_payload(data_fd, length, index * block_size)
        finally:
            os.close(data_fd)
        if len(payload) != length:
            return "short payload", b""
        if crc32c_of(payload) != crc:
            return "CRC32C mismatch", b""
        with contextlib.suppress(OSError):
            os.utime(fd)  # recency across restarts is best effort
        return _OK, payload
    finally:
        os.close(fd)
