"""The metadata workload: stat and ``ls -lR`` over the metadata tree, cold and warm.
Its rules are `benchmarks.workloads`'."""

from __future__ import annotations

import os
import random
import stat
import time
from pathlib import Path

from benchmarks.data import WrongBytes
from benchmarks.env import META_BUCKET
from benchmarks.workloads import (
    Cell,
    Metric,
    Workload,
)

# -- 6. metadata -----------------------------------------------------------------------------


def _walk(root: Path, deadline: float) -> tuple[dict[str, int], int, bool]:
    """``ls -lR``: readdir every directory and lstat every entry; (files, entries, done).

    The timed loop does only what ``ls -lR`` does (readdir, lstat); turning paths into
    the relative names the check compares is done after the clock stops. Done inside the
    loop, ``relpath`` and ``Path`` cost 9 us an entry (tmpfs walked at 73k instead of
    210k entries/s), a fixed cost that squeezed every system towards the same number.
    """
    seen: list[tuple[str, int]] = []
    entries = 0
    complete = True
    stack = [str(root)]
    while stack and complete:
        directory = stack.pop()
        with os.scandir(directory) as listing:
            for entry in listing:
                info = entry.stat(follow_symlinks=False)
                entries += 1
                if stat.S_ISDIR(info.st_mode):
                    stack.append(entry.path)
                else:
                    seen.append((entry.path, info.st_size))
                if time.monotonic() > deadline:
                    complete = False
                    break
    base = len(str(root)) + 1
    return {path[base:]: size for path, size in seen}, entries, complete


class Metadata(Workload):
    """stat and ``ls -lR`` over the metadata tree, cold and warm (creates: `saves.Create`)."""

    name = "meta"
    title = "metadata"
    metrics = (
        # No ratio to the direct client: it stats each object by name, which the emulator
        # answers by scanning the bucket (827/s), where a mount lists directories.
        Metric("meta.stat_cold", "stat, cold", "stat/s", limit=None),
        Metric("meta.stat_warm", "stat, warm", "stat/s", limit="local"),
        Metric("meta.ls_cold", "ls -lR, cold", "entries/s"),
        Metric("meta.ls_warm", "ls -lR, warm", "entries/s", limit="local"),
    )

    def run(self, cell: Cell) -> None:
        if cell.system.kind == "direct":
            self._direct(cell)
        else:
            self._paths(cell)

    def _expected(self, cell: Cell) -> tuple[list[str], int]:
        names = sorted(cell.env.meta_files)
        random.Random(3).shuffle(names)
        return names, len(names) + len(cell.env.meta_dirs)

    def _paths(self, cell: Cell) -> None:
        env, sizes, system = cell.env, cell.sizes, cell.system
        names, entries_expected = self._expected(cell)
        root = system.mount(META_BUCKET)
        assert root is not None
        env.drop_caches()
        done = 0
        for key in ("meta.stat_cold", "meta.stat_warm"):
            todo = names if key == "meta.stat_cold" else names[:done]
            deadline = time.monotonic() + sizes.meta_stat_seconds
            start = time.monotonic()
            count = 0
            for name in todo:
                size = os.stat(root / name).st_size
                if size != env.meta_files[name]:
                    raise WrongBytes(f"{name}: size {size}, expected {env.meta_files[name]}")
                count += 1
                if key == "meta.stat_cold" and time.monotonic() > deadline:
                    break
            elapsed = time.monotonic() - start
            done = count
            cell.record(key, count / elapsed, f"{count} files", count=count, seconds=elapsed)
        for key in ("meta.ls_cold", "meta.ls_warm"):
            if key == "meta.ls_cold":
                root = system.mount(META_BUCKET)
                assert root is not None
                env.drop_caches()
            start = time.monotonic()
            files, entries, complete = _walk(root, start + sizes.meta_walk_cap_s)
            elapsed = time.monotonic() - start
            note = ""
            if complete:
                if files != env.meta_files:
                    missing = set(env.meta_files) - set(files)
                    extra = set(files) - set(env.meta_files)
                    raise WrongBytes(
                        f"ls -lR found {len(files)} files, expected {len(env.meta_files)}"
                        f" (missing {sorted(missing)[:2]}, extra {sorted(extra)[:2]},"
                        f" sizes differ for"
                        f" {[n for n in files if files[n] != env.meta_files.get(n)][:2]})"
                    )
            else:
                note = f"stopped after {sizes.meta_walk_cap_s:.0f}s: {entries}/{entries_expected}"
                for name, size in files.items():
                    if env.meta_files.get(name) != size:
                        raise WrongBytes(f"ls -lR: {name} size {size}")
            cell.record(key, entries / elapsed, note, entries=entries, seconds=elapsed)

    def _direct(self, cell: Cell) -> None:
        env, sizes = cell.env, cell.sizes
        direct = cell.direct
        names, _ = self._expected(cell)

        def stat_one(name: str) -> None:
            size = int(direct.stat(META_BUCKET, name)["size"])
            if size != env.meta_files[name]:
                raise WrongBytes(f"{name}: size {size}, expected {env.meta_files[name]}")

        done = 0
        for key in ("meta.stat_cold", "meta.stat_warm"):
            start = time.monotonic()
            deadline = start + sizes.meta_stat_seconds
            count = 0
            todo = names if key == "meta.stat_cold" else names[:done]
            batch = direct.threads * 8
            for first in range(0, len(todo), batch):
                chunk = todo[first : first + batch]
                direct.map(stat_one, chunk)
                count += len(chunk)
                if key == "meta.stat_cold" and time.monotonic() > deadline:
                    break
            elapsed = time.monotonic() - start
            done = count
            note = "parallel object GETs" + (", no cache" if key == "meta.stat_warm" else "")
            cell.record(key, count / elapsed, note, count=count, seconds=elapsed)
        for key in ("meta.ls_cold", "meta.ls_warm"):
            start = time.monotonic()
            items = direct.walk(META_BUCKET)
            elapsed = time.monotonic() - start
            files = {i["name"]: int(i["size"]) for i in items if not i["name"].endswith("/")}
            if files != env.meta_files:
                raise WrongBytes(
                    f"listing found {len(files)} objects, expected {len(env.meta_files)}"
                )
            entries = len(files) + len(env.meta_dirs)
            note = "parallel listings per prefix" + (", no cache" if key == "meta.ls_warm" else "")
            cell.record(key, entries / elapsed, note, entries=entries, seconds=elapsed)
