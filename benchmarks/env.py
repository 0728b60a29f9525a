"""One run's world: temp dirs, the emulator, the shaping proxy, the data sets.

Everything a run starts is registered here and torn down in reverse order by
`Env.close`, which also runs from ``atexit`` and on SIGTERM/SIGHUP (turned
into KeyboardInterrupt), so a failed or interrupted run leaves no mount, no
process and no temp data behind. Processes are stopped by the PIDs this run
started, never by name.

Data sets live in the emulator's memory backend (its filesystem backend
conflates ``x`` and ``x/``):

- ``bench-data``: ``seq/part-0..3`` (the sequential-read files) and
  ``rand/blob`` (the random-read object), all slices of the run's `Pool`,
  uploaded once through the fast direct path, with placeholder objects
  ``seq/`` and ``rand/`` so mounts without implicit directories see them.
- ``bench-meta``: the metadata tree (``dNNN/fNNNNN``, 10,000 small objects in
  100 directories in the full run), in a bucket of its own because the
  memory backend finds objects by a linear scan: with 10,000 objects in a
  bucket, each create in that bucket costs tens of ms. Creating them over
  HTTP takes ~100 s here; the emulator's ``-data`` seed directory loads them
  in a third of that, so the tree is written to disk and loaded at start.
- a fresh scratch bucket per cell for everything a workload writes, emptied
  after the cell so neither the emulator's RAM nor its scans grow.

Local systems get the same data sets as plain files, written on first use.
"""

from __future__ import annotations

import atexit
import contextlib
import mmap
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

from benchmarks.data import MiB, Pool, crc32c_b64
from benchmarks.direct import Direct
from benchmarks.shaping import DEFAULT_DELAY_S, DEFAULT_RATE_BYTES_S, ShapingProxy
from tierfs.cli.emulator import Emulator

DATA_BUCKET = "bench-data"
META_BUCKET = "bench-meta"
EMULATOR_RSS_LIMIT = 8 << 30  # restarted before a workload past this (`emulator_needs_restart`)
PROFILES = ("plain", "shaped")


def started_at(pid: int) -> int | None:
    """When process ``pid`` started (clock ticks since boot, /proc/PID/stat field 22);
    None if there is no such process. A PID and its start time name one process: a PID
    alone may be a later, unrelated one."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            fields = stat.read().rsplit(b")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return None
    return int(fields[19])


def mounts_below(root: Path) -> list[str]:
    """Mountpoints at or below ``root`` (/proc/self/mounts; octal escapes undone), deepest
    first."""
    found = []
    top = str(root).rstrip("/") + "/"
    with open("/proc/self/mounts", encoding="utf-8") as mounts:
        for line in mounts:
            fields = line.split()
            if len(fields) > 1:
                point = fields[1].encode().decode("unicode_escape")
                if (point + "/").startswith(top):
                    found.append(point)
    return sorted(found, key=len, reverse=True)


class Pids:
    """The processes a run started, each by PID and start time, killed at `Env.close` at
    the latest: only while each is still the one started (a run mounts dozens of times,
    and a PID freed long ago may name another process by then)."""

    def __init__(self) -> None:
        self._started: dict[int, int] = {}

    def add(self, pid: int) -> None:
        start = started_at(pid)
        if start is not None:
            self._started[pid] = start

    def update(self, pids: list[int]) -> None:
        for pid in pids:
            self.add(pid)

    def discard(self, pid: int) -> None:
        self._started.pop(pid, None)

    def __contains__(self, pid: object) -> bool:
        return pid in self._started

    def kill(self, pids: list[int] | None = None) -> None:
        """SIGKILL ``pids`` (default: all), those still the processes recorded; forget them."""
        for pid in list(self._started) if pids is None else pids:
            start = self._started.pop(pid, None)
            if start is not None and started_at(pid) == start:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)


@dataclass(frozen=True)
class Sizes:
    """Every size a workload uses; `QUICK` and `FULL` are the two sets."""

    pool_bytes: int
    write_files: int
    write_file_bytes: int
    rand_object_bytes: int
    rand_seconds: float
    meta_dirs: int
    meta_files_per_dir: int
    meta_stat_seconds: float
    meta_walk_cap_s: float
    create_files: int
    create_file_bytes: int
    ckpt_shards: int
    ckpt_shard_bytes: int
    ckpt_writers: int
    io_block_bytes: int
    bigwrite_bytes: int
    durable_timeout_s: float
    cell_timeout_s: float


FULL = Sizes(
    pool_bytes=1024 * MiB,
    write_files=4,
    write_file_bytes=256 * MiB,
    rand_object_bytes=1024 * MiB,
    rand_seconds=8.0,
    meta_dirs=100,
    meta_files_per_dir=100,
    meta_stat_seconds=10.0,
    meta_walk_cap_s=120.0,
    create_files=1000,
    create_file_bytes=4096,
    ckpt_shards=32,
    ckpt_shard_bytes=32 * MiB,
    ckpt_writers=8,
    io_block_bytes=1 * MiB,
    bigwrite_bytes=1024 * MiB,
    durable_timeout_s=300.0,
    cell_timeout_s=900.0,
)

QUICK = Sizes(
    pool_bytes=64 * MiB,
    write_files=4,
    write_file_bytes=16 * MiB,
    rand_object_bytes=64 * MiB,
    rand_seconds=1.0,
    meta_dirs=10,
    meta_files_per_dir=100,
    meta_stat_seconds=1.0,
    meta_walk_cap_s=20.0,
    create_files=50,
    create_file_bytes=4096,
    ckpt_shards=8,
    ckpt_shard_bytes=4 * MiB,
    ckpt_writers=4,
    io_block_bytes=1 * MiB,
    bigwrite_bytes=64 * MiB,
    durable_timeout_s=60.0,
    cell_timeout_s=120.0,
)


class _SeededEmulator(Emulator):
    """The tierfs emulator, plus fake-gcs-server's ``-data DIR`` preload."""

    def __init__(self, seed_dir: Path) -> None:
        super().__init__()
        self.seed_dir = seed_dir

    def _command(self, binary: Path, port: int) -> list[str]:
        return [*super()._command(binary, port), "-data", str(self.seed_dir)]


def _on_term(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt(signal.Signals(signum).name)


def touch_memory(size: int, spare: int = 4 << 30) -> int:
    """Write every page of ``size`` bytes of fresh memory (less if the machine has less
    to spare), then free it: the bytes touched.

    Why: in a virtual machine whose memory the host backs lazily and takes back when the
    guest frees it (Firecracker, here), the first write to a guest page costs a fault in
    the host, and a FUSE file system fills the page cache by copying into such pages.
    A cold tierfs read of 1 GiB measured 281-395 MB/s when its pages were fresh and
    767-1,128 MB/s when they had just been freed by an earlier pass (perf: the kernel's
    copy into the page cache, `fuse_copy_folio`, 63 % of the daemon's time); after 6
    GiB were touched just before, both measured 1,127 MB/s. Local disk fills the page
    cache by DMA and barely notices (1,366 and 1,693 MB/s). Touching the memory a cold
    pass will need just before it, for every system alike, measures the file systems,
    not which one ran first after the host took its memory back."""
    available = 0
    with contextlib.suppress(OSError, ValueError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                available = int(line.split()[1]) * 1024
    size = min(size, available - spare)
    if size <= 0:
        return 0
    page = mmap.PAGESIZE
    with mmap.mmap(-1, size) as memory:
        for offset in range(0, size - 64 * page + 1, 64 * page):
            memory[offset : offset + 64 * page : page] = b"\1" * 64
    return size


class Env:
    """Start with `open`, always `close` (it is idempotent and registered with atexit)."""

    def __init__(
        self,
        sizes: Sizes,
        *,
        delay_s: float = DEFAULT_DELAY_S,
        rate_bytes_s: float = DEFAULT_RATE_BYTES_S,
        log: Callable[[str], None] = print,
        meta_tree: bool = True,
    ) -> None:
        self.sizes = sizes
        self.meta_tree = meta_tree
        self.delay_s = delay_s
        self.rate_bytes_s = rate_bytes_s
        self.log = log
        self.root = Path(tempfile.mkdtemp(prefix="tierfs-bench-", dir="/var/tmp"))
        self.shm_root: Path | None = None
        self._undo: list[Callable[[], None]] = []
        self._bucket_serial = 0
        self._materialized: set[tuple[Path, str]] = set()
        self.pids = Pids()
        self.emulator: Emulator | None = None
        self.proxy: ShapingProxy | None = None
        self.admin: Direct | None = None
        self._direct: dict[str, Direct] = {}
        self.pool: Pool | None = None
        self.data_objects: dict[str, memoryview] = {}
        self.meta_files: dict[str, int] = {}
        self.meta_dirs: list[str] = []
        self.drop_caches_note = ""
        self.on_daemon: Callable[[int, str], None] | None = None
        # ``--keep-stats DIR``: each tierfs mount's `tierfs stats --json` is kept there,
        # taken just before it is unmounted, named after the cell it served (`cell`).
        self.keep_stats: Path | None = None
        self.cell = ""
        atexit.register(self.close)
        for sig in (signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, _on_term)

    # -- lifecycle ---------------------------------------------------------------------

    def open(self) -> Env:
        sizes = self.sizes
        started = time.monotonic()
        self.check_drop_caches()
        if Path("/dev/shm").is_dir():
            self.shm_root = Path(tempfile.mkdtemp(prefix="tierfs-bench-", dir="/dev/shm"))
            self.defer(lambda: shutil.rmtree(self.shm_root or "/nonexistent", True))
        self.pool = Pool(sizes.pool_bytes)
        seed = self.root / "seed"
        seed.mkdir()
        if self.meta_tree:  # about a minute in the full run: only when a workload needs it
            self._write_meta_tree(seed / META_BUCKET)
        emulator = _SeededEmulator(seed)
        emulator.ready_timeout = 300.0  # loading the seed tree takes a while
        self.emulator = emulator
        self._start_emulator()
        self.defer(emulator.stop)
        emulator.requested_port = emulator.port  # a restart keeps the proxy's target
        self.proxy = ShapingProxy(
            ("127.0.0.1", emulator.port), delay_s=self.delay_s, rate_bytes_s=self.rate_bytes_s
        ).start()
        self.defer(self.proxy.stop)
        self.admin = Direct(emulator.endpoint)
        self.defer(self.admin.close)
        self._upload_data_sets()
        self.log(
            f"set-up: emulator {emulator.endpoint}, shaping proxy {self.proxy.endpoint}"
            f" ({self.proxy.describe()}), data in {time.monotonic() - started:.1f}s"
        )
        return self

    def restart_emulator(self) -> None:
        """A new emulator process on the same port, loaded with the same data sets.

        fake-gcs-server keeps every object and upload buffer it has seen in memory: in one
        full run it reached 19 GB and was OOM-killed during the second profile. Each
        profile therefore starts with a fresh one (the seed tree loads again; the proxy
        forwards to the same port)."""
        assert self.emulator is not None and self.admin is not None
        started = time.monotonic()
        for direct in self._direct.values():
            direct.close()
        self._direct.clear()
        self.admin.close()
        self.emulator.stop()
        self._start_emulator()
        self.admin = Direct(self.emulator.endpoint)
        self.defer(self.admin.close)
        self._upload_data_sets()
        self.log(f"emulator restarted, data loaded again in {time.monotonic() - started:.1f}s")

    def emulator_needs_restart(self) -> str | None:
        """Why the emulator should be started afresh before the next workload, or None: it
        died, or it holds more than `EMULATOR_RSS_LIMIT` (in one full run it reached 20 GB
        within the first profile, after the save workloads, and was OOM-killed: every cell
        after it failed with "connection refused")."""
        assert self.emulator is not None
        pid = self.emulator.pid
        if not self.emulator.running or pid is None:
            return "it is not running"
        try:
            with open(f"/proc/{pid}/status", encoding="ascii") as status:
                for line in status:
                    if line.startswith("VmRSS:"):
                        rss = int(line.split()[1]) * 1024
                        if rss > EMULATOR_RSS_LIMIT:
                            return f"it holds {rss / (1 << 30):.1f} GiB"
        except OSError:
            return "it is gone"
        return None

    def _start_emulator(self) -> None:
        assert self.emulator is not None
        # Go returns freed memory lazily: without a soft limit the emulator grows past
        # 9 GiB over a full run (deleted scratch objects, upload buffers).
        previous = os.environ.get("GOMEMLIMIT")
        os.environ["GOMEMLIMIT"] = f"{max(4 << 30, 4 * self.sizes.pool_bytes)}"
        try:
            self.emulator.start()
        finally:
            if previous is None:
                del os.environ["GOMEMLIMIT"]
            else:
                os.environ["GOMEMLIMIT"] = previous

    def defer(self, undo: Callable[[], None]) -> None:
        self._undo.append(undo)

    def close(self) -> None:
        atexit.unregister(self.close)
        while self._undo:
            undo = self._undo.pop()
            try:
                undo()
            except Exception as err:
                self.log(f"cleanup: {type(err).__name__}: {err}")
        for direct in self._direct.values():
            direct.close()
        self._direct.clear()
        self.pids.kill()
        for mountpoint in mounts_below(self.root):  # a close interrupted half-way left it
            subprocess.run(
                ["fusermount3", "-u", "-z", mountpoint], check=False, capture_output=True
            )
        shutil.rmtree(self.root, ignore_errors=True)

    # -- endpoints and clients ---------------------------------------------------------

    def endpoint(self, profile: str) -> str:
        assert self.emulator is not None and self.proxy is not None
        return self.proxy.endpoint if profile == "shaped" else self.emulator.endpoint

    def direct(self, profile: str) -> Direct:
        """The parallel client for a profile (through the proxy when shaped)."""
        if profile not in self._direct:
            self._direct[profile] = Direct(self.endpoint(profile))
        return self._direct[profile]

    def new_bucket(self, tag: str) -> str:
        """A fresh, empty scratch bucket; emptied again at `scrub`."""
        assert self.admin is not None
        self._bucket_serial += 1
        name = f"scratch-{self._bucket_serial:03d}-{tag}"[:60].rstrip("-")
        self.admin.create_bucket(name)
        return name

    def scrub(self, bucket: str) -> None:
        assert self.admin is not None
        self.admin.delete_all(bucket)

    # -- page cache --------------------------------------------------------------------

    def check_drop_caches(self) -> None:
        try:
            self.drop_caches()
        except OSError as err:
            self.drop_caches_note = (
                f"cannot drop the page cache ({err.strerror}): cold reads use fresh mounts only"
            )
            self.log(self.drop_caches_note)

    def drop_caches(self) -> None:
        if self.drop_caches_note:
            return
        os.sync()
        with open("/proc/sys/vm/drop_caches", "w") as knob:
            knob.write("3\n")

    # -- data sets ---------------------------------------------------------------------

    def _write_meta_tree(self, base: Path) -> None:
        sizes = self.sizes
        for d in range(sizes.meta_dirs):
            directory = f"d{d:03d}"
            self.meta_dirs.append(directory)
            (base / directory).mkdir(parents=True)
            for f in range(sizes.meta_files_per_dir):
                name = f"{directory}/f{d * sizes.meta_files_per_dir + f:05d}"
                size = (d * 7919 + f * 104729) % 2000 + 1
                (base / name).write_bytes(b"m" * size)
                self.meta_files[name] = size

    def _upload_data_sets(self) -> None:
        assert self.admin is not None and self.pool is not None
        sizes = self.sizes
        admin = self.admin
        admin.create_bucket(DATA_BUCKET)
        for i in range(sizes.write_files):
            self.data_objects[f"seq/part-{i}"] = self.pool.slice(
                i * sizes.write_file_bytes, sizes.write_file_bytes
            )
        self.data_objects["rand/blob"] = self.pool.slice(0, sizes.rand_object_bytes)
        placeholders = [("seq/", b""), ("rand/", b"")]
        admin.upload_many(DATA_BUCKET, [*placeholders, *self.data_objects.items()])
        expected = {name: crc32c_b64(data) for name, data in self.data_objects.items()}
        admin.wait_for(DATA_BUCKET, expected, timeout_s=10)
        if not self.meta_tree:
            return
        # Directory placeholders for mounts without implicit directories.
        admin.upload_many(META_BUCKET, [(f"{d}/", b"") for d in self.meta_dirs])
        items = admin.walk(META_BUCKET)
        found = {i["name"]: int(i["size"]) for i in items if not i["name"].endswith("/")}
        if found != self.meta_files:
            raise RuntimeError(
                f"the seeded metadata tree has {len(found)} objects, expected"
                f" {len(self.meta_files)}: the emulator's -data preload did not work"
            )

    def materialize(self, base: Path, bucket: str) -> Path:
        """A local directory holding what bucket ``bucket`` holds (data sets only)."""
        target = base / bucket
        if (base, bucket) in self._materialized:
            return target
        target.mkdir(parents=True, exist_ok=True)
        if bucket == DATA_BUCKET:
            for name, data in self.data_objects.items():
                (target / name).parent.mkdir(parents=True, exist_ok=True)
                (target / name).write_bytes(data)
        elif bucket == META_BUCKET:
            for name, size in self.meta_files.items():
                (target / name).parent.mkdir(parents=True, exist_ok=True)
                (target / name).write_bytes(b"m" * size)
        self._materialized.add((base, bucket))
        return target

    # -- processes ---------------------------------------------------------------------

    def spawn(self, args: list[str], log_path: Path) -> subprocess.Popen[bytes]:
        """Start a helper process in its own session; killed by PID at `close` at the latest."""
        with open(log_path, "ab") as log:
            proc = subprocess.Popen(
                args,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                start_new_session=True,
            )
        self.pids.add(proc.pid)
        return proc
