"""CPU seconds spent on a read's data path: the reader (or the direct client), the file
system's daemons and the emulator, added up over the timed part of a pass only.

Why: a cold read's MB/s on the 2-vCPU bench VM moves by a quarter between runs of the
same code (tierfs plain, 4 x 256 MiB: 909-1,262 MB/s in one session), while the CPU
it costs per GiB moves far less (0.71-0.91 CPU-s/GiB in the daemon over the same
runs). When every process of the path shares two CPUs, that cost bounds the rate: a
path that spends C CPU-seconds per GiB cannot pass 2 / C GiB/s here, whatever else
the machine does. Reported per GiB beside the rate, it shows how far a system is from
the direct client in work done, which noise does not move, and whether a change saved
any.

Counted from ``/proc/PID/stat`` (user + system time, all threads, 10 ms ticks) for the
daemons and the emulator, and ``getrusage`` for this process. This process is the
reader: its other threads (the RSS sampler, the shaping proxy on the shaped link) are
counted with it, alike for every system.
"""

from __future__ import annotations

import contextlib
import os
import resource
from collections.abc import Iterator, Sequence

_TICKS = os.sysconf("SC_CLK_TCK")


def process_cpu_s(pid: int) -> float | None:
    """User + system CPU seconds of a live process, all its threads; None once it is gone."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return (int(fields[11]) + int(fields[12])) / _TICKS  # utime, stime (fields 14, 15)


def own_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


class CpuMeter:
    """Adds up, over each `counting` block, the CPU seconds of this process (the reader),
    of ``daemons`` and of ``emulator``. A daemon that goes away meanwhile makes its
    share unknown (None), never a smaller number."""

    def __init__(self, daemons: Sequence[int], emulator: int | None = None) -> None:
        self.daemons = list(daemons)
        self.emulator = emulator
        self.reader_s = 0.0
        self.daemon_s: float | None = 0.0 if self.daemons else None
        self.emulator_s: float | None = 0.0 if emulator is not None else None

    def _sample(self) -> tuple[float, list[float | None], float | None]:
        emulator = process_cpu_s(self.emulator) if self.emulator is not None else None
        return own_cpu_s(), [process_cpu_s(pid) for pid in self.daemons], emulator

    @contextlib.contextmanager
    def counting(self) -> Iterator[None]:
        reader0, daemons0, emulator0 = self._sample()
        yield
        reader1, daemons1, emulator1 = self._sample()
        self.reader_s += reader1 - reader0
        if self.daemon_s is not None:
            pairs = zip(daemons0, daemons1, strict=True)
            spent = [b - a for a, b in pairs if a is not None and b is not None]
            self.daemon_s = self.daemon_s + sum(spent) if len(spent) == len(self.daemons) else None
        if self.emulator_s is not None:
            if emulator0 is None or emulator1 is None:
                self.emulator_s = None
            else:
                self.emulator_s += emulator1 - emulator0

    def total_s(self) -> float | None:
        """All of it; None if a process it watched went away."""
        if self.daemons and self.daemon_s is None:
            return None
        if self.emulator is not None and self.emulator_s is None:
            return None
        return self.reader_s + (self.daemon_s or 0.0) + (self.emulator_s or 0.0)
