"""`Backings` when the kernel does not take a backing file (`tierfs.core.passthrough`):
a refusal that will not change turns passthrough off for the mount; a passing one
(out of descriptors) costs that one open its passthrough, nothing more. A kernel
stand-in answers `backing_open`. Through a real mount: tests/test_mount_passthrough.py."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest
import trio

from tierfs.cache import BlockKey
from tierfs.cache.ssd import SsdTier
from tierfs.core.blocks import Blocks
from tierfs.core.filesystem import Filesystem, Settings
from tierfs.core.inodes import ROOT_INO
from tierfs.core.kernel import NoKernel
from tierfs.storage.memory import MemoryBucket

BLOCK = 1 << 20


class BackingKernel(NoKernel):
    """A kernel that agreed to passthrough; each `backing_open` takes the next answer
    (an OSError to raise, or an id), then gives ids."""

    passthrough = True  # type: ignore[assignment]

    def __init__(self, answers: list[OSError | int]) -> None:
        self.answers = answers
        self.asked = 0
        self.closed: list[int] = []

    def backing_open(self, path: Path | int) -> int:
        self.asked += 1
        answer = self.answers.pop(0) if self.answers else 100 + self.asked
        if isinstance(answer, OSError):
            raise answer
        return answer

    def backing_close(self, backing_id: int) -> None:
        self.closed.append(backing_id)


async def opens(tmp_path: Path, answers: list[OSError | int], count: int) -> tuple[list[int], int]:
    """``count`` read-only opens (each closed) of an object sealed in the SSD tier: the
    backing id each got (0: an ordinary open), and how often the kernel was asked."""
    bucket = MemoryBucket("b")
    data = os.urandom(2 * BLOCK + 5)
    generation = bucket.put("ckpt", data).generation
    ssd = await SsdTier.create(tmp_path / "cache", "b", 64 * BLOCK, block_size=BLOCK)
    for index in range(3):
        await ssd.put(BlockKey("ckpt", generation, index), data[index * BLOCK :][:BLOCK])
    assert await ssd.seal("ckpt", generation, len(data))
    blocks = Blocks(bucket, [ssd], block_size=BLOCK, downloads=trio.CapacityLimiter(4))
    kernel = BackingKernel(answers)
    fs = Filesystem(
        bucket, Settings(temp_dir=str(tmp_path), file_cache=True), blocks=blocks, kernel=kernel
    )
    got = []
    async with trio.open_nursery() as nursery:
        with fs.background.attached(nursery):
            inode = await fs.lookup(ROOT_INO, "ckpt")
            for _ in range(count):
                handle = await fs.open(inode.ino, os.O_RDONLY)
                got.append(handle.backing_id)
                await fs.release(handle.fh)
            nursery.cancel_scope.cancel()
    fs.close()
    return got, kernel.asked


@pytest.mark.parametrize("code", [errno.EMFILE, errno.ENFILE, errno.ENOMEM])
async def test_a_passing_failure_costs_one_open_its_passthrough(tmp_path: Path, code: int) -> None:
    got, asked = await opens(tmp_path, [OSError(code, os.strerror(code))], 3)
    assert got[0] == 0 and got[1] > 0 and got[2] > 0, got  # before: [0, 0, 0]
    assert asked == 3


@pytest.mark.parametrize("code", [errno.EPERM, errno.EOPNOTSUPP, errno.EINVAL])
async def test_a_refusal_turns_passthrough_off_for_the_mount(tmp_path: Path, code: int) -> None:
    got, asked = await opens(tmp_path, [OSError(code, os.strerror(code))], 3)
    assert got == [0, 0, 0] and asked == 1
