"""`MemoryBucket`: the `Bucket` protocol in memory, with real GCS semantics.

Core and model tests need a bucket that is fast, deterministic and inspectable, and
that is *right*: a fake that is kinder than GCS hides bugs.  So this one follows GCS,
not the emulator, wherever they differ (the contract suite marks each such divergence
of the emulator): every write makes a new, larger generation; ``if_generation_match``
is enforced on every write, copy and delete (0 = "must not exist"); only the live
generation of a name can be read, copied or patched (no object versioning), anything
else is `NotFound`; a metadata update bumps the metageneration and a None value
removes the key; listings are sorted by name, with ``delimiter`` folding deeper names
into prefixes, and ``max_results`` capping objects + prefixes together.  Object names
follow GCS's rules (`check_name`), enforced where names are created.

Every operation is atomic: the state changes in one synchronous step after the last
checkpoint, exactly where a request would be applied by the server, so concurrent trio
tasks interleave only between operations.  Generations start at a realistic magnitude
(microseconds since the epoch, as GCS's are) so that code which squeezes them into
small integers breaks here and not in production.

Test hooks:

- ``latency_s``: every operation sleeps that long first (``trio.sleep``, so
  ``MockClock`` makes it free);
- `fail_next`: the next ``count`` calls of one operation (or of any, ``"*"``) raise
  the given error instead of running, after the latency, with no effect;
- `put`, `get`, `remove`, `names`: synchronous access acting as *another client*
  (no latency, no faults, not counted in `statistics`).
"""

from __future__ import annotations

import base64
import bisect
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import TypeVar

import trio

try:  # the C extension google-cloud-storage itself depends on; not a google.* module
    import google_crc32c
except ImportError:  # pragma: no cover
    google_crc32c = None  # type: ignore[assignment]

from tierfs.errors import NotFound, PreconditionFailed
from tierfs.storage import (
    STAT_KEYS,
    Into,
    Listing,
    ObjectInfo,
    Progress,
    check_name,
    nothing_to_read,
)

__all__ = ["OPERATIONS", "MemoryBucket"]

DEFAULT_CONTENT_TYPE = "application/octet-stream"
OPERATIONS = frozenset(
    {"stat", "list", "read", "write_file", "write_bytes", "delete", "copy", "update_metadata"}
)
_FIRST_GENERATION = 1_700_000_000_000_000
T = TypeVar("T")


def _crc32c(data: bytes) -> str | None:
    """The object's CRC32C as GCS reports it (base64, big-endian), when computable."""
    if google_crc32c is None:
        return None
    return base64.b64encode(google_crc32c.value(data).to_bytes(4, "big")).decode("ascii")


@dataclass(frozen=True)
class _Object:
    info: ObjectInfo
    data: bytes


class MemoryUpload:
    """`Upload` for MemoryBucket: the bytes gather in memory; finish() is one write."""

    def __init__(
        self,
        bucket: MemoryBucket,
        name: str,
        if_generation_match: int | None,
        content_type: str | None,
    ) -> None:
        self._bucket, self._name = bucket, name
        self._precondition, self._content_type = if_generation_match, content_type
        self._parts: list[bytes] = []
        self.aborted = False

    async def write(self, data: bytes) -> None:
        await trio.lowlevel.checkpoint()
        self._parts.append(bytes(data))

    async def finish(self) -> ObjectInfo:
        data = b"".join(self._parts)
        return await self._bucket._write(
            "write_file", self._name, data, self._precondition, None, self._content_type
        )

    async def abort(self) -> None:
        await trio.lowlevel.checkpoint()
        self.aborted = True


class MemoryBucket:
    """An in-memory bucket.  Safe for many trio tasks of one trio run."""

    def __init__(
        self,
        name: str = "memory-bucket",
        *,
        latency_s: float = 0.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.name = name
        self.latency_s = latency_s
        self._clock = clock
        self._objects: dict[str, _Object] = {}
        self._sorted_names: list[str] = []
        self._next_generation = _FIRST_GENERATION
        self._faults: list[tuple[str, Exception]] = []
        self._counters = dict.fromkeys(STAT_KEYS, 0)
        self.last_error = ""  # as GcsBucket's: the last injected failure, in one line

    # -- test hooks ----------------------------------------------------------------------

    def fail_next(self, operation: str, error: Exception, count: int = 1) -> None:
        """Make the next ``count`` calls of ``operation`` (a method name, or ``"*"``) raise.

        Faults queue up in order; a failing call has no effect on the bucket.
        """
        if operation != "*" and operation not in OPERATIONS:
            raise ValueError(f"unknown operation {operation!r}; one of {sorted(OPERATIONS)}")
        if count < 1:
            raise ValueError(f"count must be >= 1, got {count}")
        self._faults.extend([(operation, error)] * count)

    def put(
        self,
        name: str,
        data: bytes,
        metadata: Mapping[str, str] | None = None,
        content_type: str | None = None,
    ) -> ObjectInfo:
        """Another client writes ``name`` unconditionally; returns the new generation."""
        check_name(name)
        return self._store(name, bytes(data), metadata, content_type)

    def get(self, name: str) -> bytes:
        """Another client reads the live generation of ``name``."""
        return self._live(name).data

    def remove(self, name: str) -> None:
        """Another client deletes ``name``; `NotFound` if absent."""
        self._live(name)
        self._drop(name)

    def names(self) -> list[str]:
        """Every object name, sorted."""
        return list(self._sorted_names)

    def statistics(self) -> dict[str, int]:
        return dict(self._counters)

    async def check(self) -> None:
        """Like `GcsBucket.check`: the bucket exists (always, here)."""
        await trio.lowlevel.checkpoint()

    def close(self) -> None:
        """Like `GcsBucket.close`: nothing to release."""

    def let_go(self) -> None:
        """Like `GcsBucket.let_go`: no request here outlives its call."""

    # -- the protocol --------------------------------------------------------------------

    async def stat(self, name: str) -> ObjectInfo:
        await self._begin("stat", stats=1)
        return self._counted(lambda: self._live(name).info)

    async def list(
        self,
        prefix: str,
        *,
        delimiter: str | None = "/",
        max_results: int | None = None,
        start_offset: str | None = None,
    ) -> Listing:
        if max_results is not None and max_results <= 0:
            raise ValueError(f"max_results must be positive, got {max_results}")
        await self._begin("list", lists=1)
        objects: list[ObjectInfo] = []
        prefixes: list[str] = []
        placeholders: list[ObjectInfo] = []  # (`Listing`)
        names = self._sorted_names
        index = bisect.bisect_left(names, max(prefix, start_offset or ""))
        while index < len(names) and names[index].startswith(prefix):
            if max_results is not None and len(objects) + len(prefixes) >= max_results:
                break
            name = names[index]
            cut = name.find(delimiter, len(prefix)) if delimiter else -1
            if cut < 0:
                objects.append(self._objects[name].info)
                index += 1
                continue
            folded = name[: cut + len(delimiter or "")]
            prefixes.append(folded)
            placeholder = self._objects.get(folded)
            if placeholder is not None:
                placeholders.append(placeholder.info)
            # Skip the rest of that subtree: every name starting with `folded` sorts
            # below `folded` with its last character incremented.
            index = bisect.bisect_left(names, folded[:-1] + chr(ord(folded[-1]) + 1), index)
        return Listing(
            objects=tuple(objects), prefixes=tuple(prefixes), placeholders=tuple(placeholders)
        )

    async def read(
        self,
        name: str,
        *,
        generation: int,
        offset: int,
        length: int,
        into: Into | None = None,
        progress: Progress | None = None,
    ) -> bytes | memoryview:
        if await nothing_to_read(offset, length):
            return b""
        await self._begin("read", media_reads=1)
        stored = self._counted(lambda: self._generation(name, generation))
        data = stored.data[offset : offset + length]
        self._counters["bytes_read"] += len(data)
        if into is None or not data:
            return data
        view = into(len(data))  # (as GCS would: the bytes land in the caller's buffer)
        if view is None:
            return data
        view[:] = data
        if progress is not None:
            progress(view, len(view))
        return view

    async def open_upload(
        self,
        name: str,
        *,
        if_generation_match: int | None,
        chunk_bytes: int,
        content_type: str | None = None,
    ) -> MemoryUpload:
        check_name(name)
        return MemoryUpload(self, name, if_generation_match, content_type)

    async def write_file(
        self,
        name: str,
        path: str,
        *,
        if_generation_match: int | None,
        metadata: Mapping[str, str] | None = None,
        content_type: str | None = None,
    ) -> ObjectInfo:
        check_name(name)
        data = await trio.Path(path).read_bytes()
        try:
            return await self._write(
                "write_file", name, data, if_generation_match, metadata, content_type
            )
        except PreconditionFailed:
            live = self._objects.get(name)  # these very bytes: ours (`GcsBucket._own_object`)
            if live is None or live.data != data:
                raise
            return live.info

    async def write_bytes(
        self,
        name: str,
        data: bytes,
        *,
        if_generation_match: int | None,
        metadata: Mapping[str, str] | None = None,
        content_type: str | None = None,
    ) -> ObjectInfo:
        check_name(name)
        return await self._write(
            "write_bytes", name, bytes(data), if_generation_match, metadata, content_type
        )

    async def delete(self, name: str, *, if_generation_match: int | None = None) -> None:
        await self._begin("delete", deletes=1)

        def run() -> None:
            self._live(name)
            self._precondition(name, if_generation_match)
            self._drop(name)

        self._counted(run)

    async def copy(
        self,
        source: str,
        destination: str,
        *,
        source_generation: int,
        if_generation_match: int | None,
    ) -> ObjectInfo:
        check_name(destination)
        await self._begin("copy", copies=1)

        def run() -> ObjectInfo:
            stored = self._generation(source, source_generation)
            self._precondition(destination, if_generation_match)
            info = stored.info
            return self._store(destination, stored.data, info.metadata, info.content_type)

        return self._counted(run)

    async def update_metadata(
        self, name: str, metadata: Mapping[str, str | None], *, generation: int
    ) -> ObjectInfo:
        changes = dict(metadata)
        await self._begin("update_metadata")

        def run() -> ObjectInfo:
            stored = self._generation(name, generation)
            merged = dict(stored.info.metadata)
            for key, value in changes.items():
                if value is None:
                    merged.pop(key, None)
                else:
                    merged[key] = str(value)
            info = replace(
                stored.info,
                metadata=merged,
                metageneration=stored.info.metageneration + 1,
                updated_s=self._clock(),
            )
            self._objects[name] = _Object(info, stored.data)
            return info

        return self._counted(run)

    # -- internals -----------------------------------------------------------------------

    async def _begin(self, operation: str, **counts: int) -> None:
        """Latency, then the request is counted, then an injected fault if one is due."""
        if self.latency_s > 0:
            await trio.sleep(self.latency_s)
        else:
            await trio.lowlevel.checkpoint()
        self._counters["requests"] += 1
        for key, value in counts.items():
            self._counters[key] += value
        for index, (target, error) in enumerate(self._faults):
            if target in ("*", operation):
                del self._faults[index]
                self._counters["errors"] += 1
                self.last_error = str(error)
                raise error

    def _counted(self, run: Callable[[], T]) -> T:
        try:
            return run()
        except (NotFound, PreconditionFailed):
            raise  # answers, not faults (as GcsBucket counts them)
        except Exception:
            self._counters["errors"] += 1
            raise

    async def _write(
        self,
        operation: str,
        name: str,
        data: bytes,
        if_generation_match: int | None,
        metadata: Mapping[str, str] | None,
        content_type: str | None,
    ) -> ObjectInfo:
        await self._begin(operation, uploads=1)

        def run() -> ObjectInfo:
            self._precondition(name, if_generation_match)
            return self._store(name, data, metadata, content_type)

        info = self._counted(run)
        self._counters["bytes_written"] += len(data)
        return info

    def _live(self, name: str) -> _Object:
        stored = self._objects.get(name)
        if stored is None:
            raise NotFound(f"memory://{self.name}/{name}: not found")
        return stored

    def _generation(self, name: str, generation: int) -> _Object:
        stored = self._objects.get(name)
        if stored is None or stored.info.generation != generation:
            raise NotFound(f"memory://{self.name}/{name}#{generation}: not found")
        return stored

    def _precondition(self, name: str, if_generation_match: int | None) -> None:
        if if_generation_match is None:
            return
        stored = self._objects.get(name)
        live = stored.info.generation if stored is not None else 0
        if live != if_generation_match:
            raise PreconditionFailed(
                f"memory://{self.name}/{name}: generation precondition failed"
                f" (expected {if_generation_match}, live {live})"
            )

    def _store(
        self,
        name: str,
        data: bytes,
        metadata: Mapping[str, str] | None,
        content_type: str | None,
    ) -> ObjectInfo:
        generation = max(self._next_generation, int(self._clock() * 1_000_000))
        self._next_generation = generation + 1
        info = ObjectInfo(
            name=name,
            size=len(data),
            generation=generation,
            metageneration=1,
            updated_s=self._clock(),
            metadata={key: str(value) for key, value in (metadata or {}).items()},
            content_type=content_type or DEFAULT_CONTENT_TYPE,
            crc32c=_crc32c(data),
        )
        if name not in self._objects:
            bisect.insort(self._sorted_names, name)
        self._objects[name] = _Object(info, data)
        return info

    def _drop(self, name: str) -> None:
        del self._objects[name]
        del self._sorted_names[bisect.bisect_left(self._sorted_names, name)]
