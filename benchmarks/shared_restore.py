"""``python -m benchmarks.shared_restore [--mib N] [--mounts M] [--repeat R]``: the shared
tier (issue 19): M mounts restoring one checkpoint at once, beside one mount alone.

A checkpoint of N MiB (8 shards) in an emulator bucket. Each round:

1. *single*: one mount with its own cold SSD tier (``cache-dir``), no shared tier,
   restores every shard (8 reader threads, 1 MiB reads): its MB/s and GCS bytes read;
2. *shared*: M mounts, each with its own cold SSD tier and one shared directory (a
   local directory standing for NFS), restore it at the same moment: each mount's MB/s
   and the GCS bytes they read together (the goal: at most 1.1x the checkpoint);
3. *late*: one more mount, after them: its GCS media reads (the goal: 0);
4. *apart*: M mounts at once again, each with its own cold SSD tier and no shared tier:
   what each node gets without the shared tier under the same contention. On one
   machine the M daemons share its cores (and the emulator's), so *shared* is compared
   with *apart* as well as with *single*; and each phase's daemon CPU seconds per GiB
   restored says whether the shared tier costs a node more CPU than its own SSD tier.

Every byte read is compared with what was uploaded. The page cache is dropped before
each phase. Mounts and the emulator are stopped on the way out, whatever happens. Not
part of ``make bench`` (``make bench-shared`` runs it); on a shared, 2-core machine the
numbers are noisy: run ``--repeat`` and read them as pairs.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from benchmarks.read_rss import mounted
from benchmarks.tierfs_systems import TIERFS
from tierfs.cli.emulator import Emulator

MiB = 1 << 20
SHARDS = 8
BUCKET = "shared-restore"


def drop_page_cache() -> None:
    subprocess.run(["sync"], check=True)
    with contextlib.suppress(OSError):
        Path("/proc/sys/vm/drop_caches").write_text("3\n")


def stats(mountpoint: Path) -> dict:
    result = subprocess.run(
        [TIERFS, "stats", "--json", str(mountpoint)], capture_output=True, text=True, check=True
    )
    return json.loads(result.stdout)


def restore(mountpoint: Path, names: list[str], expected: dict[str, bytes]) -> float:
    """Read every shard with one thread each; seconds taken. Raises if a byte differs."""

    def one(name: str) -> None:
        parts = []
        with open(mountpoint / name, "rb", buffering=0) as handle:
            while chunk := handle.read(MiB):
                parts.append(chunk)
        if b"".join(parts) != expected[name]:
            raise AssertionError(f"{mountpoint}/{name}: wrong bytes")

    start = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(len(names)) as pool:
        list(pool.map(one, names))
    return time.monotonic() - start


def cpu_seconds(pids: list[int]) -> float:
    """User + system CPU seconds the processes have used so far."""
    total = 0.0
    for pid in pids:
        with open(f"/proc/{pid}/stat", encoding="ascii") as stat:
            fields = stat.read().rsplit(") ", 1)[1].split()
        total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return total


@contextlib.contextmanager
def many(
    emulator: Emulator,
    scratch: Path,
    label: str,
    count: int,
    shared: Path | None,
    pids: list[int] | None = None,
) -> Iterator[list[Path]]:
    """``count`` mounts with cold SSD tiers (and the shared directory, if any); their
    daemons' PIDs added to ``pids``."""
    with contextlib.ExitStack() as stack:
        points = []
        for i in range(count):
            point = scratch / f"{label}-{i}"
            point.mkdir()
            options = ["--implicit-dirs", f"--cache-dir={scratch / f'{label}-ssd-{i}'}"]
            if shared is not None:
                options += [
                    "--enable-experimental-shared-chunk-cache",
                    f"--file-cache-shared-cache-dir={shared}",
                ]
            started = stack.enter_context(mounted(emulator, BUCKET, point, *options))
            if pids is not None:
                pids.extend(started)
            points.append(point)
        yield points


def at_once(points: list[Path], names: list[str], expected: dict[str, bytes]) -> list[float]:
    """Every mount restores the checkpoint at the same moment; each one's seconds."""
    times: dict[int, float] = {}
    start = threading.Barrier(len(points))

    def node(i: int) -> None:
        start.wait()
        times[i] = restore(points[i], names, expected)

    with concurrent.futures.ThreadPoolExecutor(len(points)) as pool:
        list(pool.map(node, range(len(points))))
    return [times[i] for i in range(len(points))]


def phase(points: list[Path], pids: list[int], seconds: list[float], total: int) -> dict:
    """One phase's numbers: each mount's MB/s, GCS and SSD-tier bytes read by them all,
    and their daemons' CPU seconds per GiB restored, a mount."""
    numbers = [stats(p) for p in points]
    return {
        "mbs": [total / s / 1e6 for s in seconds],
        "gcs_bytes": sum(n["gcs"]["bytes_read"] for n in numbers),
        "cpu_per_gib": cpu_seconds(pids) / (total / (1 << 30)) / len(points),
        "ssd_read": sum(n["data"]["tiers"]["ssd"]["bytes_read"] for n in numbers),
        "numbers": numbers,
    }


def one_round(
    emulator: Emulator,
    scratch: Path,
    total: int,
    mounts: int,
    names: list[str],
    expected: dict[str, bytes],
) -> dict:
    drop_page_cache()
    pids: list[int] = []
    with many(emulator, scratch, "single", 1, None, pids) as points:
        single = phase(points, pids, [restore(points[0], names, expected)], total)
        single["mbs"] = single["mbs"][0]
    shared = scratch / "share"
    shared.mkdir()
    drop_page_cache()
    pids = []
    with many(emulator, scratch, "node", mounts, shared, pids) as points:
        together = phase(points, pids, at_once(points, names, expected), total)
        tiers = [n["data"]["tiers"]["shared"] for n in together["numbers"]]
        together["waits"] = sum(t["waits"] for t in tiers)
        together["shared_hits"] = sum(t["hits"] for t in tiers)
        drop_page_cache()
        with many(emulator, scratch, "late", 1, shared) as (late,):
            seconds = restore(late, names, expected)
            late_stats = stats(late)
    drop_page_cache()
    pids = []
    with many(emulator, scratch, "apart", mounts, None, pids) as points:
        apart = phase(points, pids, at_once(points, names, expected), total)
    return {
        "single": single,
        "shared": together,
        "late": {"mbs": total / seconds / 1e6, "media_reads": late_stats["gcs"]["media_reads"]},
        "apart": apart,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.shared_restore")
    parser.add_argument("--mib", type=int, default=1024, help="checkpoint size in MiB")
    parser.add_argument("--mounts", type=int, default=4, help="mounts restoring at once")
    parser.add_argument("--repeat", type=int, default=1, help="rounds")
    args = parser.parse_args(argv)
    shard = args.mib * MiB // SHARDS
    total = shard * SHARDS
    with tempfile.TemporaryDirectory(dir="/var/tmp") as tmp, Emulator() as emulator:
        emulator.create_bucket(BUCKET)
        bucket = emulator.client().bucket(BUCKET)
        expected: dict[str, bytes] = {}
        for i in range(SHARDS):
            name = f"ckpt/shard-{i}"
            expected[name] = os.urandom(shard)
            bucket.blob(name, chunk_size=256 * MiB).upload_from_string(expected[name])
        names = list(expected)
        for r in range(args.repeat):
            scratch = Path(tmp) / f"round-{r}"
            scratch.mkdir()
            result = one_round(emulator, scratch, total, args.mounts, names, expected)
            single, shared, late = result["single"], result["shared"], result["late"]
            apart = result["apart"]
            worst, worst_apart = min(shared["mbs"]), min(apart["mbs"])
            print(
                f"round {r + 1}: checkpoint {total / MiB:.0f} MiB\n"
                f"  single mount, cold SSD tier: {single['mbs']:.0f} MB/s,"
                f" GCS read {single['gcs_bytes'] / total:.2f}x the checkpoint,"
                f" daemon CPU {single['cpu_per_gib']:.2f} s/GiB;"
                f" SSD tier read {single['ssd_read'] / total:.2f}x\n"
                f"  {args.mounts} mounts at once, shared tier: "
                + ", ".join(f"{m:.0f}" for m in shared["mbs"])
                + f" MB/s (slowest {worst / single['mbs']:.2f}x the single mount,"
                f" {worst / worst_apart:.2f}x the slowest apart);"
                f" GCS read {shared['gcs_bytes'] / total:.2f}x the checkpoint;"
                f" {shared['waits']} waits, {shared['shared_hits']} shared hits;"
                f" daemon CPU {shared['cpu_per_gib']:.2f} s/GiB a mount;"
                f" SSD tier read {shared['ssd_read'] / total / args.mounts:.2f}x a mount\n"
                f"  a mount joining later: {late['mbs']:.0f} MB/s,"
                f" {late['media_reads']} GCS media reads\n"
                f"  {args.mounts} mounts at once, no shared tier (apart): "
                + ", ".join(f"{m:.0f}" for m in apart["mbs"])
                + f" MB/s; GCS read {apart['gcs_bytes'] / total:.2f}x the checkpoint;"
                f" daemon CPU {apart['cpu_per_gib']:.2f} s/GiB a mount;"
                f" SSD tier read {apart['ssd_read'] / total / args.mounts:.2f}x a mount",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
