"""Directory renames in GCS, and with write-back, journaled so a crash never splits a tree.

GCS has no directory rename: a directory moves as one server-side copy and one
delete per object below it. Each object is copied, then its exact source
generation deleted, before the next step for that object, so at any moment an
object is under its old name, under both (copied, not yet deleted), or under its
new name only.

Without write-back this is gcsfuse's rename: bounded by ``rename-dir-limit``
(EMFILE beyond it) and not atomic. With write-back the limit does not apply
(the tmp-then-rename commits of Orbax and torch.distributed.checkpoint must
work at the defaults), and the move is journaled: a record naming the two
prefixes is made durable before the first copy and deleted after the last
delete. A daemon killed anywhere in between leaves the record, and the next
mount (`Journal.recover`, after the file uploads it finishes, so that a file
committed under the old name moves too) lists the old prefix and moves what is
still there: an object whose new name exists already was copied before the
crash and only has its source deleted. Records are replayed in the order they
were made (``a -> b`` then ``b -> c``). Layout, beside the file records::

    <journal dir>/moves/<sequence>-<id>.json   {"source": "a/", "destination": "b/"}

With write-back the copies run in the background (`PendingMoves`): rename() returns
once the record is durable and the mount's own tables say the new names, so an Orbax
or DCP commit does not wait for one copy and one delete per object already uploaded.
Until the move is done the mount answers for both trees: the old names are gone, the
new ones are looked up and listed under the old prefix too (each object is under one
name or the other at any moment), and files read from their old object. Anything that
would change either tree (create, unlink, rename, rmdir, a write's upload...) waits for
the move first; that keeps the set of objects to move the one listed, and the next
mount's replay of the record equal to what this mount would have done.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import trio

from tierfs.core.deletes import FAILING_AFTER
from tierfs.errors import BackendError, NotFound, PreconditionFailed
from tierfs.storage import Bucket, ObjectInfo

if TYPE_CHECKING:
    from tierfs.core.records import MoveLog

log = logging.getLogger("tierfs.writeback")

# Copies (then deletes) in flight at once for one directory rename.
MOVE_CONCURRENCY = 16
MOVE_RETRY_S = 5.0
MAX_MOVE_RETRY_S = 300.0
# A move that waits for something local (a file still open with changes) looks again
# after this, doubling up to MAX_MOVE_WAIT_S.
MOVE_WAIT_S = 0.05
MAX_MOVE_WAIT_S = 1.0


class MoveWaits(Exception):
    """A background move cannot go on yet for a local reason; not a failure."""


# How much later than this machine's clock GCS may stamp an object written just before a
# rename began (NTP keeps both within a second; a margin for a clock that drifted).
CLOCK_SKEW_S = 60.0


@dataclass(frozen=True)
class Move:
    """One directory rename in GCS: every object named ``source + rest`` becomes
    ``destination + rest``; with ``file``, the one object ``source`` becomes
    ``destination`` (`tierfs.core.filerename`). Its ``id`` begins with the time it
    began, in ns (`MoveLog.begin`)."""

    id: str
    source: str
    destination: str
    file: bool = False

    def covers(
        self,
        info: ObjectInfo,
        listed: dict[str, int] | None,
        ours: frozenset[str] = frozenset(),
    ) -> bool:
        """Whether a replay moves ``info``: the generation the move's first listing found
        (``listed``, `MoveLog.listed`), or one in ``ours``, uploaded under the old name by
        this mount's recovery (a file committed before the rename). An object another
        client wrote under the old name since is theirs: a replay at the next mount, maybe
        hours later, moved it too (and deleted it from where they put it). Without a
        listing (killed before it), one written before the rename began, by GCS's update
        time within `CLOCK_SKEW_S`."""
        if info.name in ours:
            return True
        if listed is not None:
            return listed.get(info.name) == info.generation
        try:
            began_s = int(self.id.split("-", 1)[0]) / 1e9
        except ValueError:
            return True  # a record of another form: no time to judge by
        return not info.updated_s or info.updated_s <= began_s + CLOCK_SKEW_S


async def move_objects(
    bucket: Bucket,
    objects: Iterable[ObjectInfo],
    source: str,
    destination: str,
    *,
    skip_existing: bool = False,
    on_moved: Callable[[ObjectInfo, ObjectInfo], None] | None = None,
) -> dict[str, ObjectInfo]:
    """Copy each object to its new name, then delete its source generation, a few at a
    time. Returns the new objects by name. ``skip_existing`` (recovery): a destination
    that exists already was copied before a crash, so only its source is deleted.
    ``on_moved(source, copy)`` runs after each copy, before its source is deleted."""
    moved: dict[str, ObjectInfo] = {}
    limit = trio.CapacityLimiter(MOVE_CONCURRENCY)

    async def one(info: ObjectInfo) -> None:
        target = destination + info.name[len(source) :]
        async with limit:
            copy: ObjectInfo | None = None
            if skip_existing:
                try:
                    copy = await bucket.stat(target)
                except NotFound:
                    copy = None
            if copy is None:
                try:
                    copy = await bucket.copy(
                        info.name,
                        target,
                        source_generation=info.generation,
                        if_generation_match=None,
                    )
                except NotFound:
                    return  # deleted meanwhile (by another client): nothing to move
            moved[target] = copy
            if on_moved is not None:
                on_moved(info, copy)
            try:
                await bucket.delete(info.name, if_generation_match=info.generation)
            except (NotFound, PreconditionFailed):
                pass  # gone, or replaced by another client: theirs stays

    async with trio.open_nursery() as nursery:
        for info in objects:
            nursery.start_soon(one, info)
    return moved


async def recover_moves(
    bucket: Bucket,
    moves: MoveLog,
    held: frozenset[str] = frozenset(),
    ours: frozenset[str] = frozenset(),
) -> list[Move]:
    """Finish every rename a previous daemon began (see the module docstring), except
    those of or above an object in ``held``: its upload failed, and moving its old object
    first would put the old bytes under the new name and its record in conflict. Only the
    objects each covers move (`Move.covers`; ``ours``: the objects recovery uploaded). One
    that fails (GCS down) is logged and kept for the next mount: it must not stop this
    one."""
    done = []
    for move in await trio.to_thread.run_sync(moves.pending):
        if any(
            name == move.source or (not move.file and name.startswith(move.source)) for name in held
        ):
            log.error(
                "write-back: renaming gs://%s to %s waits for an upload below it (the next mount)",
                move.source,
                move.destination,
            )
            continue
        try:
            listed = None if move.file else await trio.to_thread.run_sync(moves.listing, move)
            count = await _recover_move(bucket, move, listed, ours)
        except Exception as err:
            log.error(
                "write-back: renaming gs://%s to %s still not done (the next mount tries "
                "again): %s",
                move.source,
                move.destination,
                err,
            )
            continue
        await trio.to_thread.run_sync(moves.end, move)
        log.warning(
            "write-back: finished renaming gs://%s to %s (%d object%s left to move)",
            move.source,
            move.destination,
            count,
            " was" if count == 1 else "s were",
        )
        done.append(move)
    return done


async def _recover_move(
    bucket: Bucket, move: Move, listed: dict[str, int] | None, ours: frozenset[str]
) -> int:
    """One journaled rename, replayed: the objects it moved. A file's copies whatever
    generation its source has (replacing what the destination holds, as rename() does);
    a directory's skips an object whose new name exists (copied before the crash)."""
    if move.file:
        try:
            found: tuple[ObjectInfo, ...] = (await bucket.stat(move.source),)
        except NotFound:
            found = ()  # moved before, or never uploaded
    else:
        found = (await bucket.list(move.source, delimiter=None)).objects
    objects = [info for info in found if move.covers(info, listed, ours)]
    if len(objects) < len(found):
        log.warning(
            "write-back: renaming gs://%s to %s leaves %d object(s) in place, written there "
            "after the rename began (another client's)",
            move.source,
            move.destination,
            len(found) - len(objects),
        )
    await move_objects(bucket, objects, move.source, move.destination, skip_existing=not move.file)
    return len(objects)


def _under(path: str, top: str) -> bool:
    return path == top or path.startswith(top + "/")


@dataclass(eq=False)
class Moving:
    """One rename whose objects are still being moved (paths, no slash): a directory's,
    or with ``file`` one file's."""

    source: str
    destination: str
    file: bool = False
    done: trio.Event = field(default_factory=trio.Event)
    error: str | None = None  # the last attempt's failure, while it is retried
    failures: int = 0  # attempts failed in a row
    attempted: trio.Event = field(default_factory=trio.Event)

    def translate(self, path: str) -> str:
        """The path under the source that ``path`` (under the destination) was."""
        return self.source + path[len(self.destination) :]

    def tried(self, error: str | None) -> None:
        self.error = error
        self.failures = 0 if error is None else self.failures + 1
        self.attempted.set()
        self.attempted = trio.Event()

    async def wait(self, *, failing_after: int = 1) -> None:
        """Until the move is done; raises BackendError once ``failing_after`` attempts in a
        row failed (`tierfs sync` hears of the first failure; a request waiting to change a
        path the move covers waits through one, `FAILING_AFTER`)."""
        while not self.done.is_set():
            if self.failures >= failing_after:
                raise BackendError(f"rename of {self.source} to {self.destination}: {self.error}")
            await self.attempted.wait()


class PendingMoves:
    """The directory renames under way in the background (see the module docstring)."""

    def __init__(self) -> None:
        self._moves: list[Moving] = []

    def __bool__(self) -> bool:
        return bool(self._moves)

    def __iter__(self) -> Iterator[Moving]:
        return iter(list(self._moves))

    def add(self, moving: Moving) -> None:
        self._moves.append(moving)

    def remove(self, moving: Moving) -> None:
        self._moves.remove(moving)
        moving.done.set()

    def hides(self, path: str) -> bool:
        """Whether ``path`` is a name a pending move took away."""
        return any(_under(path, m.source) for m in self._moves)

    def source_of(self, path: str) -> str | None:
        """The old path of ``path`` if it is a new name of a pending move, else None."""
        for moving in reversed(self._moves):
            if _under(path, moving.destination):
                return moving.translate(path)
        return None

    def destinations_in(self, dir_path: str) -> list[str]:
        """New directory names that a pending move puts directly in ``dir_path``."""
        return [
            m.destination
            for m in self._moves
            if not m.file
            and (m.destination.rsplit("/", 1)[0] if "/" in m.destination else "") == dir_path
        ]

    def covering(self, path: str) -> list[Moving]:
        """Pending moves whose trees hold ``path``, or lie below it ("" covers all)."""
        return [
            m
            for m in self._moves
            if _under(path, m.source)
            or _under(path, m.destination)
            or _under(m.source, path)
            or _under(m.destination, path)
            or not path
        ]

    async def settled(self, *paths: str) -> None:
        """Wait until no pending move covers any of ``paths``: before changing them. Raises
        BackendError once a covering move is failing (`FAILING_AFTER`)."""
        while True:
            waiting = [m for path in paths for m in self.covering(path)]
            if not waiting:
                return
            await waiting[0].wait(failing_after=FAILING_AFTER)
