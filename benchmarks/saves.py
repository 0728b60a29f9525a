"""Checkpoint saves as the libraries make them: small-file creates, an Orbax-shaped step
committed by a directory rename, and a torch.distributed.checkpoint-shaped one.

Each reports the time until the last call returns (what training waits for), the time
until every final name is durable (in GCS, or fsync'd with its directory on local disk),
and so the ratio to local disk that the README quotes. The direct client uploads the
final names (no tmp name to rename): the backend's floor for "durable".
"""

from __future__ import annotations

import concurrent.futures
import errno
import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path

from benchmarks.data import NotApplicable, WrongBytes, check, crc32c_b64
from benchmarks.workloads import (
    Cell,
    Metric,
    Workload,
    fsync_dir,
    save_rss,
    wait_local_durable,
    write_file,
    write_files,
)

KiB = 1 << 10
MiB = 1 << 20


class Create(Workload):
    """Small files created one after another (the many tiny files of a sharded save)."""

    name = "create"
    title = "small-file creates"
    metrics = (
        Metric("meta.create", "create small files, until close()", "files/s", limit="local"),
        Metric("meta.create_durable", "create small files, until durable", "files/s"),
    )

    def run(self, cell: Cell) -> None:
        sizes, system = cell.sizes, cell.system
        assert cell.env.pool is not None
        files = {
            f"c/small-{i:05d}": cell.env.pool.slice(i * 7777, sizes.create_file_bytes)
            for i in range(sizes.create_files)
        }
        bucket = cell.scratch_bucket()
        expected = {n: crc32c_b64(d) for n, d in files.items()}
        if system.kind == "direct":
            start = time.monotonic()
            cell.direct.upload_many(bucket, list(files.items()))
            elapsed = time.monotonic() - start
            cell.wait_durable(bucket, expected, "c/")
            cell.record("meta.create", len(files) / elapsed, "parallel uploads", seconds=elapsed)
            cell.record("meta.create_durable", len(files) / elapsed, seconds=elapsed)
            return
        root = system.mount(bucket)
        assert root is not None
        start = time.monotonic()
        paths = write_files(root, "c", files, sizes.io_block_bytes)
        closed = time.monotonic() - start
        if system.kind == "local":
            wait_local_durable(paths)
            for path, data in zip(paths, files.values(), strict=True):
                check(str(path), path.read_bytes(), data)
        else:
            cell.wait_durable(bucket, expected, "c/")
        durable = time.monotonic() - start
        cell.record("meta.create", len(paths) / closed, seconds=closed)
        cell.record("meta.create_durable", len(paths) / durable, seconds=durable)


def commit(make_final: Callable[[Path], None], root: Path) -> None:
    """A save's commit. A directory rename refused with EMFILE is what tierfs and gcsfuse
    answer at ``rename-dir-limit`` 0, their default (the checkpoint line does not raise
    it): the cell is n/a for that reason, not an error of the system."""
    try:
        make_final(root)
    except OSError as err:
        if err.errno != errno.EMFILE:
            raise
        raise NotApplicable(
            "directory rename refused (EMFILE): rename-dir-limit is 0 at these options, "
            "as gcsfuse's default"
        ) from err


class _RenamedSave(Workload):
    """A save written under a tmp name by parallel writers, then committed by a rename."""

    fsync_each = False

    def layout(self, cell: Cell) -> dict[str, int]:
        """Relative final names -> sizes."""
        raise NotImplementedError

    def commit(self, root: Path) -> None:
        """Make the save final: a rename (plus whatever the library writes last)."""
        raise NotImplementedError

    def tmp_name(self, name: str) -> str:
        raise NotImplementedError

    def run(self, cell: Cell) -> None:
        env, sizes, system = cell.env, cell.sizes, cell.system
        assert env.pool is not None
        layout = self.layout(cell)
        offsets = 0
        data = {}
        for name, size in layout.items():
            data[name] = env.pool.slice(offsets % max(1, env.pool.size - size), size)
            offsets += 4099 * 7
        total = sum(layout.values())
        expected = {n: crc32c_b64(d) for n, d in data.items()}
        prefix = next(iter(layout)).split("/", 1)[0] + "/"
        bucket = cell.scratch_bucket()
        label = f"{len(layout)} files, {total / MiB:.0f} MiB"
        if system.kind == "direct":
            start = time.monotonic()
            cell.direct.upload_many(bucket, list(data.items()))
            elapsed = time.monotonic() - start
            cell.wait_durable(bucket, expected, prefix)
            cell.record(f"{self.name}.save", elapsed, f"{label}, final names uploaded")
            cell.record(f"{self.name}.durable", elapsed)
            return
        root = system.mount(bucket)
        assert root is not None
        tmp_paths = {name: root / self.tmp_name(name) for name in layout}
        start = time.monotonic()
        for directory in sorted({p.parent for p in tmp_paths.values()}):
            directory.mkdir(parents=True, exist_ok=True)
        block = sizes.io_block_bytes

        def write(name: str) -> None:
            write_file(tmp_paths[name], data[name], block, fsync=self.fsync_each)

        with concurrent.futures.ThreadPoolExecutor(sizes.ckpt_writers) as pool:
            list(pool.map(write, sorted(layout, key=lambda n: -layout[n])))
        commit(self.commit, root)
        saved = time.monotonic() - start
        final = [root / name for name in layout]
        if system.kind == "local":
            wait_local_durable(final)
            fsync_dir(root)
        else:
            cell.wait_durable(bucket, expected, prefix)
        durable = time.monotonic() - start
        cell.record_save_rss(f"{self.name}.save_rss")
        for name in list(layout)[:: max(1, len(layout) // 16)]:  # spot-check the final names
            got = (root / name).read_bytes()
            if len(got) != layout[name]:
                raise WrongBytes(f"{name}: {len(got)} bytes after the rename, not {layout[name]}")
            check(f"{system.name}:{name}", got, data[name])
        cell.record(f"{self.name}.save", saved, label, seconds=saved)
        cell.record(f"{self.name}.durable", durable, seconds=durable)


class OrbaxSave(_RenamedSave):
    """Orbax: every array a directory of small chunk files (zarr/OCDBT), a few large ones,
    all under ``step_100.orbax-checkpoint-tmp-0``, which is renamed to ``step_100``."""

    name = "orbax"
    title = "Orbax-shaped save + directory rename"
    metrics = (
        Metric("orbax.save", "Orbax step: until the rename returns", "s", False, limit=None),
        Metric("orbax.durable", "Orbax step: until durable", "s", False, limit=None),
        save_rss("orbax", "Orbax step"),
    )
    TMP = "step_100.orbax-checkpoint-tmp-0"

    def layout(self, cell: Cell) -> dict[str, int]:
        small = max(10, cell.sizes.create_files * 2)  # 2,000 in the full run
        per_param = 20
        files = {}
        for i in range(small):
            layer, rest = divmod(i, 2 * per_param)
            param, chunk = divmod(rest, per_param)
            files[f"step_100/params/layer_{layer:03d}/{('kernel', 'bias')[param]}/{chunk}.0"] = (
                16 * KiB + (i % 7) * 1024
            )
        big = cell.sizes.ckpt_shard_bytes
        for i in range(4):
            files[f"step_100/opt_state/shard_{i}.bin"] = big
        files["step_100/_METADATA"] = 2 * KiB
        return files

    def tmp_name(self, name: str) -> str:
        return self.TMP + name[len("step_100") :]

    def commit(self, root: Path) -> None:
        os.rename(root / self.TMP, root / "step_100")


class DcpSave(_RenamedSave):
    """torch.distributed.checkpoint: one file per rank, each fsync'd, then ``.metadata``
    written under a tmp name, fsync'd, and renamed (its commit)."""

    name = "dcp"
    title = "DCP-shaped save (fsync per file)"
    metrics = (
        Metric("dcp.save", "DCP save: until the rename returns", "s", False, limit=None),
        Metric("dcp.durable", "DCP save: until durable", "s", False, limit=None),
        save_rss("dcp", "DCP save"),
    )
    fsync_each = True

    def layout(self, cell: Cell) -> dict[str, int]:
        shards = cell.sizes.ckpt_shards
        files = {f"dcp/__{i}_0.distcp": cell.sizes.ckpt_shard_bytes // 2 for i in range(shards)}
        files["dcp/.metadata"] = 64 * KiB
        return files

    def tmp_name(self, name: str) -> str:
        return name + ".tmp" if name.endswith(".metadata") else name

    def commit(self, root: Path) -> None:
        os.rename(root / "dcp" / ".metadata.tmp", root / "dcp" / ".metadata")


class Remove(Workload):
    """Removing an old step, as Orbax's ``max_to_keep`` or a clean-up script does: a tree
    an earlier save left in the bucket (placeholders for its directories), ``rm -rf``."""

    name = "remove"
    title = "remove an old step (rm -rf)"
    metrics = (
        Metric("remove.rm", "rm -rf of an old step, until it returns", "files/s", limit="local"),
        Metric("remove.gone", "rm -rf of an old step, until gone from GCS", "files/s"),
    )

    def run(self, cell: Cell) -> None:
        sizes, system = cell.sizes, cell.system
        names = [f"old/d{i % 4}/f{i:05d}" for i in range(sizes.create_files)]
        data = memoryview(b"x" * 1024)
        bucket = cell.scratch_bucket()
        if system.kind == "direct":
            cell.direct.upload_many(bucket, [(n, data) for n in names])
            start = time.monotonic()
            cell.direct.delete_all(bucket, "old/")
            elapsed = time.monotonic() - start
            cell.record("remove.rm", len(names) / elapsed, "parallel deletes", seconds=elapsed)
            cell.record("remove.gone", len(names) / elapsed, seconds=elapsed)
            return
        if system.kind == "local":
            root = system.mount(bucket)
            assert root is not None
            for name in names:
                path = root / name
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_bytes(data)
            fsync_dir(root)
        else:
            dirs = ["old/", *(f"old/d{d}/" for d in range(4))]
            cell.direct.upload_many(bucket, [(n, memoryview(b"")) for n in dirs])
            cell.direct.upload_many(bucket, [(n, data) for n in names])
            root = system.mount(bucket)
            assert root is not None
        start = time.monotonic()
        shutil.rmtree(root / "old")
        returned = time.monotonic() - start
        if system.kind != "local":
            assert cell.env.admin is not None
            deadline = start + sizes.durable_timeout_s
            while cell.env.admin.list(bucket, "old/")[0]:
                if time.monotonic() > deadline:
                    raise TimeoutError("the old step is still in GCS")
                time.sleep(0.01)
        else:
            fsync_dir(root)
        gone = time.monotonic() - start
        cell.record("remove.rm", len(names) / returned, seconds=returned)
        cell.record("remove.gone", len(names) / gone, seconds=gone)
