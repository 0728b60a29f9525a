"""Write-back deletes: unlink returns once the delete is journaled; GCS catches up.

Why: removing an old checkpoint (Orbax's ``max_to_keep``, a DCP or Determined
clean-up, ``rm -rf step_90``) is one unlink per file, one after another, and
each was a GCS round trip (tens of ms on GCS): a step of 2,000 files held the
training loop for a minute. With ``write:write-back`` an unlink of a file that
is in GCS is instead

- journaled (``deletes/<id>.json`` in the write-back journal, written like a
  close's record: not fsync'd), so a daemon crash is finished by the next
  mount (`recover_deletes`);
- hidden at once: lookups and listings of this mount no longer show the name
  (`PendingDeletes.hides`), and an rmdir of its directory does not count it, so
  the directory can go too (a directory removed while deletes below it run is
  hidden the same way). An rmdir's delete of a placeholder in GCS is one of these
  deletes too, keyed by the directory's path;
- carried out by background workers (`tierfs.core.uploader`'s queue: bounded,
  retried, yielding to a save in progress), with the generation the file had
  as the precondition: a newer object another client wrote meanwhile is left.

A create, mkdir, symlink or rename at such a name waits for its delete first
(`PendingDeletes.settled`): the new object's upload must find the old one gone. A
delete that keeps failing fails those requests instead (`FAILING_AFTER`).
`tierfs sync` and unmount wait for the deletes (unmount for a bounded time:
they are journaled).
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol

import trio

from tierfs.errors import BackendError, NotFound, PreconditionFailed
from tierfs.storage import Bucket

log = logging.getLogger("tierfs.deletes")

DELETE_WORKERS = 16  # deletes at a time (each is one request)
# A background delete or move whose attempts failed this many times in a row is failing: a
# request waiting for it fails with its error, rather than waiting for ever (one failure
# is waited through: its retry comes a few seconds later).
FAILING_AFTER = 2


@dataclass(eq=False)
class Delete:
    """One object to delete: the path it had in the mount, its object and generation (None:
    a directory's placeholder whose generation the mount did not know)."""

    id: str
    path: str
    object: str
    generation: int | None
    done: trio.Event = field(default_factory=trio.Event, repr=False)
    error: str | None = field(default=None, repr=False)  # the last attempt's, while retried
    failures: int = field(default=0, repr=False)  # attempts failed in a row

    def record(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "path": self.path,
            "object": self.object,
            "generation": self.generation,
        }


class DeleteRecords(Protocol):
    """Where deletes are journaled (`tierfs.core.records.DeleteLog`)."""

    def pending(self) -> list[Delete]: ...

    def end(self, delete: Delete) -> None: ...


def _under(path: str, top: str) -> bool:
    return not top or path == top or path.startswith(top + "/")


def _ancestors(path: str) -> Iterator[str]:
    """The directories above ``path``, the root ("") included."""
    yield ""
    parts = path.split("/")[:-1]
    for depth in range(1, len(parts) + 1):
        yield "/".join(parts[:depth])


class PendingDeletes:
    """The deletes not yet done in GCS, by path, and the directories removed above them.
    Each directory's count of pending deletes below it is kept, so that the checks on
    every unlink and create (`busy`) cost the depth of the path, not the number pending:
    an ``rm -rf`` of many files asks once per file."""

    def __init__(self) -> None:
        self._by_path: dict[str, Delete] = {}
        self._below: Counter[str] = Counter()  # directory -> pending deletes under it
        self._gone_dirs: set[str] = set()
        self._changed = trio.Event()  # set (and replaced) whenever a delete finishes

    def __bool__(self) -> bool:
        return bool(self._by_path)

    def __len__(self) -> int:
        return len(self._by_path)

    def __iter__(self) -> Iterator[Delete]:
        return iter(list(self._by_path.values()))

    def add(self, delete: Delete) -> None:
        self._by_path[delete.path] = delete
        self._below.update(_ancestors(delete.path))

    def finished(self, delete: Delete) -> None:
        if self._by_path.get(delete.path) is delete:
            del self._by_path[delete.path]
            self._below.subtract(_ancestors(delete.path))
            for directory in _ancestors(delete.path):
                if self._below[directory] <= 0:
                    del self._below[directory]
                    self._gone_dirs.discard(directory)
        delete.done.set()
        self._wake()

    def failed(self, delete: Delete, error: str) -> None:
        """An attempt at ``delete`` failed (it is retried): who waits for it hears why."""
        delete.error = error
        delete.failures += 1
        self._wake()

    def _wake(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    def dir_removed(self, path: str) -> None:
        """rmdir of ``path`` succeeded while deletes below it still run: hide it too. (The
        delete of its own placeholder hides it while it runs; `finished` lets go of a gone
        directory only when the last delete below it ends.)"""
        if self._below[path] > 0:
            self._gone_dirs.add(path)

    def hides(self, path: str) -> bool:
        """Whether ``path`` is a name this mount removed whose object(s) GCS still holds."""
        return path in self._by_path or path in self._gone_dirs

    def hidden_in(self, dir_path: str) -> frozenset[str]:
        """The paths directly in ``dir_path`` that `hides` hides now ("" is the root)."""
        if not self._by_path and not self._gone_dirs:
            return frozenset()
        prefix = dir_path + "/" if dir_path else ""
        return frozenset(
            p
            for p in (*self._by_path, *self._gone_dirs)
            if p.startswith(prefix) and "/" not in p[len(prefix) :]
        )

    def busy(self, path: str) -> bool:
        """Whether ``path``, or anything below it ("" is everything), is being deleted."""
        return path in self._by_path or self._below[path] > 0

    def below(self, path: str) -> list[Delete]:
        """The pending deletes of ``path`` and of what lies below it ("" is everything)."""
        if not self.busy(path):
            return []
        return [d for p, d in self._by_path.items() if _under(p, path)]

    async def settled(self, *paths: str) -> None:
        """Wait until nothing at or below ``paths`` is still being deleted. Raises
        BackendError while such a delete's attempts fail (no permission to delete, GCS
        unreachable; `FAILING_AFTER`): the request waiting fails, rather than waiting for
        ever."""
        while any(self.busy(path) for path in paths):
            for delete in (d for path in paths for d in self.below(path)):
                if delete.failures >= FAILING_AFTER:
                    raise BackendError(f"delete of gs://{delete.object}: {delete.error}")
            await self._changed.wait()


async def delete_one(bucket: Bucket, delete: Delete) -> None:
    """Delete exactly the generation recorded; one already gone, or replaced by another
    client since, is not ours to delete any more."""
    try:
        await bucket.delete(delete.object, if_generation_match=delete.generation)
    except (NotFound, PreconditionFailed):
        pass


REPLACED_TRIES = 3  # deletes of a name other clients keep replacing, before giving up


async def delete_named(bucket: Bucket, name: str, generation: int | None) -> None:
    """Delete what ``name`` holds: ``generation`` (what this mount knows of it; None: not
    known, asked first), or, where another client replaced it since, the generation there
    now: an unlink removes the name, as gcsfuse's does, whatever wrote it last. Every
    request names its generation, so a retry after a lost answer never deletes an object
    someone made after this delete (`GcsBucket.delete`). Gone already: done."""
    for _ in range(REPLACED_TRIES):
        try:
            if generation is None:
                generation = (await bucket.stat(name)).generation
            await bucket.delete(name, if_generation_match=generation)
            return
        except NotFound:
            return
        except PreconditionFailed:
            generation = None  # replaced before this delete reached it: that one goes
    raise PreconditionFailed(f"gs://{name}: replaced {REPLACED_TRIES} times while deleted")


async def recover_deletes(
    bucket: Bucket, records: DeleteRecords, held: frozenset[str] = frozenset()
) -> list[Delete]:
    """Finish the deletes a previous daemon journaled (run after its uploads), except those
    of the objects in ``held`` (their uploads failed: first those, at a next mount). One
    that fails (no permission, GCS down) is logged and kept for the next mount: it must
    not stop this one, nor every one after it."""
    done = []
    for delete in await trio.to_thread.run_sync(records.pending):
        if delete.object in held:
            continue
        try:
            await delete_one(bucket, delete)
        except Exception as err:
            log.error(
                "write-back: delete of gs://%s still not done (the next mount tries again): %s",
                delete.object,
                err,
            )
            continue
        await trio.to_thread.run_sync(records.end, delete)
        done.append(delete)
    if done:
        log.warning("write-back: finished %d deletes of a previous mount", len(done))
    return done
