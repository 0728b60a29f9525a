"""Write-back: close() returns once a file is committed locally; GCS gets it later.

With ``write:write-back`` on, a file being written is staged in a *named* file of
this journal directory instead of an anonymous temp file. close() (FUSE flush and
release) then only *commits* it: a small JSON record saying which object it
becomes (name, the generation it replaces, its metadata, its size) is written next
to it, atomically (temp file, rename). fsync does the same durably: the data file
is fdatasync'd, the record fsync'd before its rename and the directory after. A
background uploader makes it durable in GCS and deletes the record.

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

A directory rename is journaled too (``moves/``, see `tierfs.dirmove`) and
finished after the uploads.

Data files without a record were never committed (their close() had not
returned): they are deleted. Layout::

    <dir>/tierfs-writeback/<sha256(bucket)[:16]>/<id>.data   the staged bytes
    <dir>/tierfs-writeback/<sha256(bucket)[:16]>/<id>.json   the record
    <dir>/tierfs-writeback/<sha256(bucket)[:16]>/conflicts/  kept, never uploaded
    <dir>/tierfs-writeback/<sha256(bucket)[:16]>/moves/      directory renames under way

Files are 0600 and directories 0700: they hold the user's data.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import logging
import os
import secrets
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import google_crc32c

from tierfs.dirmove import Move, recover_moves
from tierfs.errors import NotFound, PreconditionFailed
from tierfs.storage import Bucket, ObjectInfo

log = logging.getLogger("tierfs.writeback")

_FILE_MODE = 0o600
_DIR_MODE = 0o700
_CHUNK = 8 << 20


@dataclass
class Record:
    """One committed file waiting for its upload."""

    id: str
    object: str
    base_generation: int
    metadata: dict[str, str] = field(default_factory=dict)
    content_type: str | None = None
    size: int = -1  # the data file's size when committed (-1: not recorded)


@dataclass
class Recovery:
    """What `Journal.recover` did, for the log and the tests."""

    uploaded: list[str] = field(default_factory=list)
    already_there: list[str] = field(default_factory=list)
    conflicts: list[Path] = field(default_factory=list)
    failed: list[tuple[str, str]] = field(default_factory=list)
    uncommitted: int = 0
    moves: list[Move] = field(default_factory=list)  # directory renames finished


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_record(final: Path, body: dict[str, object], *, durable: bool = True) -> None:
    """A JSON record that is either wholly there or absent after a crash: temp file,
    rename; with ``durable``, fsync'd before the rename and the directory after it."""
    tmp = final.with_name(final.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, _FILE_MODE)
    try:
        os.write(fd, json.dumps(body, sort_keys=True).encode("utf-8"))
        if durable:
            os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, final)
    if durable:
        _fsync_dir(final.parent)


def file_crc32c(path: Path | str) -> str:
    """Base64 CRC32C of a file, as GCS reports ``crc32c``."""
    checksum = google_crc32c.Checksum()
    with open(path, "rb") as handle:
        while chunk := handle.read(_CHUNK):
            checksum.update(chunk)
    return base64.b64encode(checksum.digest()).decode()


class MoveLog:
    """The journaled directory renames of one write-back journal (`tierfs.dirmove`).
    Blocking methods: call them from a thread."""

    def __init__(self, journal_dir: Path) -> None:
        self.dir = journal_dir / "moves"
        self.dir.mkdir(mode=_DIR_MODE, exist_ok=True)

    def begin(self, source: str, destination: str) -> Move:
        """Durably record a move before any of it happens."""
        move = Move(f"{time.time_ns():020d}-{secrets.token_hex(4)}", source, destination)
        _write_record(self.dir / f"{move.id}.json", asdict(move))
        return move

    def end(self, move: Move) -> None:
        (self.dir / f"{move.id}.json").unlink(missing_ok=True)

    def pending(self) -> list[Move]:
        """Unfinished moves, oldest first (the ids sort by the time they were made)."""
        moves = []
        for leftover in self.dir.glob("*.json.tmp"):
            leftover.unlink(missing_ok=True)  # never made durable: that rename never began
        for path in sorted(self.dir.glob("*.json")):
            try:
                moves.append(Move(**json.loads(path.read_text(encoding="utf-8"))))
            except (ValueError, TypeError) as err:
                log.error("write-back journal: unreadable rename record %s (%s); kept", path, err)
        return moves


class Journal:
    """The write-back directory of one bucket. Blocking methods: call them from a thread."""

    def __init__(self, root: Path, bucket: str) -> None:
        digest = hashlib.sha256(bucket.encode("utf-8")).hexdigest()[:16]
        self.dir = Path(root) / "tierfs-writeback" / digest
        self.conflicts_dir = self.dir / "conflicts"
        Path(root).mkdir(mode=_DIR_MODE, parents=True, exist_ok=True)
        for directory in (self.dir.parent, self.dir, self.conflicts_dir):
            directory.mkdir(mode=_DIR_MODE, exist_ok=True)
            os.chmod(directory, _DIR_MODE)
        self.moves = MoveLog(self.dir)

    def data_path(self, record_id: str) -> Path:
        return self.dir / f"{record_id}.data"

    def record_path(self, record_id: str) -> Path:
        return self.dir / f"{record_id}.json"

    def new_file(self) -> tuple[str, int]:
        """A new empty data file: (id, fd opened read-write)."""
        while True:
            record_id = secrets.token_hex(8)
            flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
            try:
                fd = os.open(self.data_path(record_id), flags, _FILE_MODE)
            except FileExistsError:
                continue
            return record_id, fd

    def commit(self, fd: int, record: Record, *, durable: bool = True) -> None:
        """Write the record naming the data file: after this returns, a daemon crash loses
        nothing (the next mount uploads it). ``durable`` (fsync): the data, then the
        record, reach the disk first, so a machine crash loses nothing either."""
        if durable:
            os.fdatasync(fd)
        self.write_record(record, durable=durable)

    def write_record(self, record: Record, *, durable: bool = True) -> None:
        _write_record(self.record_path(record.id), asdict(record), durable=durable)

    def done(self, record_id: str) -> None:
        """The upload of this record is in GCS: drop the record (the data file stays while
        the staged file is open; `discard` removes it)."""
        with contextlib.suppress(FileNotFoundError):
            self.record_path(record_id).unlink()

    def discard(self, record_id: str) -> None:
        """Remove a record and its data (uploaded and closed, or unlinked before upload)."""
        self.done(record_id)
        with contextlib.suppress(FileNotFoundError):
            self.data_path(record_id).unlink()

    def pending(self) -> list[Record]:
        """Every committed record, oldest first; uncommitted leftovers are deleted."""
        records: list[tuple[float, Record]] = []
        for path in self.dir.iterdir():
            if path.name.endswith(".json.tmp"):
                path.unlink(missing_ok=True)
            elif path.suffix == ".json":
                try:
                    raw = json.loads(path.read_text(encoding="utf-8"))
                    record = Record(**raw)
                except (ValueError, TypeError) as err:
                    log.error("write-back journal: unreadable record %s (%s); kept", path, err)
                    continue
                records.append((path.stat().st_mtime, record))
        return [r for _, r in sorted(records, key=lambda item: item[0])]

    def uncommitted(self) -> list[Path]:
        """Data files no record names: writes whose close() never returned."""
        named = {p.stem for p in self.dir.glob("*.json")}
        return [p for p in self.dir.glob("*.data") if p.stem not in named]

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
        run: Callable[..., Awaitable[object]],
    ) -> Recovery:
        """Finish what a previous daemon committed but did not upload (see the module
        docstring). ``run`` runs a blocking function in a thread (trio.to_thread.run_sync)."""
        result = Recovery()
        for path in await run(self.uncommitted):
            await run(path.unlink, True)
            result.uncommitted += 1
        for record in await run(self.pending):
            try:
                outcome = await self._recover_one(bucket, run, record)
            except Exception as err:  # GCS down: keep the record for the next mount
                result.failed.append((record.object, str(err)))
                log.error("write-back: gs://%s still not uploaded: %s", record.object, err)
                continue
            if outcome == "uploaded":
                result.uploaded.append(record.object)
            elif outcome == "already":
                result.already_there.append(record.object)
            elif outcome == "short":
                kept = await run(self.keep_conflict, record)
                result.conflicts.append(kept)
                log.error(
                    "write-back: gs://%s was closed but not fsync'd when the machine went "
                    "down, and its data did not all reach the disk; what did is kept in %s, "
                    "not uploaded",
                    record.object,
                    kept,
                )
            else:
                kept = await run(self.keep_conflict, record)
                result.conflicts.append(kept)
                log.error(
                    "write-back: gs://%s changed in GCS since this file was written; "
                    "the local copy is kept in %s, not uploaded",
                    record.object,
                    kept,
                )
        # After the uploads: a file committed under a directory's old name moves with it.
        result.moves = await recover_moves(bucket, self.moves)
        return result

    async def _recover_one(
        self, bucket: Bucket, run: Callable[..., Awaitable[object]], record: Record
    ) -> str:
        data = self.data_path(record.id)
        if record.size >= 0 and (await run(os.stat, data)).st_size != record.size:  # type: ignore[attr-defined]
            return "short"
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
