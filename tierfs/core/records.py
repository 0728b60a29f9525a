"""Records of the write-back journal that must survive a crash whole or not at all.

A record is a small JSON file written to a temporary name and renamed into place; with
``durable`` it is fsync'd before the rename and its directory after, so after a crash
it is either wholly there or absent, never half-written. Directory renames
(``moves/``) and GCS deletes (``deletes/``) each keep a directory of such records, one
per operation under way, read back at the next mount to finish them
(`tierfs.core.dirmove`, `tierfs.core.deletes`). Blocking: call from a thread.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Generic, TypeVar

from tierfs.core.deletes import Delete
from tierfs.core.dirmove import Move

log = logging.getLogger("tierfs.writeback")

_FILE_MODE = 0o600
LISTED = ".listed"  # beside a move's record: the objects its first listing found
_DIR_MODE = 0o700
R = TypeVar("R")


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


class _RecordLog(Generic[R]):
    """A directory of JSON records, one per operation under way, named by an id that sorts
    by time (renames in ``moves/``, deletes in ``deletes/``). Blocking methods: call them
    from a thread."""

    def __init__(self, journal_dir: Path, name: str, load: Callable[..., R]) -> None:
        self.dir = journal_dir / name
        self.dir.mkdir(mode=_DIR_MODE, exist_ok=True)
        self._load = load

    def _write(self, record_id: str, body: dict[str, object], *, durable: bool) -> None:
        _write_record(self.dir / f"{record_id}.json", body, durable=durable)

    def _end(self, record_id: str, *, durable: bool = False) -> None:
        (self.dir / f"{record_id}.json").unlink(missing_ok=True)
        if durable:
            _fsync_dir(self.dir)

    def pending(self) -> list[R]:
        """Unfinished operations, oldest first; an unreadable record is kept and said."""
        found = []
        for leftover in self.dir.glob("*.json.tmp"):
            leftover.unlink(missing_ok=True)  # never written whole: never promised
        for path in sorted(self.dir.glob("*.json")):
            try:
                found.append(self._load(**json.loads(path.read_text(encoding="utf-8"))))
            except (ValueError, TypeError) as err:
                log.error("write-back journal: unreadable record %s (%s); kept", path, err)
        return found


class MoveLog(_RecordLog[Move]):
    """The journaled directory renames (`tierfs.core.dirmove`)."""

    def __init__(self, journal_dir: Path) -> None:
        super().__init__(journal_dir, "moves", Move)

    def begin(self, source: str, destination: str, *, file: bool = False) -> Move:
        """Durably record a move before any of it happens."""
        move = Move(f"{time.time_ns():020d}-{secrets.token_hex(4)}", source, destination, file)
        self._write(move.id, asdict(move), durable=True)
        return move

    def listed(self, move: Move, objects: dict[str, int]) -> None:
        """The objects (name: generation) a directory move's first listing found: the ones
        it moves, and all a replay moves (`tierfs.core.dirmove.recover_moves`), not one
        another client wrote under the old name since. Beside the record, not fsync'd: a
        machine crash that loses it leaves the replay to judge by time (`Move.covers`)."""
        _write_record(self.dir / f"{move.id}{LISTED}", {"objects": objects}, durable=False)

    def listing(self, move: Move) -> dict[str, int] | None:
        """What `listed` recorded for ``move``; None if nothing (or nothing readable)."""
        try:
            body = json.loads((self.dir / f"{move.id}{LISTED}").read_text(encoding="utf-8"))
            return {str(name): int(generation) for name, generation in body["objects"].items()}
        except FileNotFoundError:
            return None
        except (ValueError, TypeError, KeyError, AttributeError) as err:
            log.warning("write-back journal: unreadable listing of move %s (%s)", move.id, err)
            return None

    def end(self, move: Move) -> None:
        """The move is done: its record goes, durably. A record a machine crash brought
        back would be replayed at the next mount, and move what was made under the old
        name since (``mv d e; mkdir d; ...``) into the new one."""
        self._end(move.id, durable=True)
        (self.dir / f"{move.id}{LISTED}").unlink(missing_ok=True)

    def pending(self) -> list[Move]:
        """As `_RecordLog.pending`, and a listing whose record went (an end cut short) goes."""
        found = super().pending()
        ids = {move.id for move in found}
        for listing in self.dir.glob(f"*{LISTED}"):
            if listing.name[: -len(LISTED)] not in ids:
                listing.unlink(missing_ok=True)
        return found


class DeleteLog(_RecordLog[Delete]):
    """The journaled deletes (`tierfs.core.deletes`)."""

    def __init__(self, journal_dir: Path) -> None:
        super().__init__(journal_dir, "deletes", Delete)

    def begin(self, delete: Delete) -> None:
        """Record a delete before unlink returns (not fsync'd, like a close's record)."""
        self._write(delete.id, delete.record(), durable=False)

    def end(self, delete: Delete) -> None:
        self._end(delete.id)
