"""Keep the daemon's memory where the RAM tier says it is.

Blocks are 8 MiB ``bytes`` objects made and freed by the thousand, many of them in
worker threads. With glibc's defaults, each worker thread gets its own malloc arena
and freed blocks stay in them (the mmap threshold rises to 32 MiB after the first
large free), so the resident size grows with the amount of data read, not with
what is cached: about 966 MiB after reading 4 GiB with a 256 MiB RAM tier,
measured on these machines.

The first fix, a 256 KiB mmap threshold, returned every block to the kernel when
freed; but then every new block was a fresh mapping that the kernel had to fault in
and zero page by page, and serving SSD-tier hits spent 85 % of a core in the kernel
(2,048 page faults per 8 MiB block). So instead: one arena for every thread, and a
fixed mmap threshold just above the block size, so a freed block is a hole in that one heap
that the next block of the same size reuses, already faulted in; free space at the top
of the heap beyond the trim threshold goes back to the kernel. The resident size is
then the peak of live blocks plus at most the trim threshold.
"""

from __future__ import annotations

import ctypes
import ctypes.util

M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
M_ARENA_MAX = -8
MMAP_THRESHOLD_MAX = 32 << 20  # glibc refuses more
TRIM_THRESHOLD_BYTES = 64 << 20


def mmap_threshold(block_bytes: int) -> int:
    """Just above one block: blocks (and download buffers) come from the heap, while
    pyfuse3's 1 MiB ``calloc`` per readdir stays a fresh zero mapping, which costs a few
    page faults instead of clearing 1 MiB of reused heap."""
    return min(MMAP_THRESHOLD_MAX, block_bytes + (1 << 20))


def tune_allocator(block_bytes: int) -> bool:
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
            (M_MMAP_THRESHOLD, mmap_threshold(block_bytes)),
            (M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES),
            (M_ARENA_MAX, 1),
        )
    )
