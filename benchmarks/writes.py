"""The write workloads: sequential files, a sharded checkpoint saved and restored, and
one big checkpoint file per write mode. Their rules are `benchmarks.workloads`'."""

from __future__ import annotations

import concurrent.futures
import json
import time

from benchmarks.data import WrongBytes, check, crc32c_b64
from benchmarks.workloads import (
    Cell,
    Metric,
    Workload,
    fsync_dir,
    rate,
    read_file_into,
    save_rss,
    wait_local_durable,
    write_file,
    write_files,
)

# -- 1. sequential write -------------------------------------------------------------------


class SeqWrite(Workload):
    """Write N files of S bytes one after another in 1 MiB writes: until close, until durable."""

    name = "write"
    title = "sequential write (4 files)"
    metrics = (
        Metric("write.close", "seq write, until close()", "MB/s", limit="local"),
        Metric("write.durable", "seq write, until durable in GCS", "MB/s", limit="gcs"),
    )

    def run(self, cell: Cell) -> None:
        sizes, env = cell.sizes, cell.env
        assert env.pool is not None
        files = {
            f"w/part-{i}": env.pool.slice(
                (i + 1) * sizes.write_file_bytes // 3, sizes.write_file_bytes
            )
            for i in range(sizes.write_files)
        }
        total = sum(len(v) for v in files.values())
        bucket = cell.scratch_bucket()
        expected = {name: crc32c_b64(data) for name, data in files.items()}
        system = cell.system
        if system.kind == "direct":
            start = time.monotonic()
            cell.direct.upload_many(bucket, list(files.items()))
            elapsed = time.monotonic() - start
            cell.wait_durable(bucket, expected, "w/")
            cell.record("write.close", rate(total, elapsed), "parallel single-request uploads")
            cell.record("write.durable", rate(total, elapsed))
            return
        root = system.mount(bucket)
        assert root is not None
        start = time.monotonic()
        paths = write_files(root, "w", files, sizes.io_block_bytes)
        closed = time.monotonic() - start
        if system.kind == "local":
            wait_local_durable(paths)
            durable = time.monotonic() - start
            buffer = bytearray(sizes.write_file_bytes)
            for path, data in zip(paths, files.values(), strict=True):
                n = read_file_into(path, memoryview(buffer), sizes.io_block_bytes)
                check(str(path), buffer if n == len(buffer) else buffer[:n], data)
        else:
            cell.wait_durable(bucket, expected, "w/")
            durable = time.monotonic() - start
        cell.record("write.close", rate(total, closed), seconds=closed)
        cell.record("write.durable", rate(total, durable), seconds=durable)


# -- 7. checkpoint ---------------------------------------------------------------------------


class Checkpoint(Workload):
    """Save N shards + metadata.json (parallel writers, fsync each, as torch DCP does),
    then restore everything after a remount and verify it."""

    name = "ckpt"
    title = "checkpoint save / restore"
    metrics = (
        Metric("ckpt.save", "checkpoint save, until close()", "MB/s", limit="local"),
        Metric("ckpt.durable", "checkpoint save, until durable", "MB/s", limit="gcs"),
        Metric("ckpt.restore", "checkpoint restore after remount", "MB/s", limit="local"),
        save_rss("ckpt", "checkpoint save"),
    )

    def run(self, cell: Cell) -> None:
        env, sizes, system = cell.env, cell.sizes, cell.system
        assert env.pool is not None
        step = "ckpt/step-100"
        shards = {
            f"{step}/shard-{i:05d}-of-{sizes.ckpt_shards:05d}.distcp": env.pool.slice(
                i * sizes.ckpt_shard_bytes + 12345, sizes.ckpt_shard_bytes
            )
            for i in range(sizes.ckpt_shards)
        }
        meta_doc = json.dumps(
            {"step": 100, "shards": {n: crc32c_b64(d) for n, d in shards.items()}}, indent=1
        ).encode()
        metadata = {f"{step}/metadata.json": memoryview(meta_doc)}
        everything = {**shards, **metadata}
        total = sum(len(d) for d in everything.values())
        expected = {n: crc32c_b64(d) for n, d in everything.items()}
        bucket = cell.scratch_bucket()
        buffers = {name: bytearray(len(data)) for name, data in shards.items()}
        views = {name: memoryview(buffer) for name, buffer in buffers.items()}

        if system.kind == "direct":
            direct = cell.direct
            start = time.monotonic()
            direct.upload_many(bucket, list(shards.items()))
            direct.upload_many(bucket, list(metadata.items()))
            saved = time.monotonic() - start
            cell.wait_durable(bucket, expected, "ckpt/")
            start = time.monotonic()
            doc = json.loads(direct.read_range(bucket, f"{step}/metadata.json", 0, len(meta_doc)))
            direct.download_many(bucket, [(n, views[n]) for n in doc["shards"]])
            restored = time.monotonic() - start
            self._verify(shards, buffers, "gs://" + bucket)
            cell.record("ckpt.save", rate(total, saved), "parallel uploads", seconds=saved)
            cell.record("ckpt.durable", rate(total, saved), seconds=saved)
            cell.record("ckpt.restore", rate(total, restored), "parallel ranged GETs")
            return

        root = system.mount(bucket)
        assert root is not None
        (root / step).mkdir(parents=True)
        block = sizes.io_block_bytes
        with concurrent.futures.ThreadPoolExecutor(sizes.ckpt_writers) as pool:
            start = time.monotonic()
            list(
                pool.map(
                    lambda item: write_file(root / item[0], item[1], block, fsync=True),
                    shards.items(),
                )
            )
            for name, data in metadata.items():
                write_file(root / name, data, block, fsync=True)
            saved = time.monotonic() - start
            if system.kind == "local":
                fsync_dir(root / step)
                durable = time.monotonic() - start
            else:
                system.before_durable(root)
                cell.wait_durable(bucket, expected, "ckpt/")
                durable = time.monotonic() - start
            cell.record_save_rss("ckpt.save_rss")
            root = system.remount()
            assert root is not None
            start = time.monotonic()
            doc = json.loads((root / step / "metadata.json").read_bytes())

            def restore(name: str) -> None:
                got = read_file_into(root / name, views[name], block)
                if got != len(views[name]):
                    raise WrongBytes(f"{name}: read {got} bytes, expected {len(views[name])}")

            list(pool.map(restore, doc["shards"]))
            restored = time.monotonic() - start
        self._verify(shards, buffers, system.name)
        cell.record("ckpt.save", rate(total, saved), seconds=saved)
        cell.record("ckpt.durable", rate(total, durable), seconds=durable)
        cell.record("ckpt.restore", rate(total, restored), seconds=restored)

    @staticmethod
    def _verify(shards: dict[str, memoryview], got: dict[str, bytearray], where: str) -> None:
        for name, data in shards.items():
            check(f"{where}:{name}", got[name], data)


# -- 8. one big checkpoint file, per write mode --------------------------------------------


class BigWrite(Workload):
    """One checkpoint file of ``bigwrite_bytes`` in 1 MiB writes: seconds until close()
    returns and until the object is in GCS; the daemon's peak RSS while doing it.
    (Streaming's memory bound over 4 GiB: ``python -m benchmarks.stream_rss``.)"""

    name = "bigwrite"
    title = "one big checkpoint file"
    metrics = (
        Metric("bigwrite.close", "big file: until close() returns", "s", False, limit=None),
        Metric("bigwrite.durable", "big file: until durable in GCS", "s", False, limit=None),
        Metric(
            "bigwrite.rss",
            "big file: daemon peak RSS",
            "MiB",
            False,
            None,
            optional=True,
            peak=True,
        ),
    )
    own_rss = True  # its RSS rows say which phase they measure

    def run(self, cell: Cell) -> None:
        env, sizes, system = cell.env, cell.sizes, cell.system
        assert env.pool is not None
        size = min(sizes.bigwrite_bytes, env.pool.size)
        data = env.pool.slice(0, size)
        bucket = cell.scratch_bucket()
        expected = {"big/ckpt.pt": crc32c_b64(data)}
        mib = size / (1 << 20)
        if system.kind == "direct":
            start = time.monotonic()
            cell.direct.upload(bucket, "big/ckpt.pt", data)
            elapsed = time.monotonic() - start
            cell.wait_durable(bucket, expected, "big/")
            cell.record("bigwrite.close", elapsed, f"{mib:.0f} MiB, one upload request")
            cell.record("bigwrite.durable", elapsed)
            return
        root = system.mount(bucket)
        assert root is not None
        (root / "big").mkdir()
        path = root / "big" / "ckpt.pt"
        start = time.monotonic()
        write_file(path, data, sizes.io_block_bytes)
        closed = time.monotonic() - start
        if system.kind == "local":
            wait_local_durable([path])
        else:
            cell.wait_durable(bucket, expected, "big/")
        durable = time.monotonic() - start
        cell.record("bigwrite.close", closed, f"{mib:.0f} MiB")
        cell.record("bigwrite.durable", durable)
        system.sample_rss()
        if system.peak_rss_kib is not None:
            cell.record("bigwrite.rss", system.peak_rss_kib / 1024, f"{mib:.0f} MiB file")
