"""Test doubles of `tierfs.storage.Bucket` shared by core tests."""

from __future__ import annotations

from tierfs.storage import Into, Progress
from tierfs.storage.memory import MemoryBucket


class HookedReads(MemoryBucket):
    """A `MemoryBucket` whose reads first await `before_read` (a test's gate, or count):
    one place for the read signature, which every such double otherwise repeats."""

    async def before_read(self, offset: int) -> None:
        """Called with each read's offset before it is answered."""

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
        await self.before_read(offset)
        return await super().read(
            name,
            generation=generation,
            offset=offset,
            length=length,
            into=into,
            progress=progress,
        )
