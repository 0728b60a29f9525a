"""Write-back: close() returns once a file is committed locally; GCS gets it later.

With ``write:write-back`` on, a file being written is staged in a *named* file of
this journal directory instead of an anonymous temp file. close() (FUSE flush and
release) then only *commits* it: a small JSON record saying which object it
becomes (name, the generation it replaces, its metadata, its size) is attached to
it, atomically. fsync does the same durably: the data file, its record with it, is
fsync'd, then the directory. A background uploader makes it durable in GCS and
drops the record.

Where the record lives: in an extended attribute of the data file
(``user.tierfs.record``) where the journal's file system has them (ext4, xfs, btrfs,
tmpfs from Linux 6.6), else in a file beside it (``<id>.json``, written to a temp
name and renamed). The attribute is one ``fsetxattr`` on the open descriptor, which
replaces the value whole or not at all: a commit creates no second inode and needs
no thread, and the save of many small files it ends is bound by the kernel's round
trips, not by the journal (`Journal.inline`). A record too large for an attribute
goes to a file; recovery reads both.

What survives what: a daemon crash (kill -9) loses nothing whose close returned
(the kernel's page cache holds it); a machine crash loses nothing whose fsync
returned, as on a local disk. A record that reached the disk without all of its
data (closed, not fsync'd, then the power went) is caught by its size and kept
aside, never uploaded.

Why a record per file and not one log: a commit, an upload and a rename of one
file touch only that file's record, with no compaction and no lock shared by
unrelated files. The data file is the staged file itself, so a commit never copies
data, and a durable one costs one fdatasync of data the kernel mostly holds already.

Crash safety (kill -9 of the daemon, or the machine): the next mount with the same
journal directory (``cache-dir``, else ``temp-dir``) runs `Journal.recover` before
it serves anything. For each record it looks at the object in GCS:

- still the generation the file was written against (or absent, for a new file):
  upload it, with that generation as the precondition;
- already holding exactly these bytes (same size and CRC32C): the upload finished
  before the crash, only the record survived: nothing to do (nothing is uploaded
  twice);
- a data file shorter or longer than its record says: kept aside as below;
- anything else (another client wrote or deleted it since): the data is moved to
  ``conflicts/`` in the journal directory and an ERROR names it. It is never
  uploaded over the other client's object, and never thrown away.

A directory rename is journaled too (``moves/``, see `tierfs.core.dirmove`), and so is an
unlink (``deletes/``, see `tierfs.core.deletes`): both are finished after the uploads.

Data files without a record were never committed (their close() had not
returned): they are deleted. Layout::

    <dir>/tierfs-writeback/<sha256(bucket)[:16]>/<id>.data   the staged bytes (and the
                                                             record, as an attribute)
    <dir>/tierfs-writeback/<sha256(bucket)[:16]>/<id>.json   the record, where no attribute
    <dir>/tierfs-writeback/<sha256(bucket)[:16]>/conflicts/  kept, never uploaded
    <dir>/tierfs-writeback/<sha256(bucket)[:16]>/moves/      directory renames under way
    <dir>/tierfs-writeback/<sha256(bucket)[:16]>/deletes/    unlinks whose GCS delete runs
    <dir>/tierfs-writeback/<sha256(bucket)[:16]>/journal.lock held by the daemon using it

(with an ``only-dir``, the hash is of ``bucket/only-dir``).

Files are 0600 and directories 0700: they hold the user's data.
"""

from __future__ import annotations

import base64
import contextlib
import errno
import hashlib
import json
import logging
import os
import secrets
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import google_crc32c

from tierfs.cache.ssd_format import lock_for_life
from tierfs.core.deletes import Delete, recover_deletes
from tierfs.core.dirmove import Move, recover_moves
from tierfs.core.records import _DIR_MODE, _FILE_MODE, DeleteLog, MoveLog, _fsync_dir, _write_record
from tierfs.errors import BackendError, NotFound, PreconditionFailed, UploadedOtherBytes
from tierfs.storage import Bucket, ObjectInfo

log = logging.getLogger("tierfs.writeback")

_CHUNK = 8 << 20
RECORD_XATTR = "user.tierfs.record"
SPARE_FILES = 32  # empty data files made ahead by a thread, so create() need not wait
# setxattr errors that mean "no attribute here" (this file system, or this record's size):
# the record goes to a file instead.
_NO_XATTR = {errno.ENOTSUP, errno.EOPNOTSUPP, errno.EPERM, errno.E2BIG, errno.ERANGE}


@dataclass
class Record:
    """One committed file waiting for its upload."""

    id: str
    object: str
    base_generation: int
    metadata: dict[str, str] = field(default_factory=dict)
    content_type: str | None = None
    size: int = -1  # the data file's size when committed (-1: not recorded)
    # The data file's mtime when committed (0: not recorded): one that differs at recovery
    # was written again after its close (reopened, or written after an fsync) by a writer
    # the daemon stopped under: neither version is whole, and none is uploaded.
    mtime_ns: int = 0


@dataclass
class Recovery:
    """What `Journal.recover` did, for the log and the tests."""

    uploaded: list[str] = field(default_factory=list)
    already_there: list[str] = field(default_factory=list)
    conflicts: list[Path] = field(default_factory=list)
    failed: list[tuple[str, str]] = field(default_factory=list)
    uncommitted: int = 0
    moves: list[Move] = field(default_factory=list)  # directory renames finished
    deletes: list[Delete] = field(default_factory=list)  # unlinks whose GCS delete it did


_UNREADABLE = Record("", "", 0)  # a record that is there but cannot be parsed


def _encode(record: Record) -> bytes:
    return json.dumps(vars(record), sort_keys=True).encode("utf-8")  # (asdict deep-copies)


# Why a record's file is kept aside at recovery (`Journal._recover_one`'s outcome).
_KEPT_BECAUSE = {
    "changed": "write-back: gs://%s was written again after its close (opened for writing, "
    "or written after an fsync) and the daemon stopped before the next close: it holds "
    "neither version whole; kept in %s, not uploaded",
    "short": "write-back: gs://%s does not hold what its close committed (closed but not "
    "fsync'd when the machine went down, or resized by a writer the daemon stopped under); "
    "what it holds is kept in %s, not uploaded",
    "conflict": "write-back: gs://%s changed in GCS since this file was written; the local "
    "copy is kept in %s, not uploaded",
}


def _decode(raw: bytes | str) -> Record:
    return Record(**json.loads(raw))


def xattrs_work(directory: Path) -> bool:
    """Whether files in ``directory`` take a user extended attribute (probed on a
    scratch file: the answer depends on the file system and, for tmpfs, the kernel)."""
    probe = directory / f".probe-{secrets.token_hex(4)}"
    try:
        fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, _FILE_MODE)
    except OSError:
        return False
    try:
        os.setxattr(fd, RECORD_XATTR, b"{}")
        return True
    except OSError:
        return False
    finally:
        os.close(fd)
        probe.unlink(missing_ok=True)


def file_crc32c(path: Path | str) -> str:
    """Base64 CRC32C of a file, as GCS reports ``crc32c``."""
    checksum = google_crc32c.Checksum()
    with open(path, "rb") as handle:
        while chunk := handle.read(_CHUNK):
            checksum.update(chunk)
    return base64.b64encode(checksum.digest()).decode()


class JournalInUse(OSError):
    """Another live daemon has this journal: the second one's recovery would take the
    first one's files for leftovers of a crash (its spares, files still being written)."""


def _lock(path: Path, bucket: str, only_dir: str) -> int:
    """Hold the journal's lock for the life of this process (`lock_for_life`: a process may
    open the journal again, as the tests' next mounts do); `JournalInUse` if another
    holds it."""
    fd = lock_for_life(path)
    if fd is None:
        where = f"gs://{bucket}/{only_dir}" if only_dir else f"gs://{bucket}"
        raise JournalInUse(
            errno.EBUSY,
            f"another tierfs mount of {where} uses this write-back journal "
            "(one mount per bucket and only-dir on a cache-dir)",
        )
    return fd


class Journal:
    """The write-back directory of one bucket. Blocking methods: call them from a thread
    (but `commit` of a non-durable record where `inline`)."""

    def __init__(
        self,
        root: Path,
        bucket: str,
        *,
        only_dir: str = "",
        xattrs: bool | None = None,
        lock: bool = True,
    ) -> None:
        """``lock`` False: to look only, while a daemon may hold the journal."""
        key = f"{bucket}/{only_dir}" if only_dir else bucket  # (a bucket alone: as before)
        digest = hashlib.sha256(key.encode("utf-8")).hexdigest()[:16]
        self.dir = Path(root) / "tierfs-writeback" / digest
        self.conflicts_dir = self.dir / "conflicts"
        Path(root).mkdir(mode=_DIR_MODE, parents=True, exist_ok=True)
        for directory in (self.dir.parent, self.dir, self.conflicts_dir):
            directory.mkdir(mode=_DIR_MODE, exist_ok=True)
            os.chmod(directory, _DIR_MODE)
        self._lock_fd = _lock(self.dir / "journal.lock", bucket, only_dir) if lock else -1
        self.moves = MoveLog(self.dir)
        self.deletes = DeleteLog(self.dir)
        # Records as attributes of their data files (None: wherever the file system can).
        self.xattrs = xattrs_work(self.dir) if xattrs is None else xattrs
        self._spares: list[tuple[str, int]] = []  # (id, fd) of empty data files
        self._in_files: set[str] = set()  # ids whose record did not fit an attribute
        self._making: set[str] = set()  # ids of spares a thread is creating
        log.debug(
            "write-back journal %s: records %s",
            self.dir,
            "as extended attributes" if self.xattrs else "in files",
        )

    @property
    def inline(self) -> bool:
        """A commit without fsync is one ``fsetxattr``: cheaper than a thread's round trip,
        so the event loop makes it itself."""
        return self.xattrs

    def data_path(self, record_id: str) -> Path:
        return self.dir / f"{record_id}.data"

    def record_path(self, record_id: str) -> Path:
        return self.dir / f"{record_id}.json"

    def new_file(self) -> tuple[str, int]:
        """A new empty data file: (id, fd opened read-write). A spare one if there is one
        (`make_spares`): creating a file costs a local disk from 10 us to ~1 ms, and a
        create() should not wait for it."""
        try:
            return self._spares.pop()
        except IndexError:
            return self._create()

    @property
    def spares(self) -> int:
        return len(self._spares)

    def spare_paths(self) -> set[Path]:
        """The spare data files, made or being made."""
        ids = {record_id for record_id, _ in list(self._spares)} | set(self._making)
        return {self.data_path(record_id) for record_id in ids}

    def make_spares(self, count: int) -> None:
        """Create empty data files until ``count`` wait (blocking: from a thread, while the
        event loop takes them). Left over after a crash, they are uncommitted files, which
        the next mount deletes."""
        while len(self._spares) < count:
            record_id = secrets.token_hex(8)
            self._making.add(record_id)  # (so a spare is never on disk yet unknown)
            try:
                self._spares.append((record_id, self._open_new(record_id)))
            except FileExistsError:
                continue
            finally:
                self._making.discard(record_id)

    def drop_spares(self) -> None:
        while self._spares:
            record_id, fd = self._spares.pop()
            os.close(fd)
            self.data_path(record_id).unlink(missing_ok=True)

    def _create(self) -> tuple[str, int]:
        while True:
            record_id = secrets.token_hex(8)
            try:
                return record_id, self._open_new(record_id)
            except FileExistsError:
                continue

    def _open_new(self, record_id: str) -> int:
        flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        return os.open(self.data_path(record_id), flags, _FILE_MODE)

    def commit(self, fd: int, record: Record, *, durable: bool = True) -> None:
        """Attach the record naming the data file: after this returns, a daemon crash loses
        nothing (the next mount uploads it). ``durable`` (fsync): the data and the record
        reach the disk first, so a machine crash loses nothing either."""
        record = replace(record, mtime_ns=os.fstat(fd).st_mtime_ns)
        if self.xattrs and self._attach(fd, record):
            if durable:
                os.fsync(fd)  # the data, its size and the attribute: all of the inode
                _fsync_dir(self.dir)  # and the data file's name
            return
        if durable:
            os.fdatasync(fd)
        _write_record(self.record_path(record.id), asdict(record), durable=durable)

    def write_record(self, record: Record, *, durable: bool = True) -> None:
        """Replace a committed record (a rename gave its file a new object name)."""
        if self.xattrs:
            try:
                fd = os.open(self.data_path(record.id), os.O_RDONLY | os.O_CLOEXEC)
            except FileNotFoundError:
                pass  # uploaded and discarded meanwhile: nothing to point elsewhere
            else:
                try:
                    self.commit(fd, record, durable=durable)
                finally:
                    os.close(fd)
                return
        _write_record(self.record_path(record.id), asdict(record), durable=durable)

    def _attach(self, fd: int, record: Record) -> bool:
        """The record as the data file's attribute; False where it does not fit (a file
        then holds it). One record each: an attribute left by an earlier commit goes when
        this one does not fit (`_scan` prefers an attribute), a record file left by one
        goes when this one fits."""
        try:
            os.setxattr(fd, RECORD_XATTR, _encode(record))
        except OSError as err:
            if err.errno not in _NO_XATTR:
                raise
            with contextlib.suppress(OSError):  # (ENODATA: there was none)
                os.removexattr(fd, RECORD_XATTR)
            self._in_files.add(record.id)
            return False
        if record.id in self._in_files:
            self._in_files.discard(record.id)
            self.record_path(record.id).unlink(missing_ok=True)
        return True

    def done(self, record_id: str) -> None:
        """The upload of this record is in GCS: drop the record (the data file stays while
        the staged file is open; `discard` removes it)."""
        if self.xattrs:
            with contextlib.suppress(FileNotFoundError, OSError):
                os.removexattr(self.data_path(record_id), RECORD_XATTR)
        with contextlib.suppress(FileNotFoundError):
            self.record_path(record_id).unlink()

    def discard(self, record_id: str) -> None:
        """Remove a record and its data (uploaded and closed, or unlinked before upload)."""
        with contextlib.suppress(FileNotFoundError):
            self.data_path(record_id).unlink()  # an attribute goes with its file
        with contextlib.suppress(FileNotFoundError):
            self.record_path(record_id).unlink()

    def pending(self) -> list[Record]:
        """Every committed record, oldest first; uncommitted leftovers are deleted."""
        return self._scan()[0]

    def uncommitted(self) -> list[Path]:
        """Data files no record names: writes whose close() never returned."""
        return self._scan()[1]

    def _scan(self) -> tuple[list[Record], list[Path]]:
        """(records oldest first, data files without one). A record is a data file's
        attribute or an ``<id>.json`` beside it; a half-written ``.json.tmp`` never was."""
        found: dict[str, tuple[float, Record]] = {}
        unreadable: set[str] = set()  # kept: neither uploaded nor deleted
        data: list[Path] = []
        for path in self.dir.iterdir():
            if path.name.endswith(".json.tmp"):
                path.unlink(missing_ok=True)
                continue
            if path.suffix == ".json":
                record = self._read(path, lambda p: p.read_bytes())
            elif path.suffix == ".data":
                data.append(path)
                record = self._read(path, lambda p: os.getxattr(p, RECORD_XATTR))
            else:
                continue
            if record is _UNREADABLE:
                unreadable.add(path.stem)
            elif record is not None and (path.suffix == ".data" or record.id not in found):
                found[record.id] = (path.stat().st_mtime, record)  # an attribute wins
        records = [r for _, r in sorted(found.values(), key=lambda item: item[0])]
        return records, [p for p in data if p.stem not in found and p.stem not in unreadable]

    @staticmethod
    def _read(path: Path, raw: Callable[[Path], bytes]) -> Record | None:
        try:
            return _decode(raw(path))
        except FileNotFoundError:
            return None
        except OSError as err:
            if err.errno in (errno.ENODATA, *_NO_XATTR):
                return None  # no attribute: not committed (or its record is a file)
            raise
        except (ValueError, TypeError) as err:
            log.error("write-back journal: unreadable record of %s (%s); kept", path, err)
            return _UNREADABLE

    def keep_conflict(self, record: Record) -> Path:
        """Move a record's data aside for the user (never uploaded, never deleted)."""
        safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in record.object)[-100:]
        target = self.conflicts_dir / f"{safe}.{record.id}"
        os.replace(self.data_path(record.id), target)
        self.done(record.id)
        _fsync_dir(self.conflicts_dir)
        return target

    async def recover(
        self,
        bucket: Bucket,
        run: Callable[..., Awaitable[Any]],
    ) -> Recovery:
        """Finish what a previous daemon committed but did not upload (see the module
        docstring). ``run`` runs a blocking function in a thread (trio.to_thread.run_sync)."""
        result = Recovery()
        for path in await run(self.uncommitted):
            await run(path.unlink, True)
            result.uncommitted += 1
        down: BackendError | None = None
        for record in await run(self.pending):
            if down is not None:  # one upload used up its retries: GCS is down, not it
                result.failed.append((record.object, f"not tried: {down}"))
                continue
            try:
                outcome = await self._recover_one(bucket, run, record)
            except FileNotFoundError:
                # Its data file went and its record stayed (a discard cut between its two
                # unlinks, with records in files): uploaded or unlinked before. Counted as
                # failed, it held back every later mount's renames and deletes of it.
                await run(self.discard, record.id)
                log.warning("write-back: a record of gs://%s had no data; dropped", record.object)
                continue
            except Exception as err:  # GCS down: keep the record for the next mount
                result.failed.append((record.object, str(err)))
                log.error("write-back: gs://%s still not uploaded: %s", record.object, err)
                if isinstance(err, BackendError) and not isinstance(err, UploadedOtherBytes):
                    down = err  # (each further record would wait its own retry deadline)
                continue
            if outcome == "uploaded":
                result.uploaded.append(record.object)
            elif outcome == "already":
                result.already_there.append(record.object)
            else:  # kept aside for the user, never uploaded
                kept = await run(self.keep_conflict, record)
                result.conflicts.append(kept)
                log.error(_KEPT_BECAUSE[outcome], record.object, kept)
        # After the uploads: a file committed under a directory's old name moves with it.
        # Not the renames and deletes of a file whose upload failed: they wait with it.
        held = frozenset(name for name, _ in result.failed)
        ours = frozenset(result.uploaded) | frozenset(result.already_there)
        result.moves = await recover_moves(bucket, self.moves, held, ours)
        result.deletes = await recover_deletes(bucket, self.deletes, held)
        return result

    async def _recover_one(
        self, bucket: Bucket, run: Callable[..., Awaitable[object]], record: Record
    ) -> str:
        data = self.data_path(record.id)
        status: os.stat_result = await run(os.stat, data)  # type: ignore[assignment]
        if record.size >= 0 and status.st_size != record.size:
            return "short"
        if record.mtime_ns and status.st_mtime_ns != record.mtime_ns:
            return "changed"
        current: ObjectInfo | None
        try:
            current = await bucket.stat(record.object)
        except NotFound:
            current = None
        live = current.generation if current is not None else 0
        if live == record.base_generation:
            try:
                await bucket.write_file(
                    record.object,
                    str(data),
                    if_generation_match=record.base_generation,
                    metadata=record.metadata,
                    content_type=record.content_type,
                )
            except PreconditionFailed:
                return "conflict"
            await run(self.discard, record.id)
            return "uploaded"
        if current is not None:
            size = (await run(os.stat, data)).st_size  # type: ignore[attr-defined]
            if size == current.size and await run(file_crc32c, data) == current.crc32c:
                await run(self.discard, record.id)
                return "already"
        return "conflict"
