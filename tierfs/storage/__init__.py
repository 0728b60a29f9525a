"""Storage: the `Bucket` protocol that everything above talks to.

Two implementations pass one contract suite (``tests/test_storage_contract.py``):
`tierfs.storage.gcs.GcsBucket` (the only module that imports ``google.*``; real GCS
or the emulator) and `tierfs.storage.memory.MemoryBucket` (a verified in-memory fake
for fast core and model tests).

The protocol is async. Implementations raise only `tierfs.errors` types
(`NotFound`, `PreconditionFailed`, `AccessDenied`, `BackendError`), never a
library's exception. Generations make every read and write precise: a read
names the generation it wants, a write names the generation it replaces
(0 = "must not exist yet"), so a lost race is a `PreconditionFailed`, never
a silent overwrite.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Protocol

import trio

from tierfs.errors import InvalidName

MAX_NAME_BYTES = 1024
# The counters every Bucket's statistics() reports.
STAT_KEYS = (
    "requests",
    "stats",
    "lists",
    "media_reads",
    "bytes_read",
    "uploads",
    "bytes_written",
    "deletes",
    "copies",
    "errors",
    "retries",
    "read_stalls",
    "in_flight_peak",  # most requests at once (max-conns-per-host caps it)
    "throttled",  # requests that waited for limit-ops-per-sec / limit-bytes-per-sec
    "throttled_ms",
)


async def nothing_to_read(offset: int, length: int) -> bool:
    """A read's range checked alike by both implementations: ValueError when negative;
    True (after a checkpoint, as any read is one) when it asks for no bytes."""
    if offset < 0 or length < 0:
        raise ValueError(f"negative offset or length: {offset}, {length}")
    if length == 0:
        await trio.lowlevel.checkpoint()
        return True
    return False


def check_name(name: str) -> None:
    """Raise `InvalidName` unless GCS accepts ``name`` for a new object.

    GCS's rules: 1 to 1,024 bytes of UTF-8; no carriage return or line feed; not
    ``.`` or ``..``; not under ``.well-known/acme-challenge/``.  (`GcsBucket` checks
    the same before sending a write, so both implementations answer alike; the
    emulator itself accepts all of these.)
    """
    try:
        size = len(name.encode("utf-8"))
    except UnicodeEncodeError:
        raise InvalidName(f"object name is not valid UTF-8: {name!r}") from None
    if size == 0:
        raise InvalidName("object name is empty")
    if size > MAX_NAME_BYTES:
        raise InvalidName(f"object name is {size} bytes long, GCS allows {MAX_NAME_BYTES}")
    if "\r" in name or "\n" in name:
        raise InvalidName(f"object name contains a carriage return or line feed: {name!r}")
    if name in (".", ".."):
        raise InvalidName(f"object name cannot be {name!r}")
    if name.startswith(".well-known/acme-challenge/"):
        raise InvalidName(f"object name cannot start with .well-known/acme-challenge/: {name!r}")


@dataclass(frozen=True)
class ObjectInfo:
    """What GCS knows about one generation of one object."""

    name: str
    size: int
    generation: int
    metageneration: int = 1
    updated_s: float = 0.0
    metadata: Mapping[str, str] = field(default_factory=dict)
    content_type: str | None = None
    crc32c: str | None = None


@dataclass(frozen=True)
class Listing:
    """One directory level: objects directly under the prefix, and sub-prefixes ('dir/').

    ``placeholders``: with a delimiter, the objects named exactly as one of ``prefixes``
    (a directory's placeholder ``dir/``), which GCS returns beside the prefix when asked
    (``includeTrailingDelimiter``, as gcsfuse asks): a listing then says which of the
    directories it names exist on their own, with no lookup of each.
    """

    objects: tuple[ObjectInfo, ...]
    prefixes: tuple[str, ...]
    placeholders: tuple[ObjectInfo, ...] = ()


class Upload(Protocol):
    """One object being uploaded in order (a resumable upload session)."""

    async def write(self, data: bytes) -> None:
        """Append; blocks while a full chunk is sent (that is the back-pressure)."""
        ...

    async def finish(self) -> ObjectInfo:
        """Send the rest and make the object; `PreconditionFailed` if the precondition no
        longer holds."""
        ...

    async def abort(self) -> None:
        """Give up: no object is made (best effort; never raises)."""
        ...


Into = Callable[[int], memoryview | None]
"""Where a read may put its bytes (`Bucket.read`): called with their length, it returns a
buffer of that length to fill (a block buffer: `tierfs.cache.buffers`), or None (then
the read makes a new bytes object)."""

Progress = Callable[[memoryview, int], None]
"""Told how much of a read's buffer (`Into`) is filled so far, as it fills, maybe from a
worker thread: (the buffer, bytes filled from its start). A retried read tells of the
new buffer it fills, once it has bytes there (or not at all, where the retry reads into
a new bytes object); what it told of the failed attempt's buffer stays true (the same
generation's bytes). Why: a reader waiting for the first MiB of a block need not wait
for its last (`tierfs.core.blocks.Blocks.get_part`)."""


class Bucket(Protocol):
    """One GCS bucket. Safe to call from many trio tasks at once."""

    name: str
    last_error: str  # the last failure worth retrying, in one line ("" before any)

    async def stat(self, name: str) -> ObjectInfo:
        """The live generation of ``name``; `NotFound` if there is none."""
        ...

    async def list(
        self,
        prefix: str,
        *,
        delimiter: str | None = "/",
        max_results: int | None = None,
        start_offset: str | None = None,
    ) -> Listing:
        """Objects and prefixes under ``prefix`` (all pages, sorted by name).

        With ``delimiter='/'`` one directory level, and the placeholders of the
        prefixes listed; with None every object below. ``max_results`` caps objects +
        prefixes returned.
        """
        ...

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
        """Up to ``length`` bytes at ``offset`` of that generation (short at EOF).

        With ``into``, the bytes may be read into the buffer it returns when called with
        their length (maybe in a worker thread), and that buffer returned (a block buffer:
        `tierfs.cache.buffers`); else, or where an implementation does not, a new bytes
        object. ``progress`` is told as that buffer fills (an implementation may tell it
        only once, when full, or never: the returned bytes are what counts). `NotFound`
        if that generation is gone (overwritten or deleted).
        """
        ...

    async def open_upload(
        self,
        name: str,
        *,
        if_generation_match: int | None,
        chunk_bytes: int,
        content_type: str | None = None,
    ) -> Upload:
        """A streaming upload of ``name``: bytes go out in ``chunk_bytes`` pieces while more
        are written; the object appears at `Upload.finish`. Sends nothing until the first
        chunk is full."""
        ...

    async def write_file(
        self,
        name: str,
        path: str,
        *,
        if_generation_match: int | None,
        metadata: Mapping[str, str] | None = None,
        content_type: str | None = None,
    ) -> ObjectInfo:
        """Upload a local file as the new generation of ``name``.

        ``if_generation_match``: the generation being replaced, 0 for "must
        not exist", None for unconditional. `PreconditionFailed` on a mismatch.
        """
        ...

    async def write_bytes(
        self,
        name: str,
        data: bytes,
        *,
        if_generation_match: int | None,
        metadata: Mapping[str, str] | None = None,
        content_type: str | None = None,
    ) -> ObjectInfo:
        """Like `write_file` for a small in-memory body (placeholders, symlinks)."""
        ...

    async def delete(self, name: str, *, if_generation_match: int | None = None) -> None:
        """Delete the live generation. `NotFound` if absent; `PreconditionFailed` on mismatch."""
        ...

    async def copy(
        self,
        source: str,
        destination: str,
        *,
        source_generation: int,
        if_generation_match: int | None,
    ) -> ObjectInfo:
        """Server-side copy of one generation (metadata included) to a new name."""
        ...

    async def update_metadata(
        self, name: str, metadata: Mapping[str, str | None], *, generation: int
    ) -> ObjectInfo:
        """Set (or, with None, remove) custom metadata keys of that generation."""
        ...

    def let_go(self) -> None:
        """Requests in flight that change GCS, and any made after, fail at once: the end
        of an unmount with GCS not answering, the write-back journal holding the rest."""
        ...

    def statistics(self) -> dict[str, int]:
        """Counters so far: ``requests``, ``media_reads``, ``bytes_read``, ``bytes_written``..."""
        ...
