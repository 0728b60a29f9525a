"""tierfs as the benchmarks run it: with default options (`Tierfs`), and each variant a
workload compares (the GKE checkpointing option line, write modes, kept listings). The
life cycle they answer is `benchmarks.systems.System`'s."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from benchmarks.systems import FuseSystem
from tierfs.cli.daemon import daemon_pids

TIERFS = str(Path(sys.executable).parent / "tierfs")
CHECKPOINT_OPTIONS = (
    "implicit-dirs,metadata-cache:negative-ttl-secs:0,metadata-cache:ttl-secs:-1,"
    "metadata-cache:stat-cache-max-size-mb:-1,metadata-cache:type-cache-max-size-mb:-1,"
    "file-cache:max-size-mb:-1,file-cache:cache-file-for-range-read:true,"
    "file-system:kernel-list-cache-ttl-secs:0,file-cache:enable-parallel-downloads:true,"
    "read_ahead_kb=1024,write:enable-streaming-writes:true"
)


class Tierfs(FuseSystem):
    """tierfs with default options, as ``tierfs mount`` runs it."""

    name = "tierfs"
    description = "tierfs, default options"
    persistent = False  # no cache dir: only the RAM tier, gone with the daemon
    tierfs_command = TIERFS  # (what workloads ask `tierfs stats` with)

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
        if self.env.keep_stats is not None:
            self._keep_stats(mountpoint, self.env.keep_stats)
        result = subprocess.run(
            [TIERFS, "unmount", str(mountpoint)], capture_output=True, text=True, timeout=900
        )
        if result.returncode != 0:
            raise RuntimeError(f"tierfs unmount failed: {result.stderr.strip()}")

    def daemon_pids(self) -> list[int]:
        return daemon_pids(str(self.mountpoint)) if self.mountpoint is not None else []

    def _keep_stats(self, mountpoint: Path, directory: Path) -> None:
        """``--keep-stats``: this mount's `tierfs stats --json`, as it is before unmount,
        in ``directory`` as CELL-N.json (a cell may mount several times). What a cell's
        number alone cannot say (a fill's bytes, GCS requests, pieces kept) is then there
        for the run that surprised; a mount that cannot answer leaves a note instead."""
        directory.mkdir(parents=True, exist_ok=True)
        stem = self.env.cell or f"{self.profile}-{self.name}"
        serial = 1
        while (directory / f"{stem}-{serial}.json").exists():
            serial += 1
        result = subprocess.run(
            [TIERFS, "stats", "--json", str(mountpoint)], capture_output=True, text=True, timeout=60
        )
        text = result.stdout if result.returncode == 0 else json.dumps({"error": result.stderr})
        (directory / f"{stem}-{serial}.json").write_text(text, encoding="utf-8")


class TierfsCheckpoint(Tierfs):
    """tierfs with the GKE multi-tier-checkpointing option line and a cache dir."""

    name = "tierfs-ckpt"
    persistent = True
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
    persistent = True
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
