"""The bytes every workload writes and must read back, and how they are checked.

One random pool per run (``os.urandom``; 1 GiB in the full run) is the only
source of content: files, objects and checkpoint shards are distinct slices
of it (memoryviews, no copies). On this machine touching fresh memory costs
about 1 GB/s, so generating one pool instead of one buffer per workload
keeps set-up short, and the expected bytes are always in RAM for comparison.

Checks: what was read is compared with the expected slice at memcmp speed
(reads land in ``bytearray`` buffers, see `equal`), and on a mismatch the
first differing offset is located so the report says where. Random reads
are compared exactly. Objects in GCS are checked by the CRC32C the server
computed itself. A difference raises `WrongBytes`,
which fails the cell loudly and makes the whole run exit non-zero.
"""

from __future__ import annotations

import base64
import os

import google_crc32c

MiB = 1 << 20
GiB = 1 << 30


class NotApplicable(Exception):
    """A cell that cannot be measured for a reason of the system's own design (not a
    failure): the runner records it as "n/a" with this message."""


class WrongBytes(AssertionError):
    """What was read back is not what was written."""


class Pool:
    """``size`` random bytes; ``slice(offset, length)`` hands out views of them."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.data = os.urandom(size)
        self.view = memoryview(self.data)

    def slice(self, offset: int, length: int) -> memoryview:
        """``length`` bytes from ``offset``, wrapped so the slice fits in the pool."""
        if length > self.size:
            raise ValueError(f"slice of {length} bytes from a pool of {self.size}")
        offset %= self.size - length + 1
        return self.view[offset : offset + length]


_CRC_MEMO: dict[tuple[int, bytes, bytes], str] = {}


def crc32c_b64(data: bytes | bytearray | memoryview) -> str:
    """The form GCS reports in object metadata (base64 of the big-endian value).

    ``google_crc32c`` takes only ``bytes``, so views are copied once; results are
    remembered by length and the first and last 32 bytes, which identify a slice
    of random data.
    """
    key = (len(data), bytes(data[:32]), bytes(data[-32:]))
    if key not in _CRC_MEMO:
        value = int(google_crc32c.value(bytes(data)))
        _CRC_MEMO[key] = base64.b64encode(value.to_bytes(4, "big")).decode()
    return _CRC_MEMO[key]


def equal(got: bytes | bytearray | memoryview, want: bytes | memoryview) -> bool:
    """Byte equality at memcmp speed. Only ``bytearray`` (and ``bytes`` against ``bytes``)
    compare buffers in C: ``bytes == view`` falls back to the view's comparison, which goes
    element by element, as ``view == view`` does (measured: 2.4 ms a MiB, 15.7 us for 4 KiB;
    a copy of the view and memcmp: 0.17 ms and 0.4 us). That slow path once sat inside the
    timed loop of the random reads' second touch: 2.2 of the ~4-5 ms each 1 MiB read took
    there, on every system, which squeezed them all towards one number."""
    if len(got) != len(want):
        return False
    if isinstance(got, bytearray):
        return got == want
    if isinstance(got, memoryview):
        return bytearray(got) == want
    return got == (want if isinstance(want, bytes) else want.tobytes())


def first_difference(got: bytes | bytearray | memoryview, want: bytes | memoryview) -> int:
    """Offset of the first differing byte (or the shorter length)."""
    g, w = memoryview(got).cast("B"), memoryview(want).cast("B")
    n = min(len(g), len(w))
    step = MiB
    for start in range(0, n, step):
        end = min(n, start + step)
        if g[start:end] != w[start:end]:
            for i in range(start, end):
                if g[i] != w[i]:
                    return i
    return n


def check(what: str, got: bytes | bytearray | memoryview, want: bytes | memoryview) -> None:
    """Raise `WrongBytes` naming ``what`` and the first differing offset."""
    if equal(got, want):
        return
    if len(got) != len(want):
        raise WrongBytes(f"{what}: read {len(got)} bytes, expected {len(want)}")
    raise WrongBytes(f"{what}: wrong bytes from offset {first_difference(got, want)}")


def check_small(
    what: str, offset: int, got: bytes | bytearray | memoryview, want: bytes | memoryview
) -> None:
    """Exact comparison for small (random) reads (`equal`: never element by element)."""
    if not equal(got, want):
        raise WrongBytes(
            f"{what}: wrong bytes in the read at offset {offset} (length {len(want)}),"
            f" first difference at +{first_difference(got, want)}"
        )
