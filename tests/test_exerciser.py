"""A random read/write/truncate exerciser on one file through a real mount.

A seeded `random.Random` drives thousands of operations on a file in the mount and,
identically, on a reference file on local disk: ``pwrite`` of random bytes at random
offsets (1 B to 256 KiB, often past EOF, leaving holes), ``pread`` of random ranges
(often past EOF), ``ftruncate`` to random sizes (shrink and grow), ``fsync``, and
closing and reopening the file. Reads go through the writing handle or through a
second, read-only handle. Every read and every size is compared with the reference;
after each fsync and close the object in GCS is compared too (tierfs uploads on
flush, fsync and close). The run is deterministic: a failure names the seed and the
operation, and replays exactly.
"""

from __future__ import annotations

import os
import random
from collections import Counter
from pathlib import Path

from google.cloud import storage

from tests.mounting import Mount

SEED = 20260501
OPERATIONS = 6000
MAX_IO_BYTES = 256 << 10
MAX_FILE_BYTES = 1 << 20  # writes and truncates stay below about this size


def io_size(rng: random.Random) -> int:
    """1 B .. 256 KiB, log-uniform, so that tiny and large requests are both common."""
    return max(1, min(int(2 ** rng.uniform(0, 18)), MAX_IO_BYTES))


def first_difference(got: bytes, expected: bytes) -> int:
    for index, (a, b) in enumerate(zip(got, expected, strict=False)):
        if a != b:
            return index
    return min(len(got), len(expected))


def test_random_read_write_truncate(
    mount: Mount, gcs_client: storage.Client, tmp_path: Path
) -> None:
    rng = random.Random(SEED)
    target = mount.path / "exercised.bin"
    reference = tmp_path / "reference.bin"
    bucket = gcs_client.bucket(mount.bucket)
    history: list[str] = []
    counts: Counter[str] = Counter()

    def fail(message: str) -> None:
        recent = "\n  ".join(history[-15:])
        raise AssertionError(f"seed {SEED}, op #{len(history)}: {message}\n  last ops:\n  {recent}")

    def check_gcs(when: str) -> None:
        expected = reference.read_bytes()
        landed = bucket.blob("exercised.bin").download_as_bytes()  # latest generation
        if landed != expected:
            fail(
                f"GCS object after {when}: {len(landed)} bytes, reference {len(expected)}; "
                f"first difference at {first_difference(landed, expected)}"
            )

    writer = os.open(target, os.O_RDWR | os.O_CREAT)
    reader = os.open(target, os.O_RDONLY)
    ref = os.open(reference, os.O_RDWR | os.O_CREAT)
    size = 0
    try:
        for _ in range(OPERATIONS):
            roll = rng.random()
            if roll < 0.38:
                length = io_size(rng)
                offset = rng.randrange(0, min(size + (128 << 10), MAX_FILE_BYTES) + 1)
                data = rng.randbytes(length)
                history.append(f"pwrite({length}, {offset}) size={size}")
                counts["pwrite past EOF" if offset > size else "pwrite"] += 1
                written = os.pwrite(writer, data, offset)
                if written != length:
                    fail(f"pwrite wrote {written} of {length}")
                os.pwrite(ref, data, offset)
                size = max(size, offset + length)
            elif roll < 0.78:
                length = io_size(rng)
                offset = rng.randrange(0, size + (16 << 10) + 1)
                via = "reader" if rng.random() < 0.5 else "writer"
                history.append(f"pread({length}, {offset}) via {via} size={size}")
                counts["pread past EOF" if offset + length > size else "pread"] += 1
                got = os.pread(reader if via == "reader" else writer, length, offset)
                expected = os.pread(ref, length, offset)
                if got != expected:
                    fail(
                        f"read {len(got)} bytes, reference {len(expected)}; "
                        f"first difference at +{first_difference(got, expected)}"
                    )
            elif roll < 0.90:
                new_size = rng.randrange(0, min(2 * size + 4096, MAX_FILE_BYTES) + 1)
                history.append(f"ftruncate({new_size}) size={size}")
                counts["shrink" if new_size < size else "grow"] += 1
                os.ftruncate(writer, new_size)
                os.ftruncate(ref, new_size)
                size = new_size
            elif roll < 0.95:
                history.append(f"fsync size={size}")
                counts["fsync"] += 1
                os.fsync(writer)
                check_gcs("fsync")
            else:
                history.append(f"close+reopen size={size}")
                counts["reopen"] += 1
                os.close(writer)
                writer = os.open(target, os.O_RDWR)
                check_gcs("close")
                if rng.random() < 0.5:
                    os.close(reader)
                    reader = os.open(target, os.O_RDONLY)
            got_size = os.fstat(writer).st_size
            if got_size != size:
                fail(f"size {got_size}, reference {size}")
    finally:
        os.close(ref)
        os.close(reader)
        os.close(writer)

    expected = reference.read_bytes()
    assert len(expected) == size
    assert target.read_bytes() == expected
    assert bucket.blob("exercised.bin").download_as_bytes() == expected
    assert os.stat(target).st_size == size
    # The run did exercise every kind of operation, many times.
    for kind in ("pwrite", "pwrite past EOF", "pread", "pread past EOF", "shrink", "grow"):
        assert counts[kind] >= 100, counts
    assert counts["fsync"] >= 100 and counts["reopen"] >= 100, counts
    assert sum(counts.values()) == OPERATIONS
