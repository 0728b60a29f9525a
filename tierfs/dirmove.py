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
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import trio

from tierfs.errors import NotFound, PreconditionFailed
from tierfs.storage import Bucket, ObjectInfo

if TYPE_CHECKING:
    from tierfs.writeback import MoveLog

log = logging.getLogger("tierfs.writeback")

# Copies (then deletes) in flight at once for one directory rename.
MOVE_CONCURRENCY = 16


@dataclass(frozen=True)
class Move:
    """One directory rename in GCS: every object named ``source + rest`` becomes
    ``destination + rest``."""

    id: str
    source: str
    destination: str


async def move_objects(
    bucket: Bucket,
    objects: Iterable[ObjectInfo],
    source: str,
    destination: str,
    *,
    skip_existing: bool = False,
) -> dict[str, ObjectInfo]:
    """Copy each object to its new name, then delete its source generation, a few at a
    time. Returns the new objects by name. ``skip_existing`` (recovery): a destination
    that exists already was copied before a crash, so only its source is deleted."""
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
            try:
                await bucket.delete(info.name, if_generation_match=info.generation)
            except (NotFound, PreconditionFailed):
                pass  # gone, or replaced by another client: theirs stays

    async with trio.open_nursery() as nursery:
        for info in objects:
            nursery.start_soon(one, info)
    return moved


async def recover_moves(bucket: Bucket, moves: MoveLog) -> list[Move]:
    """Finish every directory rename a previous daemon began (see the module docstring)."""
    done = []
    for move in await trio.to_thread.run_sync(moves.pending):
        listing = await bucket.list(move.source, delimiter=None)
        await move_objects(
            bucket, listing.objects, move.source, move.destination, skip_existing=True
        )
        await trio.to_thread.run_sync(moves.end, move)
        log.warning(
            "write-back: finished renaming gs://%s to %s (%d objects were left to move)",
            move.source,
            move.destination,
            len(listing.objects),
        )
        done.append(move)
    return done
