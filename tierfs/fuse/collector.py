"""The daemon and Python's cyclic garbage collector: what it costs requests, kept small.

CPython stops every thread while it collects, and a full (generation 2) collection walks
every container object the process tracks. A mount daemon starts with ~58,000 of them
that live as long as it does (the modules of google-cloud-storage, requests, trio and
pyfuse3, the option tables), so each full collection walked them all: 30-44 ms, every
FUSE request waiting (measured on the bench machine, `benchmarks` rand, shaped link).
Random 4 KiB reads answered from the RAM tier take ~70 us each, so one such pause in the
bench's second touch (~340 reads) cost as much time as all the reads: 2,395-3,170 IOPS
in the runs it hit, 10,000-15,000 in the others.

So once the daemon has set itself up, just before it mounts, `freeze_startup` collects
once and moves everything alive into the collector's permanent generation
(``gc.freeze``), which no collection walks again. Those objects live for the whole
mount anyway: nothing is lost but the chance to collect a cycle among them that dies
later (none is expected). Measured, 3 pairs, same runs: full collections during the
reads 0.2-10.8 ms against 30.2-44.2 ms, second touch 13,000-15,700 against
10,200-11,400 IOPS.

`Collections` records each collection's pause (a ``gc.callbacks`` hook) for `tierfs
stats` and the metrics: if pauses grow again (say, millions of inodes), it shows there.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable
from typing import Any


def freeze_startup() -> int:
    """Collect once, then keep everything alive now out of every later collection; how
    many objects that was."""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()


class Collections:
    """Collections of the cyclic garbage collector, by generation, and their pauses."""

    def __init__(self, clock: Callable[[], float] = time.perf_counter) -> None:
        self._clock = clock
        self._started: float | None = None
        self.counts = [0, 0, 0]
        self.paused_s = 0.0
        self.longest_s = 0.0
        self.frozen = 0  # objects kept out of collections (`freeze_startup`)

    def __call__(self, phase: str, info: dict[str, Any]) -> None:
        """The ``gc.callbacks`` hook: ``start`` and ``stop`` of each collection."""
        now = self._clock()
        if phase == "start":
            self._started = now
            return
        if phase != "stop" or self._started is None:
            return  # (installed mid-collection: this one is not timed)
        pause = max(0.0, now - self._started)
        self._started = None
        generation = info.get("generation", 0)
        if 0 <= generation < len(self.counts):
            self.counts[generation] += 1
        self.paused_s += pause
        self.longest_s = max(self.longest_s, pause)

    def install(self) -> Collections:
        if self not in gc.callbacks:
            gc.callbacks.append(self)
        return self

    def remove(self) -> None:
        if self in gc.callbacks:
            gc.callbacks.remove(self)

    def statistics(self) -> dict[str, object]:
        return {
            "collections": list(self.counts),  # by generation: young, middle, full
            "paused_s": round(self.paused_s, 6),
            "longest_pause_s": round(self.longest_s, 6),
            "frozen_objects": self.frozen,
        }
