"""Reads of one generation of one object, straight from GCS, in growing ranges.

The kernel asks for reads of at most ``max_read`` bytes (128 KiB by default,
1 MiB with a larger ``read_ahead_kb``). One GCS request per kernel read
would cost a round trip each, so the reader fetches a window and serves
following reads from it. A read that continues where the last one ended is
sequential and doubles the window, up to ``sequential-read-size-mb`` (capped
by `MAX_WINDOW_BYTES` so that one handle never holds more than that in
memory); any other read is random and fetches a small window. This is
gcsfuse's sequential-read heuristic.

The window is a ``bytes`` object returned by the bucket; the kernel gets
``memoryview`` slices of it, never copies of the whole buffer.

The reader never touches caches: the tiers (a later layer) sit in front of it.
"""

from __future__ import annotations

from tierfs.storage import Bucket

MIN_WINDOW_BYTES = 1 << 20
MAX_WINDOW_BYTES = 32 << 20


class Reader:
    """Ranged reads of one object generation, with a sequential window."""

    def __init__(
        self, bucket: Bucket, name: str, generation: int, size: int, max_window_bytes: int
    ) -> None:
        self.bucket = bucket
        self.name = name
        self.generation = generation
        self.size = size
        self.max_window = max(MIN_WINDOW_BYTES, min(max_window_bytes, MAX_WINDOW_BYTES))
        self.window = MIN_WINDOW_BYTES
        self._start = 0
        self._data = b""
        self._next = -1  # where a sequential read would start

    async def read(self, offset: int, length: int) -> bytes | memoryview:
        if offset >= self.size or length <= 0:
            return b""
        length = min(length, self.size - offset)
        end = offset + length
        if self._start <= offset and end <= self._start + len(self._data):
            self._next = end
            begin = offset - self._start
            return memoryview(self._data)[begin : begin + length]
        if offset == self._next:
            self.window = min(self.window * 2, self.max_window)
        else:
            self.window = MIN_WINDOW_BYTES
        fetch = min(max(length, self.window), self.size - offset)
        data = await self.bucket.read(
            self.name, generation=self.generation, offset=offset, length=fetch
        )
        self._start, self._data = offset, data
        self._next = offset + min(length, len(data))
        return memoryview(data)[:length]

    def close(self) -> None:
        self._data = b""
