"""Staged writes: a file being written lives in a local temp file until it is uploaded.

This is gcsfuse's staged (legacy) write path and the base every other write
mode falls back to. Opening an existing object for writing costs nothing;
the first write (or truncate) copies the object into an anonymous temp file
under ``temp-dir``; writes and reads then go to that file; flush, fsync and
close upload the whole file as a new generation, preconditioned on the
generation it was copied from (0 for a new file). A lost race is a
`PreconditionFailed` (ESTALE) and the other writer's object is left alone.

The temp file is unlinked as soon as it is created, so a crash leaves
nothing behind; the upload reads it back through ``/proc/self/fd/N``.
Local disk errors (ENOSPC...) surface as the ``OSError`` they are and reach
the writer with their own errno.

``version`` counts writes, so an upload that raced with a write knows the
file is still dirty afterwards.

With write-back on (`tierfs.core.writeback`), the staged file is a named file in the
journal directory instead (``record_id`` names it), so that a commit can make it
durable where the next mount finds it; ``committed_version`` is the version the
journal's record stands for.
"""

from __future__ import annotations

import datetime
import errno
import mimetypes
import os
import tempfile
import time
from collections.abc import Mapping

import trio

from tierfs.cache.ssd_format import write_all
from tierfs.core.writeback import Journal
from tierfs.errors import UploadedOtherBytes
from tierfs.storage import Bucket, ObjectInfo

COPY_CHUNK_BYTES = 8 << 20
# Less free space than this after a direct (passthrough) write: a write probably failed.
FULL_DISK_BYTES = 1 << 20
MTIME_KEY = "gcsfuse_mtime"


class Staged:
    """The local copy of one file being written."""

    def __init__(
        self, fd: int, base_generation: int, size: int, record_id: str | None = None
    ) -> None:
        self.fd = fd
        self.base_generation = base_generation
        self.size = size
        self.version = 0
        self.uploaded_version = -1 if base_generation == 0 else 0
        self.committed_version: int | None = None  # None: no journal record yet
        self.durable_version: int | None = None  # committed with fsync (survives a reboot)
        self.clobbered = False
        self.record_id = record_id
        # errno of a local write that failed (ENOSPC...): the file no longer holds what the
        # writer meant, so it is never uploaded (see Filesystem._abandon).
        self.write_error = 0
        # The kernel writes this file itself (FUSE passthrough) while this is set: the
        # daemon learns of those writes only from the file (`observe`).
        self.direct = False
        self._seen: tuple[int, int] = (0, 0)  # (size, mtime_ns) at the last observe
        # (object, generation, size, version) of an upload the SSD tier takes this file as
        # once it is let go, if it still holds that version (`Uploads._cache_upload`).
        self.cache_as: tuple[str, int, int, int] | None = None

    @classmethod
    def new(cls, temp_dir: str, base_generation: int = 0, journal: Journal | None = None) -> Staged:
        if journal is not None:
            record_id, fd = journal.new_file()
            return cls(fd, base_generation, 0, record_id)
        fd, path = tempfile.mkstemp(prefix="tierfs-", dir=temp_dir or None)
        os.unlink(path)
        return cls(fd, base_generation, 0)

    @classmethod
    async def from_object(
        cls,
        bucket: Bucket,
        info: ObjectInfo,
        temp_dir: str,
        length: int,
        journal: Journal | None = None,
    ) -> Staged:
        """A staged copy of the first ``length`` bytes of one generation."""
        staged = cls.new(temp_dir, info.generation, journal)
        try:
            offset = 0
            while offset < length:
                chunk = await bucket.read(
                    info.name,
                    generation=info.generation,
                    offset=offset,
                    length=min(COPY_CHUNK_BYTES, length - offset),
                )
                if not chunk:
                    break
                # (every byte: a short pwrite, on a disk filling up, left a hole of zeros)
                await trio.to_thread.run_sync(write_all, staged.fd, chunk, offset)
                offset += len(chunk)
            staged.size = offset
        except BaseException:
            staged.close()
            raise
        return staged

    @property
    def dirty(self) -> bool:
        return self.version != self.uploaded_version

    @property
    def committed(self) -> bool:
        """The journal holds a record for exactly what the file holds now."""
        return self.record_id is not None and self.committed_version == self.version

    def pread(self, offset: int, length: int) -> bytes:
        return os.pread(self.fd, length, offset)

    def pwrite(self, offset: int, data: bytes) -> int:
        try:
            written = os.pwrite(self.fd, data, offset)
        except OSError as err:
            self.write_error = err.errno or self.write_error
            raise
        self.size = max(self.size, offset + written)
        self.version += 1
        return written

    def truncate(self, size: int) -> None:
        try:
            os.ftruncate(self.fd, size)
        except OSError as err:
            self.write_error = err.errno or self.write_error
            raise
        self.size = size
        self.version += 1

    def observe(self) -> int | None:
        """Take in what the kernel wrote directly since the last call: the new mtime in ns
        if the file changed (its size and version are brought up to date), else None."""
        status = os.fstat(self.fd)
        seen = (status.st_size, status.st_mtime_ns)
        if seen == self._seen:
            return None
        self._seen = seen
        self.size = status.st_size
        self.version += 1
        if not self.write_error:
            space = os.fstatvfs(self.fd)
            if space.f_bfree * space.f_frsize < FULL_DISK_BYTES:
                # The kernel told the writer ENOSPC, not us: a file written directly onto a
                # full disk is taken as cut short, never uploaded (as a failed daemon write).
                self.write_error = errno.ENOSPC
        return status.st_mtime_ns

    def touch(self) -> None:
        """Mark dirty without changing bytes (an mtime change to upload)."""
        self.version += 1

    async def upload(
        self, bucket: Bucket, object_name: str, metadata: Mapping[str, str]
    ) -> ObjectInfo:
        """Upload the whole file as a new generation; `PreconditionFailed` if clobbered."""
        version = self.version
        try:
            info = await bucket.write_file(
                object_name,
                f"/proc/self/fd/{self.fd}",
                if_generation_match=self.base_generation,
                metadata=metadata,
                content_type=mimetypes.guess_type(object_name)[0],
            )
        except UploadedOtherBytes as err:
            # Written while it was sent (writes do not wait for an upload): the generation
            # made is ours, so the next upload replaces it. (Kept at the old one, that next
            # upload failed its precondition, and ours went to conflicts/ for good.)
            self.base_generation = err.generation
            raise
        self.base_generation = info.generation
        self.uploaded_version = version
        return info

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def format_mtime(mtime_ns: int) -> str:
    """RFC 3339 with nanoseconds in UTC, as gcsfuse writes ``gcsfuse_mtime``."""
    seconds, nanos = divmod(mtime_ns, 1_000_000_000)
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds))  # (datetime: 3x slower)
    fraction = f"{nanos:09d}".rstrip("0")
    return stamp + (f".{fraction}" if fraction else "") + "Z"


def parse_mtime(metadata: Mapping[str, str], updated_s: float) -> int:
    """mtime in ns: ``gcsfuse_mtime``, else ``goog-reserved-file-mtime``, else the update time.
    Any RFC 3339 offset is taken (gcsfuse writes Z; it reads ``+02:00`` too, as Go's parser
    does: such a time was ignored here, and the update time shown), and a legacy time
    before 1970 (negative seconds)."""
    text = metadata.get(MTIME_KEY)
    if text:
        try:
            text, offset_s = _offset(text.strip())
            head, _, frac = text.partition(".")
            if len(head) == 19 and head[10] == "T":  # (fromisoformat: 0.2 us, strptime 9)
                base = datetime.datetime.fromisoformat(head)
            else:
                base = datetime.datetime.strptime(head, "%Y-%m-%dT%H:%M:%S")
            seconds = int(base.replace(tzinfo=datetime.UTC).timestamp()) - offset_s
            nanos = int((frac + "000000000")[:9]) if frac else 0
            return seconds * 1_000_000_000 + nanos
        except ValueError:
            pass
    legacy = metadata.get("goog-reserved-file-mtime")
    if legacy and legacy.removeprefix("-").isdigit():
        return int(legacy) * 1_000_000_000
    return int(updated_s * 1_000_000_000)


def _offset(text: str) -> tuple[str, int]:
    """An RFC 3339 time without its zone, and the zone's offset east of UTC in seconds."""
    if text[-1:] in ("Z", "z"):
        return text[:-1], 0
    if len(text) > 6 and text[-6] in "+-" and text[-3] == ":":
        hours, minutes = int(text[-5:-3]), int(text[-2:])
        sign = 1 if text[-6] == "+" else -1
        return text[:-6], sign * (hours * 3600 + minutes * 60)
    return text, 0
