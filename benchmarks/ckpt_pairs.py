"""``python -m benchmarks.ckpt_pairs [--rounds N]``: the checkpoint save (32 x 32 MiB,
8 writers, fsync each, until the last close) on a write-back mount with its uploads
running, on one with them held (``--write-back-delay-secs=3600``), and on local disk,
interleaved, N rounds, the mounts against one embedded emulator.

Why: issue 14 asks that a save with uploads running keep 0.8x of the same save with
them held. One run of each (``make bench``'s ``tierfs-wb`` and ``tierfs-wb-held``
cells) cannot say that on a disk whose fsync throughput varies several times from one
run to the next (a local save read 643 MiB/s in one round and 2,254 in another);
interleaved rounds and their medians can. Mounts are unmounted and
their directories removed even when a save fails.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tierfs.cli.emulator import Emulator

TIERFS = str(Path(sys.executable).parent / "tierfs")
SHARDS, SHARD_BYTES, WRITERS, BLOCK = 32, 32 << 20, 8, 1 << 20
HELD = ["--write-back-delay-secs=3600"]


def _write(path: Path, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        for offset in range(0, len(data), BLOCK):
            os.write(fd, data[offset : offset + BLOCK])
        os.fsync(fd)
    finally:
        os.close(fd)


def save(root: Path, data: bytes) -> float:
    """MiB/s of one save into ``root`` (made here), until the last close."""
    root.mkdir()
    start = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(WRITERS) as pool:
        list(pool.map(lambda i: _write(root / f"shard-{i:03d}", data), range(SHARDS)))
    return SHARDS * SHARD_BYTES / (1 << 20) / (time.monotonic() - start)


def mounted_save(emulator: Emulator, data: bytes, extra: list[str]) -> float:
    bucket = f"pairs-{time.time_ns()}"
    emulator.create_bucket(bucket)
    scratch = Path(tempfile.mkdtemp(prefix="tierfs-pairs-", dir="/var/tmp"))
    mnt = scratch / "mnt"
    mnt.mkdir()
    try:
        subprocess.run(
            [
                TIERFS,
                "mount",
                f"--custom-endpoint={emulator.endpoint}",
                "--anonymous-access",
                "--write-back",
                f"--cache-dir={scratch / 'cache'}",
                *extra,
                bucket,
                str(mnt),
            ],
            check=True,
        )
        try:
            speed = save(mnt / "step", data)
            subprocess.run([TIERFS, "sync", str(mnt)], check=True)  # before the next pair
        finally:
            subprocess.run(["fusermount3", "-u", str(mnt)], check=False)
        return speed
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def local_save(data: bytes) -> float:
    scratch = Path(tempfile.mkdtemp(prefix="tierfs-pairs-", dir="/var/tmp"))
    try:
        return save(scratch / "step", data)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=4)
    args = parser.parse_args(argv)
    data = os.urandom(SHARD_BYTES)
    results: dict[str, list[float]] = {"uploads running": [], "uploads held": [], "local": []}
    with Emulator() as emulator:
        runs = [
            ("uploads running", lambda: mounted_save(emulator, data, [])),
            ("uploads held", lambda: mounted_save(emulator, data, HELD)),
            ("local", lambda: local_save(data)),
        ]
        for round_ in range(args.rounds):  # each goes first in turn: the disk drifts
            for name, run in runs[round_ % 3 :] + runs[: round_ % 3]:
                results[name].append(run())
    medians = {name: statistics.median(values) for name, values in results.items()}
    for name, values in results.items():
        shown = " / ".join(f"{v:,.0f}" for v in values)
        print(f"{name}: {shown} MiB/s (median {medians[name]:,.0f})")
    running = medians["uploads running"]
    print(f"running / held, medians: {running / medians['uploads held']:.2f} (goal >= 0.8)")
    print(f"running / local disk, medians: {running / medians['local']:.2f} (goal >= 0.8)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
