"""``tierfs prefetch PATH...``: warm the tiers for files and whole directories ahead of a job.

It reads every file below the given paths through the mount, a few files at a
time. Reading is what fills the kernel's page cache, the RAM tier and the SSD
file cache (where a first read at offset 0 brings the whole object in with
parallel downloads), so a later job finds the data local. On a terminal a
progress bar shows bytes, rate and ETA; otherwise one summary line is printed.

Reading more than the tiers hold would only evict the first files to make room for
the last ones (and download everything for nothing): before it starts, prefetch asks
the mount how much its largest tier holds and, when the files asked for are more,
says so in one line and warms only the files that fit, in walk order.
"""

from __future__ import annotations

import os
import shutil
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from tqdm import tqdm

from tierfs.cli.control import request_statistics
from tierfs.cli.mountpoint import ALIVE, DEAD, HUNG, MountError, canonical, mounts, probe

CHUNK_BYTES = 4 << 20
WORKERS = 4


def tierfs_mount_of(path: Path) -> str | None:
    """The tierfs mountpoint holding ``path`` (resolved), if any. (realpath, not
    ``Path.resolve``: that raised RuntimeError on a symlink loop, an "internal error".)"""
    return tierfs_mount_holding(os.path.realpath(path))


def hung_mount_holding(target: str) -> str | None:
    """The tierfs mountpoint holding ``target`` (by name) if its daemon does not answer
    (`probe`, 5 s): what `tierfs sync` and `prefetch` check before they look anything up
    inside it, which would wait for ever."""
    holder = tierfs_mount_holding(target)
    return holder if holder is not None and probe(holder) == HUNG else None


def tierfs_mount_holding(target: str) -> str | None:
    """The tierfs mountpoint that is ``target`` or above it, by name alone (nothing is
    looked up: ``target`` may be in a mount that does not answer)."""
    best = None
    for entry in mounts():
        if entry.fstype == "fuse.tierfs" and (
            target == entry.mountpoint or target.startswith(entry.mountpoint.rstrip("/") + "/")
        ):
            if best is None or len(entry.mountpoint) > len(best):
                best = entry.mountpoint
    return best


def files_below(
    paths: list[Path], unlisted: list[OSError] | None = None
) -> Iterator[tuple[Path, int]]:
    """Each file at or below ``paths`` once (``prefetch d d/f`` counted and read f twice,
    and could say it was more than the tiers hold when it was not). A directory that
    cannot be listed goes into ``unlisted`` (it was skipped without a word, and the run
    said it had prefetched everything)."""
    seen: set[str] = set()
    for path, size in _files_below(paths, [] if unlisted is None else unlisted):
        key = os.path.realpath(path)
        if key not in seen:
            seen.add(key)
            yield path, size


def _files_below(paths: list[Path], unlisted: list[OSError]) -> Iterator[tuple[Path, int]]:
    for path in paths:
        if path.is_dir():
            for root, _dirs, names in os.walk(path, onerror=unlisted.append):
                for name in sorted(names):
                    item = Path(root, name)
                    if item.is_file() and not item.is_symlink():
                        yield item, item.stat().st_size
        elif path.is_file():
            yield path, path.stat().st_size


def tier_capacity(mountpoint: str) -> int | None:
    """Bytes the mount's largest tier holds (0: no tier), or None if the mount cannot say:
    a tier whose size is not known yet (-1: the shared tier sized by its volume's free
    space before its first scan) is no bound (it was taken for -1 bytes: "the tiers hold
    -0.0 MiB: warming 0 of 1 files")."""
    try:
        tiers = request_statistics(mountpoint)["data"]["tiers"]
        sizes = [int(tier["capacity_bytes"]) for tier in tiers.values()]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if any(size < 0 for size in sizes):
        return None
    return max(sizes, default=0)


def that_fit(files: list[tuple[Path, int]], capacity: int) -> list[tuple[Path, int]]:
    """The files, in order, that fit in ``capacity`` together (one too big is skipped)."""
    chosen, used = [], 0
    for path, size in files:
        if used + size <= capacity:
            chosen.append((path, size))
            used += size
    return chosen


def _mib(nbytes: int) -> str:
    return f"{nbytes / 2**20:.1f} MiB"


def _read_all(path: Path, progress: tqdm) -> int:
    total = 0
    with open(path, "rb", buffering=0) as f:
        while chunk := f.read(CHUNK_BYTES):
            total += len(chunk)
            progress.update(len(chunk))
    return total


def prefetch(argv: list[str]) -> int:
    if not argv or any(a.startswith("-") for a in argv):
        print("tierfs: usage: tierfs prefetch PATH...", file=sys.stderr)
        return 2
    if not all(argv):  # ("$DIR" unset: Path("") is the working directory)
        print("tierfs: empty PATH: usage: tierfs prefetch PATH...", file=sys.stderr)
        return 2
    paths = [Path(a) for a in argv]
    mountpoints = set()
    for path in paths:
        holder = tierfs_mount_holding(canonical(str(path)))
        state = probe(holder) if holder is not None else ALIVE  # (exists() could hang)
        if state == HUNG:
            print(
                f"tierfs: prefetch {path}: the daemon of {holder} does not answer", file=sys.stderr
            )
            return 1
        if state == DEAD:
            print(
                f"tierfs: prefetch {path}: the daemon of {holder} is gone: tierfs unmount {holder}",
                file=sys.stderr,
            )
            return 1
        try:
            exists = path.exists()
        except OSError as err:  # (pathlib re-raises all but ENOENT, ENOTDIR, EBADF, ELOOP)
            print(f"tierfs: {path}: {err.strerror or err}", file=sys.stderr)
            return 1
        if not exists:
            print(f"tierfs: {path}: no such file or directory", file=sys.stderr)
            return 1
        mountpoint = tierfs_mount_of(path)
        if mountpoint is None:
            print(f"tierfs: {path} is not inside a tierfs mount", file=sys.stderr)
            return 1
        mountpoints.add(mountpoint)
    unlisted: list[OSError] = []
    try:
        files = list(files_below(paths, unlisted))
    except (OSError, MountError) as err:
        print(f"tierfs: cannot list {err}", file=sys.stderr)
        return 1
    for failure in unlisted:  # the rest is warmed all the same; the exit status says it
        print(
            f"tierfs: cannot list {failure.filename}: {failure.strerror or failure}",
            file=sys.stderr,
        )
    total = sum(size for _, size in files)
    capacities = [tier_capacity(m) for m in sorted(mountpoints)]
    if len(mountpoints) == 1 and capacities[0] is not None and total > capacities[0]:
        capacity = capacities[0]
        if capacity == 0:
            print(
                f"tierfs: prefetch: {_mib(total)} asked for, but the mount keeps no data "
                "(no RAM tier, no cache dir): nothing to warm",
                file=sys.stderr,
            )
            return 0
        chosen = that_fit(files, capacity)
        print(
            f"tierfs: prefetch: {_mib(total)} asked for, the tiers hold {_mib(capacity)}: "
            f"warming {len(chosen)} of {len(files)} files ({_mib(sum(s for _, s in chosen))});"
            " the rest would evict them",
            file=sys.stderr,
        )
        files = chosen
        total = sum(size for _, size in files)
    started = time.monotonic()
    interactive = sys.stderr.isatty()
    with tqdm(
        total=total, unit="B", unit_scale=True, unit_divisor=1024, disable=not interactive,
        desc="prefetch", file=sys.stderr,
        # A terminal that reports 0x0 (a bare pty) would hide the bar: assume 100x24 there.
        ncols=shutil.get_terminal_size((100, 24)).columns,
        nrows=shutil.get_terminal_size((100, 24)).lines,
    ) as progress:  # fmt: skip
        with ThreadPoolExecutor(max_workers=WORKERS) as pool:
            results = list(pool.map(lambda item: _try_read(item[0], progress), files))
    done = sum(n for n in results if n >= 0)
    failed = [str(path) for (path, _), n in zip(files, results, strict=True) if n < 0]
    elapsed = max(time.monotonic() - started, 1e-6)
    print(
        f"prefetched {len(files) - len(failed)} files, {done / 2**20:.1f} MiB "
        f"in {elapsed:.1f} s ({done / 2**20 / elapsed:.1f} MiB/s)"
        + (f"; {len(failed)} failed, first: {failed[0]}" if failed else "")
    )
    return 1 if failed or unlisted else 0


def _try_read(path: Path, progress: tqdm) -> int:
    try:
        return _read_all(path, progress)
    except OSError as err:
        print(f"tierfs: {path}: {err.strerror}", file=sys.stderr)
        return -1
