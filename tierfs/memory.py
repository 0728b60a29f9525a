"""Keep the daemon's memory where the RAM tier says it is.

Blocks are 8 MiB ``bytes`` objects made and freed by the thousand, many of them in
worker threads. With glibc's defaults, each worker thread gets its own malloc arena
and freed blocks stay in them (the mmap threshold rises to 32 MiB after the first
large free), so the resident size grows with the amount of data read, not with
what is cached: about 966 MiB after reading 4 GiB with a 256 MiB RAM tier,
measured on these machines. A fixed mmap threshold returns every block to the
kernel when freed, and two arenas keep the rest compact.
"""

from __future__ import annotations

import ctypes
import ctypes.util

M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
M_ARENA_MAX = -8
MMAP_THRESHOLD_BYTES = 256 << 10


def tune_allocator() -> bool:
    """glibc only; elsewhere (musl...) a no-op. True when the settings took."""
    name = ctypes.util.find_library("c")
    if not name:
        return False
    try:
        libc = ctypes.CDLL(name)
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    return all(
        mallopt(option, value) == 1
        for option, value in (
            (M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES),
            (M_TRIM_THRESHOLD, 4 * MMAP_THRESHOLD_BYTES),
            (M_ARENA_MAX, 2),
        )
    )
