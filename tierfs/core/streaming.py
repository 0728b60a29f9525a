"""Streaming writes: a new file written in order is uploaded while it is written.

gcsfuse's ``write:enable-streaming-writes``. A file created through the mount
gets a `Stream`: each write that continues exactly where the last one ended is
also handed to a resumable upload (`storage.Upload`), chunk by chunk
(``write:block-size-mb``), so that close() only sends the last chunk and makes
the object. The first write that does not fit (a random write, a truncate, an
mtime set by hand) ends the stream: its upload is abandoned and the file goes
on as a staged write, uploaded whole at close.

Every write also lands in the staged file, as with staged writes. That costs
local disk bandwidth, but the fallback above then needs nothing from GCS, reads
during the write are served locally, and a failed stream never loses a byte
(gcsfuse instead finalizes what it streamed and downloads it back). Memory per
stream is bounded: at most ``max_pending`` writes (of up to 1 MiB, FUSE's
largest) queued, plus what the upload holds for the chunk it sends
(google-cloud-storage's BlobWriter buffers a chunk and copies it to send it:
about 3 x ``write:block-size-mb`` at its peak); a writer faster than GCS waits
on the queue. The number of concurrent streams is bounded by
``write:global-max-blocks`` / ``write:max-blocks-per-file``; files beyond that
are staged.
"""

from __future__ import annotations

import logging

import trio

from tierfs.storage import ObjectInfo, Upload

log = logging.getLogger("tierfs.streaming")


class Stream:
    """One new file's upload, fed in order by the writer, sent by a background task."""

    def __init__(self, upload: Upload, max_pending: int) -> None:
        self.upload = upload
        self.offset = 0  # bytes accepted so far == where the next in-order write starts
        # Bytes in the queue or sent: less than ``offset`` while a writer waits for room.
        self.queued = 0
        self.failed: BaseException | None = None
        self._send, self._receive = trio.open_memory_channel[bytes](max(1, max_pending))
        self._sent = trio.Event()
        self._ended = False
        self._aborting = False
        self._handed = 0  # bytes the sender has handed to the upload (or dropped)
        self._handing = trio.Event()  # set (and replaced) each time it hands some

    async def run(self) -> None:
        """The sender (spawned once): hands queued writes to the upload in order."""
        try:
            async for data in self._receive:
                if self.failed is None and not self._aborting:
                    try:
                        await self.upload.write(data)
                    except Exception as err:  # keep draining: the writer must not block
                        self.failed = err
                        log.warning("streaming upload failed, falling back: %s", err)
                self._handed += len(data)
                self._handing.set()
                self._handing = trio.Event()
        finally:
            self._sent.set()

    async def handed(self) -> None:
        """Until every write queued so far is in the upload's hands (the chunks it filled
        sent), or the stream is over: what an fsync waits for (`WritePath.fsync`)."""
        target = self.queued
        while self._handed < target and not self._sent.is_set():
            await self._handing.wait()

    async def write(self, offset: int, data: bytes) -> bool:
        """Queue an in-order write; False if it is not in order (or the stream is over):
        the caller then ends the stream and the file is a staged write from here on."""
        if self._ended or self.failed is not None or offset != self.offset:
            return False
        self.offset += len(data)
        try:
            await self._send.send(bytes(data))
        except (trio.ClosedResourceError, trio.BrokenResourceError):
            # Ended while this write waited for room (a truncate, or a close that found the
            # stream behind the file): the write is in the staged file, and only there.
            return False
        self.queued += len(data)
        return True

    def holds(self, size: int) -> bool:
        """Whether the stream has every byte of a file of ``size`` queued or sent (not
        while a write of it still waits for room in the queue)."""
        return self.queued == self.offset == size

    async def finish(self) -> ObjectInfo:
        """Everything written is sent: make the object (raises what the upload raised)."""
        self._ended = True
        await self._send.aclose()
        await self._sent.wait()
        if self.failed is not None:
            raise self.failed
        return await self.upload.finish()

    async def abort(self) -> None:
        """Stop; nothing is made. Safe to call at any time, more than once."""
        self._aborting = True  # the sender drops what is still queued
        if not self._ended:
            self._ended = True
            await self._send.aclose()
        await self._sent.wait()
        await self.upload.abort()
