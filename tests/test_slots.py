"""`tierfs.core.slots.Slots`: bounded, first come first served, except urged jobs; and
through the core, a lookup's listing is not queued behind listings made ahead."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import trio
import trio.testing
from hypothesis import given, settings
from hypothesis import strategies as st

from tierfs.core.background import Background
from tierfs.core.filesystem import Filesystem, Settings
from tierfs.core.inodes import ROOT_INO
from tierfs.core.slots import Slots
from tierfs.storage.memory import MemoryBucket

NAMES = ("a", "b", "c", "d")


@dataclass
class _Job:
    name: str
    arrival: int
    release: trio.Event = field(default_factory=trio.Event)
    scope: trio.CancelScope = field(default_factory=trio.CancelScope)
    started: bool = False
    ended: bool = False
    cancelled: bool = False
    urgent_at_start: bool = False


_OPS = st.lists(
    st.one_of(
        st.tuples(st.just("add"), st.sampled_from(NAMES)),
        st.tuples(st.just("urge"), st.sampled_from(NAMES)),
        st.tuples(st.just("end"), st.integers(0, 30)),
        st.tuples(st.just("cancel"), st.integers(0, 30)),
    ),
    max_size=40,
)


@settings(deadline=None)
@given(ops=_OPS, total=st.integers(1, 4))
def test_slots_bound_order_and_urge(ops: list[tuple[str, Any]], total: int) -> None:
    """After every step: never more than ``total`` running; an urged job waits only while
    every slot runs; any job waits only while the slots not kept for urged jobs run; jobs
    not urged start in the order they came; a job cancelled while waiting holds nothing;
    and once all are let go, every job not cancelled has run and no slot is left held."""
    reserve = 1 if total > 1 else 0

    async def main() -> None:
        slots = Slots(total)
        jobs: list[_Job] = []
        urgent: set[str] = set()  # the model: urged, and no job of that name ended since

        async def run(job: _Job) -> None:
            with job.scope:
                async with slots.slot(job.name):
                    job.started = True
                    job.urgent_at_start = job.name in urgent
                    await job.release.wait()
            if job.started:
                job.ended = True
                urgent.discard(job.name)
            else:
                job.cancelled = True

        async with trio.open_nursery() as nursery:
            for op, arg in ops:
                if op == "add":
                    job = _Job(arg, len(jobs))
                    jobs.append(job)
                    nursery.start_soon(run, job)
                elif op == "urge":
                    urgent.add(arg)
                    slots.urge(arg)
                elif jobs:
                    job = jobs[arg % len(jobs)]
                    if op == "end":
                        job.release.set()
                    else:
                        job.scope.cancel()
                await trio.testing.wait_all_tasks_blocked()
                running = [j for j in jobs if j.started and not j.ended]
                waiting = [j for j in jobs if not j.started and not j.cancelled]
                assert slots.running == len(running) <= total
                if any(j.name in urgent for j in waiting):
                    assert len(running) == total
                if waiting:
                    assert len(running) >= total - reserve
                    first = min(j.arrival for j in waiting)
                    jumped = [j for j in jobs if j.started and not j.urgent_at_start]
                    assert all(j.arrival < first for j in jumped)  # (first come, first served)
            for job in jobs:
                job.release.set()
            await trio.testing.wait_all_tasks_blocked()
            assert all(j.ended or j.cancelled for j in jobs)
        assert slots.running == 0 and slots.waiting == 0

    trio.run(main)


class _Queue:
    """Named jobs on ``slots``, each holding its slot until its gate opens; in the order
    they started."""

    def __init__(self, slots: Slots, names: tuple[str, ...]) -> None:
        self.slots = slots
        self.order: list[str] = []
        self.gates = {name: trio.Event() for name in names}

    async def start_all(self, nursery: trio.Nursery) -> None:
        for name in self.gates:  # one by one: each waits in the order started
            nursery.start_soon(self._job, name)
            await trio.testing.wait_all_tasks_blocked()

    async def let_go(self, *names: str) -> None:
        for name in names:  # one at a time: the jobs they let in start in a known order
            self.gates[name].set()
            await trio.testing.wait_all_tasks_blocked()

    async def _job(self, name: str) -> None:
        async with self.slots.slot(name):
            self.order.append(name)
            await self.gates[name].wait()


async def test_an_urged_job_starts_at_once_in_the_slot_kept_for_it() -> None:
    queue = _Queue(Slots(3), ("b0", "b1", "b2", "b3", "wanted"))
    async with trio.open_nursery() as nursery:
        await queue.start_all(nursery)
        assert queue.order == ["b0", "b1"]  # two bets; the third slot is kept
        queue.slots.urge("wanted")
        await trio.testing.wait_all_tasks_blocked()
        assert queue.order == ["b0", "b1", "wanted"]
        assert queue.slots.urged == 1
        await queue.let_go("wanted", "b0", "b1", "b2", "b3")
    assert queue.order == ["b0", "b1", "wanted", "b2", "b3"]


async def test_one_slot_serves_bets_and_an_urged_job_goes_next() -> None:
    queue = _Queue(Slots(1), ("b0", "b1", "b2", "wanted"))
    async with trio.open_nursery() as nursery:
        await queue.start_all(nursery)
        queue.slots.urge("wanted")
        await trio.testing.wait_all_tasks_blocked()
        assert queue.order == ["b0"]  # (no slot to keep: it waits for the one running)
        await queue.let_go("b0")
        assert queue.order == ["b0", "wanted"]
        await queue.let_go("wanted", "b1", "b2")
    assert queue.order == ["b0", "wanted", "b1", "b2"]


class _GatedLists(MemoryBucket):
    """Listings other than the root's wait for ``gate``; the prefixes asked for, in order."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.asked: list[str] = []
        self.gate = trio.Event()

    async def list(self, prefix: str = "", **kwargs: Any) -> Any:
        self.asked.append(prefix)
        if prefix:
            await self.gate.wait()
        return await super().list(prefix, **kwargs)


async def test_a_lookup_is_not_queued_behind_the_listings_made_ahead(tmp_path: Path) -> None:
    """A cold bucket of 30 directories: the root's listing names them and they are listed
    ahead (4 workers, one kept), the bets waiting at GCS. A stat in a directory still
    queued has its listing sent next, in the kept slot, not after the ones before it (the
    first stat of a storm over 100 directories on the emulator took 233-455 ms before)."""
    bucket = _GatedLists("urge")
    dirs = [f"d{i:02}" for i in range(30)]
    for d in dirs:
        bucket.put(f"{d}/", b"")
        bucket.put(f"{d}/f", b"x")
    async with trio.open_nursery() as nursery:
        fs = Filesystem(
            bucket,
            Settings(temp_dir=str(tmp_path), metadata_ttl_s=60.0, metadata_prefetch_workers=4),
            background=Background(nursery),
        )
        await fs.lookup(ROOT_INO, "d00")  # the root listed: its directories are bet on
        await trio.testing.wait_all_tasks_blocked()
        bets = bucket.asked[1:]
        assert bucket.asked[0] == "" and len(bets) == 3
        queued = next(d for d in dirs if f"{d}/" not in bets)
        wanted = await fs.lookup(ROOT_INO, queued)  # (known from the root's listing)
        found: list[int] = []

        async def stat_in_wanted() -> None:
            found.append((await fs.lookup(wanted.ino, "f")).ino)

        nursery.start_soon(stat_in_wanted)
        await trio.testing.wait_all_tasks_blocked()
        assert bucket.asked[1:] == [*bets, f"{queued}/"]
        bucket.gate.set()
        await trio.testing.wait_all_tasks_blocked()
        assert found and sorted(bucket.asked) == ["", *(f"{d}/" for d in dirs)]
        nursery.cancel_scope.cancel()
