"""What every workload is made of: `Workload`, its `Metric`s, the `Cell` it runs in, and
the file helpers they share. The workloads themselves are small classes in
`benchmarks.writes`, `benchmarks.reads`, `benchmarks.metadata` and `benchmarks.saves`.

A new workload is one class in one of those and one line in
`benchmarks.catalog.WORKLOADS`. It declares
the metrics it reports (`Metric`: a label, a unit, which way is better, and
which limit the tierfs ratio is taken against) and implements ``run(cell)``,
driving the cell's system through paths (``cell.system.kind`` "fuse" or
"local") or through the direct GCS client ("direct"), and recording values
with ``cell.record``. Sizes come from ``cell.sizes`` (quick or full).

Rules every workload follows:

- every byte read back is compared with what was written (`benchmarks.data`);
  objects written through a mount are checked by the CRC32C GCS computed;
- verification happens outside the timed part where it can;
- "cold" means a fresh mount with empty caches and the page cache dropped;
  "remount" keeps the system's persistent cache (its SSD tier) and drops
  the page cache; "warm" repeats on the same mount;
- throughput is MB/s (10^6 bytes), so every "higher is better" number is a
  rate, and ratios read as "fraction of the limit reached".

The limit of a metric is "gcs" (the direct client: what the backend gives)
when the data must cross the link, and "local" (the local disk) when a
cache or local-first write could serve it.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from benchmarks.data import WrongBytes
from benchmarks.env import Env, Sizes
from benchmarks.systems import System


@dataclass(frozen=True)
class Metric:
    key: str
    label: str
    unit: str
    higher_is_better: bool = True
    limit: str | None = "gcs"  # "gcs", "local" or None (no ratio against a limit)
    optional: bool = False  # measured only for some systems: absent shows "-", not an error
    peak: bool = False  # a peak (RSS): over rounds the highest counts, not the median


@dataclass
class Measurement:
    value: float | None
    note: str = ""
    detail: dict[str, Any] = field(default_factory=dict)


def save_rss(name: str, what: str) -> Metric:
    """The row of `Cell.record_save_rss`: a save's own peak RSS (daemons only)."""
    return Metric(
        f"{name}.save_rss",
        f"{what}: daemon peak RSS until durable",
        "MiB",
        False,
        None,
        optional=True,
        peak=True,
    )


class Cell:
    """One workload on one system in one profile: what the workload gets to use."""

    def __init__(self, env: Env, system: System, profile: str, log: Callable[[str], None]) -> None:
        self.env = env
        self.system = system
        self.profile = profile
        self.sizes: Sizes = env.sizes
        self.log = log
        self.values: dict[str, Measurement] = {}
        self.scratch: list[str] = []
        self.notes: list[str] = []

    def record(self, key: str, value: float | None, note: str = "", **detail: Any) -> None:
        self.values[key] = Measurement(value, note, detail)

    def record_save_rss(self, key: str) -> None:
        """The daemon's peak RSS so far, as the save's: sampled once the save is durable,
        before anything reads it back (a read-back through a mount without an SSD tier
        fills the RAM tier, which the generic "daemon peak RSS" row then counts)."""
        self.system.sample_rss()
        kib = self.system.peak_rss_kib
        if kib is not None:
            self.record(key, kib / 1024)

    def scratch_bucket(self) -> str:
        bucket = self.env.new_bucket(f"{self.system.name}-{self.profile}")
        self.scratch.append(bucket)
        return bucket

    @property
    def direct(self) -> Any:
        return self.env.direct(self.profile)

    def wait_durable(self, bucket: str, expected: dict[str, str], prefix: str) -> None:
        assert self.env.admin is not None
        self.env.admin.wait_for(
            bucket, expected, prefix=prefix, timeout_s=self.sizes.durable_timeout_s
        )


def rate(nbytes: int, seconds: float) -> float:
    return nbytes / seconds / 1e6


# -- file helpers (paths) ----------------------------------------------------------------


def write_file(path: Path, data: memoryview, block: int, *, fsync: bool = False) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        for offset in range(0, len(data), block):
            chunk = data[offset : offset + block]
            written = 0
            while written < len(chunk):
                written += os.write(fd, chunk[written:])
        if fsync:
            os.fsync(fd)
    finally:
        os.close(fd)


def write_files(root: Path, directory: str, files: dict[str, memoryview], block: int) -> list[Path]:
    """mkdir ``root/directory``, then write each file (names relative to ``root``) in turn;
    their paths."""
    (root / directory).mkdir()
    paths = [root / name for name in files]
    for path, data in zip(paths, files.values(), strict=True):
        write_file(path, data, block)
    return paths


def read_file_into(path: Path, view: memoryview, block: int) -> int:
    """Read the whole file into ``view`` in ``block``-sized reads; bytes read."""
    got = 0
    with open(path, "rb", buffering=0) as stream:
        while got < len(view):
            n = stream.readinto(view[got : got + block])
            if not n:
                break
            got += n
        # The file must end where we expect it to.
        if got == len(view) and stream.read(1):
            raise WrongBytes(f"{path}: longer than the {len(view)} bytes written")
    return got


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def wait_local_durable(paths: list[Path]) -> None:
    """The local system's "durable": fsync every file and its directory."""
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    for directory in {p.parent for p in paths}:
        fsync_dir(directory)


class Workload:
    name: ClassVar[str] = ""
    title: ClassVar[str] = ""
    metrics: ClassVar[tuple[Metric, ...]] = ()
    own_rss: ClassVar[bool] = False  # True: no generic "daemon peak RSS" row
    rounds: ClassVar[int] = 1  # >1: each system measured that many times, the median kept

    def run(self, cell: Cell) -> None:
        raise NotImplementedError


RSS = Metric("rss", "daemon peak RSS (VmHWM)", "MiB", higher_is_better=False, limit=None, peak=True)
