"""``python -m benchmarks.stream_rss [--mib N] [--block-mb M]``: the memory bound of
streaming writes.

Mounts an emulator bucket with default options (streaming on) and the given
``write:block-size-mb``, writes one N MiB file in 1 MiB writes, and prints the
daemon's peak RSS (VmHWM) and the rate. The bound under test: peak RSS stays near
3 x block size + a fixed overhead whatever N is (see tierfs/core/streaming.py).

Not part of ``make bench``, and 1 GiB by default: fake-gcs-server copies the whole
object at every resumable-upload chunk it receives (O(n^2) in chunks: 28 MB/s for
512 MiB in 32 MiB chunks, 81 MB/s in 256 MiB chunks), and with 256 MiB chunks it
stopped answering after about 1 GiB (seen 2026-11-30: a chunk PUT got no reply with
the emulator idle), so the 4 GiB the issue asks for cannot be streamed to it. The
mount and the emulator are stopped on the way out, whatever happens.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.read_rss import mounted
from benchmarks.systems import vm_hwm_kib
from tierfs.cli.emulator import Emulator


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.stream_rss")
    parser.add_argument("--mib", type=int, default=1024, help="file size in MiB")
    parser.add_argument("--block-mb", type=int, default=32, help="write:block-size-mb")
    args = parser.parse_args(argv)
    piece = os.urandom(1 << 20)
    with tempfile.TemporaryDirectory(dir="/var/tmp") as scratch, Emulator() as emulator:
        emulator.create_bucket("stream-rss")
        mountpoint = Path(scratch) / "mnt"
        mountpoint.mkdir()
        with mounted(
            emulator, "stream-rss", mountpoint, f"--write-block-size-mb={args.block_mb}"
        ) as pids:
            start = time.monotonic()
            with open(mountpoint / "big", "wb", buffering=0) as handle:
                for _ in range(args.mib):
                    handle.write(piece)
            elapsed = time.monotonic() - start
            peak = max((vm_hwm_kib(pid) or 0) for pid in pids) // 1024
        size = emulator.client().bucket("stream-rss").get_blob("big").size
        assert size == args.mib << 20, f"object is {size} bytes"
        print(
            f"streamed {args.mib} MiB in {args.block_mb} MiB blocks in {elapsed:.0f} s"
            f" ({(args.mib << 20) / elapsed / 1e6:.0f} MB/s); daemon peak RSS {peak} MiB"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
