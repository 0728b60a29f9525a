"""``python -m benchmarks.read_rss [--gib N]``: the memory bound of reads (README, "Memory").

Puts N objects of 1 GiB in an emulator bucket and reads them all, in 1 MiB reads,
through one mount: first with the default options, then with the GKE checkpoint line
and a cache dir. Prints, for each, the daemon's peak RSS (VmHWM) next to the bound
the README states: the RAM tier plus a fixed overhead of 64 MiB plus two copies of
each block being downloaded at once (``max-parallel-downloads`` x block size x 2).

Why 1 GiB objects and not one N GiB object: fake-gcs-server copies the whole object
at every resumable-upload chunk (see `benchmarks.stream_rss`), so a 4 GiB upload takes
minutes and may stall it; a server-side copy of one 1 GiB object is instant. The bound
is about how much goes through the daemon, not about one file. Not part of
``make bench``. The mount and the emulator are stopped on the way out.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from benchmarks.systems import vm_hwm_kib
from benchmarks.tierfs_systems import CHECKPOINT_OPTIONS, TIERFS
from mount_options import load, parse_flags
from tierfs.cli.daemon import daemon_pids
from tierfs.cli.emulator import Emulator

GiB = 1 << 30
FIXED_MIB = 64  # interpreter, tables: the README's fixed part


@contextlib.contextmanager
def mounted(emulator: Emulator, bucket: str, mountpoint: Path, *args: str) -> Iterator[list[int]]:
    """A tierfs mount of ``bucket``; yields the daemon's PIDs; unmounted (and the daemon
    killed if it lingers) on the way out, whatever happens."""
    command = [TIERFS, "mount", f"--custom-endpoint={emulator.endpoint}", "--anonymous-access"]
    subprocess.run([*command, *args, bucket, str(mountpoint)], check=True)
    pids = daemon_pids(str(mountpoint))
    try:
        yield pids
    finally:
        subprocess.run([TIERFS, "unmount", str(mountpoint)], check=False)
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, 9)


def bound_mib(args: list[str]) -> int:
    """The README's bound for a mount with these options."""
    config = load(parse_flags(args).parsed)
    block = config["ram-cache:block-size-mb"]
    downloads = config["file-cache:max-parallel-downloads"]
    return config["ram-cache:max-size-mb"] + FIXED_MIB + 2 * max(1, downloads) * block


def read_all(paths: list[Path]) -> int:
    buffer = bytearray(1 << 20)
    total = 0
    for path in paths:
        with open(path, "rb", buffering=0) as handle:
            while count := handle.readinto(buffer):
                total += count
    return total


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.read_rss")
    parser.add_argument("--gib", type=int, default=4, help="GiB read through the mount")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(dir="/var/tmp") as scratch, Emulator() as emulator:
        emulator.create_bucket("read-rss")
        bucket = emulator.client().bucket("read-rss")
        piece = os.urandom(64 << 20)
        bucket.blob("f0", chunk_size=256 << 20).upload_from_string(piece * (GiB // len(piece)))
        names = [f"f{i}" for i in range(args.gib)]
        for name in names[1:]:
            bucket.copy_blob(bucket.blob("f0"), bucket, name)
        setups = {
            "defaults": [],
            "checkpoint line": ["-o", CHECKPOINT_OPTIONS, f"--cache-dir={scratch}/cache"],
        }
        for label, options in setups.items():
            mountpoint = Path(scratch) / "mnt"
            mountpoint.mkdir(exist_ok=True)
            with mounted(emulator, "read-rss", mountpoint, *options) as pids:
                start = time.monotonic()
                total = read_all([mountpoint / name for name in names])
                elapsed = time.monotonic() - start
                peak = max((vm_hwm_kib(pid) or 0) for pid in pids) // 1024
            assert total == args.gib * GiB, f"read {total} bytes"
            print(
                f"{label}: read {args.gib} GiB in {elapsed:.0f} s"
                f" ({total / elapsed / 1e6:.0f} MB/s); daemon peak RSS {peak} MiB"
                f" (bound {bound_mib(options)} MiB)"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
