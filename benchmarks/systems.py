"""The systems under comparison: a registry of small classes, one per system.

A new system is one class here and one line in `SYSTEMS`. Every system
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
from tierfs.cli.daemon import daemon_pids

TIERFS = str(Path(sys.executable).parent / "tierfs")
CHECKPOINT_OPTIONS = (
    "implicit-dirs,metadata-cache:negative-ttl-secs:0,metadata-cache:ttl-secs:-1,"
    "metadata-cache:stat-cache-max-size-mb:-1,metadata-cache:type-cache-max-size-mb:-1,"
    "file-cache:max-size-mb:-1,file-cache:cache-file-for-range-read:true,"
    "file-system:kernel-list-cache-ttl-secs:0,file-cache:enable-parallel-downloads:true,"
    "read_ahead_kb=1024,write:enable-streaming-writes:true"
)


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
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
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


class Tierfs(FuseSystem):
    """tierfs with default options, as ``tierfs mount`` runs it."""

    name = "tierfs"
    description = "tierfs, default options"

    def options(self, cache_dir: Path) -> list[str]:
        return []

    def _mount(self, bucket: str, mountpoint: Path, cache_dir: Path, log: Path) -> None:
        command = [
            TIERFS,
            "mount",
            f"--custom-endpoint={self.env.endpoint(self.profile)}",
            "--anonymous-access",
            "--log-severity=warning",
            "--log-format=text",
            f"--log-file={log}",
            *self.options(cache_dir),
            bucket,
            str(mountpoint),
        ]
        result = subprocess.run(command, capture_output=True, text=True, timeout=180)
        if result.returncode != 0:
            raise RuntimeError(
                f"tierfs mount failed ({result.returncode}): {result.stderr.strip()}"
            )
        self.env.pids.update(self.daemon_pids())

    def _stop(self, mountpoint: Path) -> None:
        result = subprocess.run(
            [TIERFS, "unmount", str(mountpoint)], capture_output=True, text=True, timeout=900
        )
        if result.returncode != 0:
            raise RuntimeError(f"tierfs unmount failed: {result.stderr.strip()}")

    def daemon_pids(self) -> list[int]:
        return daemon_pids(str(self.mountpoint)) if self.mountpoint is not None else []


class TierfsCheckpoint(Tierfs):
    """tierfs with the GKE multi-tier-checkpointing option line and a cache dir."""

    name = "tierfs-ckpt"
    description = "tierfs, checkpointing -o line + --cache-dir"

    def options(self, cache_dir: Path) -> list[str]:
        return ["-o", CHECKPOINT_OPTIONS, f"--cache-dir={cache_dir}"]


class TierfsCheckpointSerial(TierfsCheckpoint):
    """The checkpointing line with parallel downloads off: the A/B for parallel downloads
    (cold reads, with and without, on the same link)."""

    name = "tierfs-ckpt-serial"
    description = "tierfs-ckpt, --file-cache-enable-parallel-downloads=false"
    only = ("read",)

    def options(self, cache_dir: Path) -> list[str]:
        return [*super().options(cache_dir), "--file-cache-enable-parallel-downloads=false"]


class TierfsStaged(Tierfs):
    """Streaming writes off: the file is staged locally and uploaded whole at close."""

    name = "tierfs-staged"
    description = "tierfs, --enable-streaming-writes=false (staged writes)"
    only = ("bigwrite",)

    def options(self, cache_dir: Path) -> list[str]:
        return ["--enable-streaming-writes=false"]


class TierfsStream64(Tierfs):
    """Streaming with 64 MiB chunks, the size of the staged path's upload chunks: the
    emulator copies the whole object at every chunk it receives (O(n^2) in chunks), so
    this is the like-for-like streaming vs staged comparison on it."""

    name = "tierfs-stream64"
    description = "tierfs, --write-block-size-mb=64 (streaming)"
    only = ("bigwrite",)

    def options(self, cache_dir: Path) -> list[str]:
        return ["--write-block-size-mb=64"]


SAVES: tuple[str, ...] = ("bigwrite", "ckpt", "create", "orbax", "dcp", "remove")


class TierfsWriteBack(Tierfs):
    """Write-back: close() once the file is durable in the local journal (the cache dir);
    the kernel writes new files straight into it (FUSE passthrough)."""

    name = "tierfs-wb"
    description = "tierfs, --write-back --cache-dir"
    only = SAVES

    def options(self, cache_dir: Path) -> list[str]:
        return ["--write-back", f"--cache-dir={cache_dir}"]


class TierfsWriteBackDaemon(TierfsWriteBack):
    """Write-back with every write through the daemon: where passthrough is missing."""

    name = "tierfs-wb-daemon"
    description = "tierfs, --write-back --cache-dir --write-passthrough=false"

    def options(self, cache_dir: Path) -> list[str]:
        return [*super().options(cache_dir), "--write-passthrough=false"]


class TierfsWriteBackTmpfs(TierfsWriteBack):
    """Write-back into a journal on tmpfs (the RAM tier of multi-tier checkpointing): it
    survives a daemon crash, not a reboot. No SSD tier."""

    name = "tierfs-wb-tmpfs"
    description = "tierfs, --write-back --write-back-dir on tmpfs"

    @classmethod
    def unavailable(cls) -> str | None:
        return None if Path("/dev/shm").is_dir() else "no /dev/shm"

    def options(self, cache_dir: Path) -> list[str]:
        assert self.env.shm_root is not None
        return ["--write-back", f"--write-back-dir={self.env.shm_root / ('wb-' + cache_dir.name)}"]


class TierfsWriteBackHeld(TierfsWriteBack):
    """Write-back with the uploads held until the save is over (a long write-back delay,
    then `tierfs sync`): the save without uploads beside it, which the goal "uploads do not
    slow the writer" compares tierfs-wb with."""

    name = "tierfs-wb-held"
    description = "tierfs, --write-back --cache-dir --write-back-delay-secs=3600, then tierfs sync"
    only = ("ckpt",)

    def options(self, cache_dir: Path) -> list[str]:
        return [*super().options(cache_dir), "--write-back-delay-secs=3600"]

    def before_durable(self, root: Path) -> None:
        subprocess.run([TIERFS, "sync", str(root)], check=True, capture_output=True, timeout=900)


class TierfsListCache(Tierfs):
    """Listings kept as rclone keeps them (its --dir-cache-time is 5 minutes): the kernel
    list cache and the stat cache on. With tierfs's defaults (gcsfuse's), every readdir
    lists GCS again, so a "warm" ``ls -lR`` is a cold one."""

    name = "tierfs-lists"
    description = "tierfs, --kernel-list-cache-ttl-secs=300 --metadata-cache-ttl-secs=-1"
    only = ("meta",)

    def options(self, cache_dir: Path) -> list[str]:
        return ["--kernel-list-cache-ttl-secs=300", "--metadata-cache-ttl-secs=-1"]


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


class Rclone(SpawnedFuse):
    """``rclone mount --vfs-cache-mode full`` on its GCS backend, pointed at the same endpoint.

    ``--vfs-write-back 0s``: upload as soon as a file is closed (the default waits 5 s of
    idleness first, which would only add a constant to "durable"). rclone uploads files
    over 8 MiB as resumable uploads in 16 MiB chunks (the Go client's default), which the
    emulator serves slowly; its durable-write numbers carry that cost.
    """

    name = "rclone"
    description = "rclone mount --vfs-cache-mode full"

    @classmethod
    def unavailable(cls) -> str | None:
        if shutil.which("rclone") is None:
            return "rclone is not installed (make bench installs the Debian package)"
        return super().unavailable()

    def _mount(self, bucket: str, mountpoint: Path, cache_dir: Path, log: Path) -> None:
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
                "rclone",
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
    only = ("create", "orbax", "dcp", "meta", "read", "rand")

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


SYSTEMS: dict[str, type[System]] = {
    cls.name: cls
    for cls in (
        Tierfs,
        TierfsCheckpoint,
        TierfsCheckpointSerial,
        TierfsListCache,
        TierfsStaged,
        TierfsStream64,
        TierfsWriteBack,
        TierfsWriteBackDaemon,
        TierfsWriteBackTmpfs,
        TierfsWriteBackHeld,
        Rclone,
        NullFuse,
        GcsDirect,
        LocalDir,
        Tmpfs,
    )
}
# Run by `make bench` (and --quick); any other on request (--systems).
DEFAULT_SYSTEMS = (
    "tierfs",
    "tierfs-ckpt",
    "tierfs-ckpt-serial",
    "tierfs-lists",
    "tierfs-staged",
    "tierfs-stream64",
    "tierfs-wb",
    "tierfs-wb-daemon",
    "tierfs-wb-tmpfs",
    "tierfs-wb-held",
    "rclone",
    "pyfuse3-null",
    "gcs-direct",
    "local",
    "tmpfs",
)
