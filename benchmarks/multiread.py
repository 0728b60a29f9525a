"""Several files read at once, cold: a data loader's shards, or the ranks of one node each
restoring its own checkpoint file. Its rules are `benchmarks.workloads`'.

Why a workload of its own: `read` reads its files one after the other, so it never shows
what readers at once do to each other. In session 56, four 256 MiB files read at once at
the defaults (no cache dir) each went as far ahead as one file alone may, so blocks read
ahead were evicted from the RAM tier before they were read and fetched again: GCS served
1.4-1.8x the bytes (a probe; nothing in the benchmarks could show it). The files now
share the read-ahead depth; this workload keeps that in view beside the peers: the rate,
the bytes GCS served per byte read (tierfs says how many it fetched: `tierfs stats`), and
the daemon's peak RSS (the generic row).
"""

from __future__ import annotations

import concurrent.futures
import json
import subprocess
import time
from pathlib import Path

from benchmarks.data import check
from benchmarks.env import DATA_BUCKET, touch_memory
from benchmarks.workloads import Cell, Metric, Workload, rate, read_file_into


def _gcs_bytes_read(tierfs: str, root: Path) -> int | None:
    """The bytes the mount's daemon has read from GCS (None: it does not say)."""
    result = subprocess.run(
        [tierfs, "stats", "--json", str(root)], capture_output=True, text=True, timeout=60
    )
    if result.returncode != 0:
        return None
    return int(json.loads(result.stdout)["gcs"]["bytes_read"])


class MultiRead(Workload):
    """Read the data set's N sequential files at once, one thread each, from a fresh mount
    with the page cache dropped; every byte checked after the timing."""

    name = "multi"
    title = "sequential read, all files at once"
    metrics = (
        Metric("multi.cold", "seq read, cold, all files at once", "MB/s"),
        Metric(
            "multi.gcs_ratio",
            "seq read, cold, all files at once: bytes from GCS per byte read",
            "x",
            higher_is_better=False,
            limit=None,
            optional=True,
        ),
    )

    def run(self, cell: Cell) -> None:
        env, system = cell.env, cell.system
        names = [n for n in env.data_objects if n.startswith("seq/")]
        total = sum(len(env.data_objects[n]) for n in names)
        buffers = {n: bytearray(len(env.data_objects[n])) for n in names}
        if system.kind == "direct":
            touch_memory(3 * total)  # (just before the timing: `benchmarks.reads.SeqRead`)
            targets = [(name, memoryview(buffer)) for name, buffer in buffers.items()]
            start = time.monotonic()
            cell.direct.download_many(DATA_BUCKET, targets)
            elapsed = time.monotonic() - start
        else:
            root = system.mount(DATA_BUCKET, fresh=True)
            assert root is not None
            env.drop_caches()
            touch_memory(3 * total)
            block = cell.sizes.io_block_bytes

            def read(name: str) -> int:
                return read_file_into(root / name, memoryview(buffers[name]), block)

            with concurrent.futures.ThreadPoolExecutor(len(names)) as pool:
                start = time.monotonic()
                counts = list(pool.map(read, names))
                elapsed = time.monotonic() - start
            for name, count in zip(names, counts, strict=True):
                if count != len(buffers[name]):
                    raise RuntimeError(f"{name}: read {count} of {len(buffers[name])} bytes")
        for name, buffer in buffers.items():
            check(f"{system.name}:{name}", buffer, env.data_objects[name])
        cell.record("multi.cold", rate(total, elapsed), f"{len(names)} files", seconds=elapsed)
        tierfs = getattr(system, "tierfs_command", None)
        if tierfs is not None and system.root is not None:
            fetched = _gcs_bytes_read(tierfs, system.root)
            if fetched is not None:
                cell.record("multi.gcs_ratio", fetched / total, f"{fetched} bytes from GCS")
