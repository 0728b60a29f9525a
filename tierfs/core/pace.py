"""`Paces`: a whole-object fill keeps the pace of the object's readers.

A fill (`Blocks.fill`, the file cache) downloads an object with several workers as fast
as GCS answers, into every tier. Readers through the mount go slower (each read is a
FUSE request). Ahead of them by more than the RAM tier holds, the fill's blocks were
evicted from RAM before they were read and read back from the SSD tier: a cold 1 GiB
restore of 8 files (cache dir, defaults) read its SSD tier 1.20-1.46x over and ran at
212-331 MB/s; with a 2 GiB RAM tier (nothing evicted), 487-533. Paced, it read its
SSD tier 0.36x over at 477-559 MB/s.

So a fill downloads no further ahead of the furthest block its readers asked for than
its share of the RAM tier allows, counting each block twice (`LEAD_WEIGHT`), less the
readers' own block (at
least 1 block ahead), and goes on as they move. It is never held for long: once its
readers stop for `PACE_WAIT_S` (a training step, a consumer gone slow, a reader gone
random) it goes on unpaced until they read again (readers starved of CPU for a second,
4 restores on 2 cores, must not unpace it for good), and for good once they close. A
reader waiting for its block has not stopped, however long the block takes: counting
such waits as stops, 4 mounts restoring at once ran every fill unpaced and read their
SSD tiers back 1.2-1.5x; with waits counted and this lead, 0.0-0.17x (a mount alone
0.12-0.14x, at 500-589 MB/s). A fill without readers (they closed the object) and a mount
without a RAM tier (nothing kept to be evicted) are not paced at all.

`reading` and `readers_back` tell a fill whether its object has readers now: one nobody
has open goes on with fewer workers (`tierfs.core.wholeobjects.UNREAD_WORKERS`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import trio

PACE_WAIT_S = 1.0
MIN_LEAD = 1  # blocks
# How many times a block a fill leads by counts against its share of the RAM tier. Twice
# leaves half the tier for the blocks its readers are on, other files and random-read
# pieces. Once (when downloads under way came to count once, `DOWNLOAD_COPIES`), eight slow
# readers at the defaults had leads of 3 blocks that filled the tier and read back 128 MiB
# of 384 from the SSD tier (`test_fills_keep_eight_slow_readers_pace_at_the_defaults`: at
# most 96); at twice, 0-56 MiB.
LEAD_WEIGHT = 2

Job = tuple[str, int]  # (object name, generation)


@dataclass
class _Pace:
    """Where the readers of one object are: the furthest block they asked for."""

    readers: int = 0
    at: int = -1
    moved: trio.Event = field(default_factory=trio.Event)
    stalled: bool = False  # they stopped for `PACE_WAIT_S`: unpaced until they read again
    read_at: float = 0.0  # (trio's clock) when they last read
    waiting: int = 0  # reads under way (a reader waiting for its block has not stopped)

    def move(self) -> None:
        self.moved.set()
        self.moved = trio.Event()


class Paces:
    """The readers' positions of the objects being read, and the fills' waits on them."""

    def __init__(self, ram_bytes: int, block_size: int, weight: int = LEAD_WEIGHT) -> None:
        self._ram_bytes = ram_bytes
        self._block_size = block_size
        self._weight = weight  # how many times a block led by counts (`LEAD_WEIGHT`)
        self._paces: dict[Job, _Pace] = {}
        self._back: dict[Job, trio.Event] = {}  # fills' workers waiting for readers to come
        self.waits = 0  # fill downloads held back to keep their readers' pace
        self.stops = 0  # times a fill went on unpaced: its readers stopped for `PACE_WAIT_S`

    def opened(self, job: Job) -> None:
        self._paces.setdefault(job, _Pace()).readers += 1
        back = self._back.pop(job, None)
        if back is not None:
            back.set()

    def reading(self, job: Job) -> bool:
        """Whether the object has readers now (open files reading it)."""
        return job in self._paces

    async def readers_back(self, job: Job) -> None:
        """Until the object has a reader again (`opened`)."""
        if job not in self._paces:
            await self._back.setdefault(job, trio.Event()).wait()

    def done(self, job: Job) -> None:
        """The object's fill ended: nothing waits for its readers any more."""
        self._back.pop(job, None)

    def at(self, job: Job, index: int) -> None:
        """A reader asked for block ``index``: a fill held behind it may go on. Any read
        shows the readers have not stopped, past a new block or not: a reader slower
        than a block per `PACE_WAIT_S` (4 restores at once on 2 cores) keeps the pace.
        (Only a new block wakes the fill: waking it at every read cost CPU.)"""
        pace = self._paces.get(job)
        if pace is None:
            return
        pace.read_at = trio.current_time()
        pace.waiting += 1
        pace.stalled = False  # reading again: paced again
        if index > pace.at:
            pace.at = index
            pace.move()

    def answered(self, job: Job) -> None:
        """A read that `at` announced has its answer (or failed)."""
        pace = self._paces.get(job)
        if pace is not None:
            pace.waiting = max(0, pace.waiting - 1)
            pace.read_at = trio.current_time()

    def closed(self, job: Job) -> None:
        pace = self._paces.get(job)
        if pace is None:
            return
        pace.readers -= 1
        if pace.readers <= 0:
            del self._paces[job]
            pace.move()  # unpaced from here: the fill goes on at GCS's speed

    def lead(self) -> int:
        """How many blocks a fill may run ahead of its readers: its object's share of the
        RAM tier, in blocks counted `LEAD_WEIGHT` times, less the readers' own block."""
        if self._ram_bytes <= 0:
            return 1 << 62
        share = self._ram_bytes // max(1, len(self._paces)) // (self._weight * self._block_size)
        share -= 1  # the readers' own block
        return max(MIN_LEAD, share)

    async def keep(self, job: Job, index: int) -> None:
        """Hold a fill's download of block ``index`` until its readers are within `lead`
        of it; once they have not moved for `PACE_WAIT_S`, no more."""
        while (pace := self._paces.get(job)) is not None and not pace.stalled:
            if index <= pace.at + self.lead():
                return
            self.waits += 1
            with trio.move_on_after(PACE_WAIT_S) as waited:
                await pace.moved.wait()
            idle = trio.current_time() - pace.read_at
            if waited.cancelled_caught and not pace.waiting and idle >= PACE_WAIT_S:
                pace.stalled = True
                self.stops += 1
