"""The workloads: a registry, one small class per workload, each with its metrics.

A new workload is one class here (or in `benchmarks.saves`) and one line in
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

import concurrent.futures
import contextlib
import json
import os
import random
import shutil
import stat
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from benchmarks.cpu import CpuMeter
from benchmarks.data import WrongBytes, check, check_small, crc32c_b64
from benchmarks.env import DATA_BUCKET, META_BUCKET, Env, Sizes, touch_memory
from benchmarks.systems import System


@dataclass(frozen=True)
class Metric:
    key: str
    label: str
    unit: str
    higher_is_better: bool = True
    limit: str | None = "gcs"  # "gcs", "local" or None (no ratio against a limit)
    optional: bool = False  # measured only for some systems: absent shows "-", not an error


@dataclass
class Measurement:
    value: float | None
    note: str = ""
    detail: dict[str, Any] = field(default_factory=dict)


def save_rss(name: str, what: str) -> Metric:
    """The row of `Cell.record_save_rss`: a save's own peak RSS (daemons only)."""
    return Metric(
        f"{name}.save_rss", f"{what}: daemon peak RSS until durable", "MiB", False, None, True
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

    def run(self, cell: Cell) -> None:
        raise NotImplementedError


# -- 1. sequential write -------------------------------------------------------------------


class SeqWrite(Workload):
    """Write N files of S bytes one after another in 1 MiB writes: until close, until durable."""

    name = "write"
    title = "sequential write (4 files)"
    metrics = (
        Metric("write.close", "seq write, until close()", "MB/s", limit="local"),
        Metric("write.durable", "seq write, until durable in GCS", "MB/s", limit="gcs"),
    )

    def run(self, cell: Cell) -> None:
        sizes, env = cell.sizes, cell.env
        assert env.pool is not None
        files = {
            f"w/part-{i}": env.pool.slice(
                (i + 1) * sizes.write_file_bytes // 3, sizes.write_file_bytes
            )
            for i in range(sizes.write_files)
        }
        total = sum(len(v) for v in files.values())
        bucket = cell.scratch_bucket()
        expected = {name: crc32c_b64(data) for name, data in files.items()}
        system = cell.system
        if system.kind == "direct":
            start = time.monotonic()
            cell.direct.upload_many(bucket, list(files.items()))
            elapsed = time.monotonic() - start
            cell.wait_durable(bucket, expected, "w/")
            cell.record("write.close", rate(total, elapsed), "parallel single-request uploads")
            cell.record("write.durable", rate(total, elapsed))
            return
        root = system.mount(bucket)
        assert root is not None
        start = time.monotonic()
        paths = write_files(root, "w", files, sizes.io_block_bytes)
        closed = time.monotonic() - start
        if system.kind == "local":
            wait_local_durable(paths)
            durable = time.monotonic() - start
            buffer = bytearray(sizes.write_file_bytes)
            for path, data in zip(paths, files.values(), strict=True):
                n = read_file_into(path, memoryview(buffer), sizes.io_block_bytes)
                check(str(path), buffer if n == len(buffer) else buffer[:n], data)
        else:
            cell.wait_durable(bucket, expected, "w/")
            durable = time.monotonic() - start
        cell.record("write.close", rate(total, closed), seconds=closed)
        cell.record("write.durable", rate(total, durable), seconds=durable)


# -- 2-4. sequential reads: cold, warm, after a remount ----------------------------------------


class SeqRead(Workload):
    """Read the data set's N files sequentially: cold, warm (again), after a remount.

    The warm and the remount passes run three times each. The first of each is
    "warm" and "read after remount"; the best of the three is reported beside it.
    Why: on this virtual machine both vary by more than the goal's margin.
    - On a virtual disk the host caches blocks too, and a drop of the guest's page
      cache does not reach it. A file read after a drop comes at 1.9-2.7 GB/s when the
      host still holds its blocks and at 0.4-0.6 GB/s when it does not (dd,
      measured). The local file was read twice just before its remount pass;
      tierfs's cache file was only written. The best of three puts both in the same
      state (read just before), so the ratio measures what the mount adds.
    - Warm passes are memory-bound (1 GiB copied into 256 MiB buffers), and
      consecutive warm passes of one system, local disk included, differ by up to
      40% here (1,408-2,202 MB/s for tierfs, 1,650-2,251 for local, one scratch run).
    - Before the passes, the memory they will fill is touched once, for every system
      alike (`benchmarks.env.touch_memory`): on a VM whose host backs memory lazily, the
      first system to fill fresh pages otherwise pays the host's faults (tierfs cold:
      304 MB/s untouched, 1,054 touched, same run of code).
    """

    name = "read"
    title = "sequential read (4 files)"
    metrics = (
        Metric("read.cold", "seq read, cold (fresh mount, page cache dropped)", "MB/s"),
        Metric("read.warm", "seq read, warm (same mount again)", "MB/s", limit="local"),
        Metric("read.warm_best", "seq read, warm, best of 3 passes", "MB/s", limit="local"),
        Metric("read.remount", "seq read after remount (persistent tier)", "MB/s", limit="local"),
        Metric(
            "read.remount_best",
            "seq read after remount, best of 3 remounts",
            "MB/s",
            limit="local",
        ),
        Metric(
            "read.cold.cpu",
            "seq read, cold: CPU-s per GiB, reader + daemon + emulator",
            "CPU-s/GiB",
            higher_is_better=False,
        ),
        Metric(
            "read.cold.daemon_cpu",
            "seq read, cold: CPU-s per GiB, daemon",
            "CPU-s/GiB",
            higher_is_better=False,
            limit=None,
            optional=True,
        ),
    )
    passes = ("read.cold", *("read.warm",) * 3, *("read.remount",) * 3)

    def run(self, cell: Cell) -> None:
        env, system = cell.env, cell.system
        names = [n for n in env.data_objects if n.startswith("seq/")]
        total = sum(len(env.data_objects[n]) for n in names)
        buffers = {n: bytearray(len(env.data_objects[n])) for n in names}
        if system.kind != "direct":
            system.mount(DATA_BUCKET)
            env.drop_caches()
        touch_memory(3 * total)  # the page cache, the daemon's blocks, the buffers (below)
        times: dict[str, list[float]] = {}
        for key in self.passes:
            meter = None
            if key == "read.cold":  # what the cold pass costs (`benchmarks.cpu`)
                emulator = env.emulator.pid if system.network and env.emulator else None
                meter = CpuMeter(system.daemon_pids(), emulator)
            elapsed = self._pass(cell, key, buffers, meter)
            if meter is not None:
                self._record_cpu(cell, meter, total)
            times.setdefault(key, []).append(elapsed)
            if len(times[key]) > 1:
                continue  # only the first is "warm" / "read after remount"
            direct = system.kind == "direct" and key != "read.cold"
            note = "no cache: every pass reads GCS" if direct else ""
            cell.record(key, rate(total, elapsed), note, seconds=elapsed)
        for key in ("read.warm", "read.remount"):
            best = min(times[key])
            cell.record(f"{key}_best", rate(total, best), seconds=best)

    @staticmethod
    def _record_cpu(cell: Cell, meter: CpuMeter, total: int) -> None:
        gib = total / (1 << 30)
        spent = meter.total_s()
        if spent is not None:
            parts = [f"reader {meter.reader_s / gib:.2f}"]
            if meter.daemon_s is not None:
                parts.append(f"daemon {meter.daemon_s / gib:.2f}")
            if meter.emulator_s is not None:
                parts.append(f"emulator {meter.emulator_s / gib:.2f}")
            cell.record("read.cold.cpu", spent / gib, ", ".join(parts), seconds=spent)
        if meter.daemon_s is not None:
            cell.record("read.cold.daemon_cpu", meter.daemon_s / gib, seconds=meter.daemon_s)

    @staticmethod
    def _pass(
        cell: Cell, key: str, buffers: dict[str, bytearray], meter: CpuMeter | None = None
    ) -> float:
        """One pass over every file, each checked; the seconds spent reading (and, with a
        ``meter``, the CPU spent on them; the checks are outside both)."""
        env, system = cell.env, cell.system
        counting = meter.counting if meter is not None else contextlib.nullcontext
        for buffer in buffers.values():
            buffer[:16] = b"\0" * 16  # a stale buffer must not pass the next check
        if system.kind == "direct":
            targets = [(name, memoryview(buffer)) for name, buffer in buffers.items()]
            with counting():
                start = time.monotonic()
                cell.direct.download_many(DATA_BUCKET, targets)
                elapsed = time.monotonic() - start
            for name, buffer in buffers.items():
                check(f"gs://{DATA_BUCKET}/{name}", buffer, env.data_objects[name])
            return elapsed
        if key == "read.remount":
            system.remount()
        assert system.root is not None
        elapsed = 0.0
        for name, buffer in buffers.items():
            with counting():
                start = time.monotonic()
                n = read_file_into(
                    system.root / name, memoryview(buffer), cell.sizes.io_block_bytes
                )
                elapsed += time.monotonic() - start
            got = buffer if n == len(buffer) else buffer[:n]
            check(f"{system.name}:{name}", got, env.data_objects[name])
        return elapsed


# -- 5. random reads -------------------------------------------------------------------------


def _python_random_reads(
    read: Callable[[int, int], bytes],
    want: memoryview,
    block: int,
    seconds: float,
    seed: int,
    offsets: list[int] | None = None,
) -> tuple[int, float]:
    """QD1 random aligned reads for ``seconds``, each verified; (count, elapsed). The
    offsets read are appended to ``offsets`` if given."""
    rng = random.Random(seed)
    slots = len(want) // block
    count = 0
    start = time.monotonic()
    deadline = start + seconds
    while True:
        offset = rng.randrange(slots) * block
        data = read(offset, block)
        check_small("random read", offset, data, want[offset : offset + block])
        count += 1
        if offsets is not None:
            offsets.append(offset)
        if time.monotonic() >= deadline:
            return count, time.monotonic() - start


def _replay(
    read: Callable[[int, int], bytes], want: memoryview, block: int, offsets: list[int]
) -> float:
    """The same reads again, each verified: seconds taken."""
    start = time.monotonic()
    for offset in offsets:
        check_small("random read again", offset, read(offset, block), want[offset : offset + block])
    return max(time.monotonic() - start, 1e-9)


def _fio(path: Path, block: int, size: int, seconds: float) -> dict[str, Any]:
    result = subprocess.run(
        [
            "fio",
            "--name=randread",
            f"--filename={path}",
            "--readonly",
            "--rw=randread",
            f"--bs={block}",
            "--ioengine=psync",
            "--iodepth=1",
            "--numjobs=1",
            f"--size={size}",
            "--time_based",
            f"--runtime={max(1, round(seconds))}",
            "--invalidate=1",
            "--norandommap",
            "--randrepeat=0",
            "--output-format=json",
        ],
        capture_output=True,
        text=True,
        timeout=seconds + 300,
    )
    if result.returncode != 0:
        raise RuntimeError(f"fio failed ({result.returncode}): {result.stderr.strip()[-300:]}")
    text = result.stdout[result.stdout.index("{") :]
    job = json.loads(text)["jobs"][0]["read"]
    if job.get("io_bytes", 0) == 0:
        raise RuntimeError(f"fio read nothing from {path}")
    return {"iops": float(job["iops"]), "bw_bytes": float(job["bw_bytes"])}


class RandRead(Workload):
    """Random 4 KiB and 1 MiB reads (QD1) over one large object, each from a cold mount.

    fio (psync, QD1, buffered, time-based) measures where it is installed, then a
    short Python pass of the same pattern verifies the bytes; without fio the
    verifying Python loop is the measurement. The direct client runs the same QD1
    pattern as ranged GETs.

    ``.again``: a second touch of the same regions. A seeded Python pass reads for the
    same time, the kernel's page cache is dropped, and the same offsets are read again:
    what a system kept of its first reads (rclone's chunks, tierfs's pieces) shows here;
    the direct client keeps nothing.
    """

    name = "rand"
    title = "random reads over one object"
    metrics = (
        Metric("rand.4k", "random 4 KiB reads, QD1", "IOPS"),
        Metric("rand.1m", "random 1 MiB reads, QD1", "MB/s"),
        Metric("rand.4k.again", "random 4 KiB reads, QD1, second touch", "IOPS"),
        Metric("rand.1m.again", "random 1 MiB reads, QD1, second touch", "MB/s"),
    )

    def run(self, cell: Cell) -> None:
        env, sizes, system = cell.env, cell.sizes, cell.system
        name = "rand/blob"
        want = env.data_objects[name]
        for key, block in (("rand.4k", 4096), ("rand.1m", 1 << 20)):
            if system.kind == "direct":
                direct = cell.direct

                def read(offset: int, length: int, direct: Any = direct) -> bytes:
                    return bytes(direct.read_range(DATA_BUCKET, name, offset, length))

                count, elapsed = _python_random_reads(read, want, block, sizes.rand_seconds, 1)
                self._record(cell, key, block, count / elapsed, "ranged GETs, QD1")
                offsets: list[int] = []
                _python_random_reads(read, want, block, sizes.rand_seconds, 5, offsets)
                again = len(offsets) / _replay(read, want, block, offsets)
                self._record(cell, f"{key}.again", block, again, "ranged GETs, QD1")
                continue
            root = system.mount(DATA_BUCKET, fresh=True)
            assert root is not None
            env.drop_caches()
            path = root / name
            with open(path, "rb", buffering=0) as stream:

                def read(offset: int, length: int, stream: Any = stream) -> bytes:
                    data: bytes = os.pread(stream.fileno(), length, offset)
                    return data

                if shutil.which("fio"):
                    result = _fio(path, block, len(want), sizes.rand_seconds)
                    _python_random_reads(read, want, block, min(0.25, sizes.rand_seconds), 2)
                    self._record(cell, key, block, result["iops"], "fio psync QD1 buffered")
                else:
                    count, elapsed = _python_random_reads(read, want, block, sizes.rand_seconds, 1)
                    self._record(cell, key, block, count / elapsed, "python pread QD1")
                offsets = []
                _python_random_reads(read, want, block, sizes.rand_seconds, 5, offsets)
                env.drop_caches()
                again = len(offsets) / _replay(read, want, block, offsets)
                self._record(cell, f"{key}.again", block, again, "python pread QD1, same offsets")

    @staticmethod
    def _record(cell: Cell, key: str, block: int, iops: float, note: str) -> None:
        value = iops if key.startswith("rand.4k") else iops * block / 1e6
        cell.record(key, value, note, iops=iops)


# -- 6. metadata -----------------------------------------------------------------------------


def _walk(root: Path, deadline: float) -> tuple[dict[str, int], int, bool]:
    """``ls -lR``: readdir every directory and lstat every entry; (files, entries, done).

    The timed loop does only what ``ls -lR`` does (readdir, lstat); turning paths into
    the relative names the check compares is done after the clock stops. Done inside the
    loop, ``relpath`` and ``Path`` cost 9 us an entry (tmpfs walked at 73k instead of
    210k entries/s), a fixed cost that squeezed every system towards the same number.
    """
    seen: list[tuple[str, int]] = []
    entries = 0
    complete = True
    stack = [str(root)]
    while stack and complete:
        directory = stack.pop()
        with os.scandir(directory) as listing:
            for entry in listing:
                info = entry.stat(follow_symlinks=False)
                entries += 1
                if stat.S_ISDIR(info.st_mode):
                    stack.append(entry.path)
                else:
                    seen.append((entry.path, info.st_size))
                if time.monotonic() > deadline:
                    complete = False
                    break
    base = len(str(root)) + 1
    return {path[base:]: size for path, size in seen}, entries, complete


class Metadata(Workload):
    """stat and ``ls -lR`` over the metadata tree, cold and warm (creates: `saves.Create`)."""

    name = "meta"
    title = "metadata"
    metrics = (
        Metric("meta.stat_cold", "stat, cold", "stat/s"),
        Metric("meta.stat_warm", "stat, warm", "stat/s", limit="local"),
        Metric("meta.ls_cold", "ls -lR, cold", "entries/s"),
        Metric("meta.ls_warm", "ls -lR, warm", "entries/s", limit="local"),
    )

    def run(self, cell: Cell) -> None:
        if cell.system.kind == "direct":
            self._direct(cell)
        else:
            self._paths(cell)

    def _expected(self, cell: Cell) -> tuple[list[str], int]:
        names = sorted(cell.env.meta_files)
        random.Random(3).shuffle(names)
        return names, len(names) + len(cell.env.meta_dirs)

    def _paths(self, cell: Cell) -> None:
        env, sizes, system = cell.env, cell.sizes, cell.system
        names, entries_expected = self._expected(cell)
        root = system.mount(META_BUCKET)
        assert root is not None
        env.drop_caches()
        done = 0
        for key in ("meta.stat_cold", "meta.stat_warm"):
            todo = names if key == "meta.stat_cold" else names[:done]
            deadline = time.monotonic() + sizes.meta_stat_seconds
            start = time.monotonic()
            count = 0
            for name in todo:
                size = os.stat(root / name).st_size
                if size != env.meta_files[name]:
                    raise WrongBytes(f"{name}: size {size}, expected {env.meta_files[name]}")
                count += 1
                if key == "meta.stat_cold" and time.monotonic() > deadline:
                    break
            elapsed = time.monotonic() - start
            done = count
            cell.record(key, count / elapsed, f"{count} files", count=count, seconds=elapsed)
        for key in ("meta.ls_cold", "meta.ls_warm"):
            if key == "meta.ls_cold":
                root = system.mount(META_BUCKET)
                assert root is not None
                env.drop_caches()
            start = time.monotonic()
            files, entries, complete = _walk(root, start + sizes.meta_walk_cap_s)
            elapsed = time.monotonic() - start
            note = ""
            if complete:
                if files != env.meta_files:
                    missing = set(env.meta_files) - set(files)
                    extra = set(files) - set(env.meta_files)
                    raise WrongBytes(
                        f"ls -lR found {len(files)} files, expected {len(env.meta_files)}"
                        f" (missing {sorted(missing)[:2]}, extra {sorted(extra)[:2]},"
                        f" sizes differ for"
                        f" {[n for n in files if files[n] != env.meta_files.get(n)][:2]})"
                    )
            else:
                note = f"stopped after {sizes.meta_walk_cap_s:.0f}s: {entries}/{entries_expected}"
                for name, size in files.items():
                    if env.meta_files.get(name) != size:
                        raise WrongBytes(f"ls -lR: {name} size {size}")
            cell.record(key, entries / elapsed, note, entries=entries, seconds=elapsed)

    def _direct(self, cell: Cell) -> None:
        env, sizes = cell.env, cell.sizes
        direct = cell.direct
        names, _ = self._expected(cell)

        def stat_one(name: str) -> None:
            size = int(direct.stat(META_BUCKET, name)["size"])
            if size != env.meta_files[name]:
                raise WrongBytes(f"{name}: size {size}, expected {env.meta_files[name]}")

        done = 0
        for key in ("meta.stat_cold", "meta.stat_warm"):
            start = time.monotonic()
            deadline = start + sizes.meta_stat_seconds
            count = 0
            todo = names if key == "meta.stat_cold" else names[:done]
            batch = direct.threads * 8
            for first in range(0, len(todo), batch):
                chunk = todo[first : first + batch]
                direct.map(stat_one, chunk)
                count += len(chunk)
                if key == "meta.stat_cold" and time.monotonic() > deadline:
                    break
            elapsed = time.monotonic() - start
            done = count
            note = "parallel object GETs" + (", no cache" if key == "meta.stat_warm" else "")
            cell.record(key, count / elapsed, note, count=count, seconds=elapsed)
        for key in ("meta.ls_cold", "meta.ls_warm"):
            start = time.monotonic()
            items = direct.walk(META_BUCKET)
            elapsed = time.monotonic() - start
            files = {i["name"]: int(i["size"]) for i in items if not i["name"].endswith("/")}
            if files != env.meta_files:
                raise WrongBytes(
                    f"listing found {len(files)} objects, expected {len(env.meta_files)}"
                )
            entries = len(files) + len(env.meta_dirs)
            note = "parallel listings per prefix" + (", no cache" if key == "meta.ls_warm" else "")
            cell.record(key, entries / elapsed, note, entries=entries, seconds=elapsed)


# -- 7. checkpoint ---------------------------------------------------------------------------


class Checkpoint(Workload):
    """Save N shards + metadata.json (parallel writers, fsync each, as torch DCP does),
    then restore everything after a remount and verify it."""

    name = "ckpt"
    title = "checkpoint save / restore"
    metrics = (
        Metric("ckpt.save", "checkpoint save, until close()", "MB/s", limit="local"),
        Metric("ckpt.durable", "checkpoint save, until durable", "MB/s", limit="gcs"),
        Metric("ckpt.restore", "checkpoint restore after remount", "MB/s", limit="local"),
        save_rss("ckpt", "checkpoint save"),
    )

    def run(self, cell: Cell) -> None:
        env, sizes, system = cell.env, cell.sizes, cell.system
        assert env.pool is not None
        step = "ckpt/step-100"
        shards = {
            f"{step}/shard-{i:05d}-of-{sizes.ckpt_shards:05d}.distcp": env.pool.slice(
                i * sizes.ckpt_shard_bytes + 12345, sizes.ckpt_shard_bytes
            )
            for i in range(sizes.ckpt_shards)
        }
        meta_doc = json.dumps(
            {"step": 100, "shards": {n: crc32c_b64(d) for n, d in shards.items()}}, indent=1
        ).encode()
        metadata = {f"{step}/metadata.json": memoryview(meta_doc)}
        everything = {**shards, **metadata}
        total = sum(len(d) for d in everything.values())
        expected = {n: crc32c_b64(d) for n, d in everything.items()}
        bucket = cell.scratch_bucket()
        buffers = {name: bytearray(len(data)) for name, data in shards.items()}
        views = {name: memoryview(buffer) for name, buffer in buffers.items()}

        if system.kind == "direct":
            direct = cell.direct
            start = time.monotonic()
            direct.upload_many(bucket, list(shards.items()))
            direct.upload_many(bucket, list(metadata.items()))
            saved = time.monotonic() - start
            cell.wait_durable(bucket, expected, "ckpt/")
            start = time.monotonic()
            doc = json.loads(direct.read_range(bucket, f"{step}/metadata.json", 0, len(meta_doc)))
            direct.download_many(bucket, [(n, views[n]) for n in doc["shards"]])
            restored = time.monotonic() - start
            self._verify(shards, buffers, "gs://" + bucket)
            cell.record("ckpt.save", rate(total, saved), "parallel uploads", seconds=saved)
            cell.record("ckpt.durable", rate(total, saved), seconds=saved)
            cell.record("ckpt.restore", rate(total, restored), "parallel ranged GETs")
            return

        root = system.mount(bucket)
        assert root is not None
        (root / step).mkdir(parents=True)
        block = sizes.io_block_bytes
        with concurrent.futures.ThreadPoolExecutor(sizes.ckpt_writers) as pool:
            start = time.monotonic()
            list(
                pool.map(
                    lambda item: write_file(root / item[0], item[1], block, fsync=True),
                    shards.items(),
                )
            )
            for name, data in metadata.items():
                write_file(root / name, data, block, fsync=True)
            saved = time.monotonic() - start
            if system.kind == "local":
                fsync_dir(root / step)
                durable = time.monotonic() - start
            else:
                system.before_durable(root)
                cell.wait_durable(bucket, expected, "ckpt/")
                durable = time.monotonic() - start
            cell.record_save_rss("ckpt.save_rss")
            root = system.remount()
            assert root is not None
            start = time.monotonic()
            doc = json.loads((root / step / "metadata.json").read_bytes())

            def restore(name: str) -> None:
                got = read_file_into(root / name, views[name], block)
                if got != len(views[name]):
                    raise WrongBytes(f"{name}: read {got} bytes, expected {len(views[name])}")

            list(pool.map(restore, doc["shards"]))
            restored = time.monotonic() - start
        self._verify(shards, buffers, system.name)
        cell.record("ckpt.save", rate(total, saved), seconds=saved)
        cell.record("ckpt.durable", rate(total, durable), seconds=durable)
        cell.record("ckpt.restore", rate(total, restored), seconds=restored)

    @staticmethod
    def _verify(shards: dict[str, memoryview], got: dict[str, bytearray], where: str) -> None:
        for name, data in shards.items():
            check(f"{where}:{name}", got[name], data)


# -- 8. one big checkpoint file, per write mode --------------------------------------------


class BigWrite(Workload):
    """One checkpoint file of ``bigwrite_bytes`` in 1 MiB writes: seconds until close()
    returns and until the object is in GCS; the daemon's peak RSS while doing it.
    (Streaming's memory bound over 4 GiB: ``python -m benchmarks.stream_rss``.)"""

    name = "bigwrite"
    title = "one big checkpoint file"
    metrics = (
        Metric("bigwrite.close", "big file: until close() returns", "s", False, limit=None),
        Metric("bigwrite.durable", "big file: until durable in GCS", "s", False, limit=None),
        Metric("bigwrite.rss", "big file: daemon peak RSS", "MiB", False, None, optional=True),
    )
    own_rss = True  # its RSS rows say which phase they measure

    def run(self, cell: Cell) -> None:
        env, sizes, system = cell.env, cell.sizes, cell.system
        assert env.pool is not None
        size = min(sizes.bigwrite_bytes, env.pool.size)
        data = env.pool.slice(0, size)
        bucket = cell.scratch_bucket()
        expected = {"big/ckpt.pt": crc32c_b64(data)}
        mib = size / (1 << 20)
        if system.kind == "direct":
            start = time.monotonic()
            cell.direct.upload(bucket, "big/ckpt.pt", data)
            elapsed = time.monotonic() - start
            cell.wait_durable(bucket, expected, "big/")
            cell.record("bigwrite.close", elapsed, f"{mib:.0f} MiB, one upload request")
            cell.record("bigwrite.durable", elapsed)
            return
        root = system.mount(bucket)
        assert root is not None
        (root / "big").mkdir()
        path = root / "big" / "ckpt.pt"
        start = time.monotonic()
        write_file(path, data, sizes.io_block_bytes)
        closed = time.monotonic() - start
        if system.kind == "local":
            wait_local_durable([path])
        else:
            cell.wait_durable(bucket, expected, "big/")
        durable = time.monotonic() - start
        cell.record("bigwrite.close", closed, f"{mib:.0f} MiB")
        cell.record("bigwrite.durable", durable)
        system.sample_rss()
        if system.peak_rss_kib is not None:
            cell.record("bigwrite.rss", system.peak_rss_kib / 1024, f"{mib:.0f} MiB file")


RSS = Metric("rss", "daemon peak RSS (VmHWM)", "MiB", higher_is_better=False, limit=None)
