"""Keep the daemon's memory where the RAM tier says it is.

Blocks read from the SSD and shared tiers (and the pieces of random reads) are
``bytes`` objects, 8 MiB ones made and freed by the thousand, many of them in worker
threads. (Downloaded blocks land in reused block buffers instead:
`tierfs.cache.buffers`.) With glibc's defaults, each worker thread gets its own malloc arena
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

The trim threshold is twice the RAM tier's size (`trim_threshold`), not 64 MiB: a
whole-object fill reserves room for its downloads, which can empty the RAM tier at
once; the freed blocks sat at the top of the heap, went back to the kernel, and the
next blocks were faulted in and zeroed again. A cold read of 4 x 256 MiB with a cache
dir took 230,000-250,000 page faults (every byte read); with a threshold above the
tier's size, 65,000-69,000 (the tier filling once) and 0.1-0.3 s less system time
(/tmp probe, paired). Memory kept at the top of the heap is what the tier held a
moment before, so the peak resident size does not change.

The daemon's heap is also backed by transparent huge pages where the kernel offers them
on request (``/sys/kernel/mm/transparent_hugepage/enabled``: ``madvise``, as on the
bench machine; ``always`` gives them anyway, ``never`` not at all): glibc's
``glibc.malloc.hugetlb=1`` tunable, which must be in the environment when the process
starts, so the commands that start a daemon put it there (`daemon_environment`). A cold
read copies each byte twice in the daemon's memory (from the socket, then into the
kernel's page cache), and with 4 KiB pages each block was 2,048 page faults and as many
TLB entries. Measured, cold read of 4 x 256 MiB, default
options, 6 pairs: page faults 1,370 against 65,000 per GiB, daemon 0.64-0.83 against
0.69-1.08 CPU-s/GiB (medians 0.685 and 0.805), 1,039-1,415 against 867-1,225 MB/s;
peak RSS 302-311 against 299-307 MiB. With the page cache filling memory (1.7-3 GiB
free) the kernel compacted memory for some faults (58 and 147 stalls in a 1 GiB read)
and the reads ran as fast as without (1,205-1,428 against 1,174-1,320 MB/s, 3 pairs).
A user's own ``glibc.malloc.hugetlb`` setting is kept (``=0`` turns this off).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
from collections.abc import Mapping

M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
M_ARENA_MAX = -8
MMAP_THRESHOLD_MAX = 32 << 20  # glibc refuses more
TRIM_MIN_BYTES = 64 << 20
TRIM_MAX_BYTES = 1 << 30  # mallopt takes an int
HUGE_PAGES_TUNABLE = "glibc.malloc.hugetlb"


def mmap_threshold(block_bytes: int) -> int:
    """Just above one block: blocks (and download buffers) come from the heap, while
    pyfuse3's 1 MiB ``calloc`` per readdir stays a fresh zero mapping, which costs a few
    page faults instead of clearing 1 MiB of reused heap."""
    return min(MMAP_THRESHOLD_MAX, block_bytes + (1 << 20))


def trim_threshold(ram_bytes: int) -> int:
    """The free heap top kept for the next blocks: twice the RAM tier (its blocks and the
    downloads under way, which it reserves room for, can all be freed at once), within
    bounds."""
    return max(TRIM_MIN_BYTES, min(2 * ram_bytes, TRIM_MAX_BYTES))


def tune_allocator(block_bytes: int, ram_bytes: int = 0) -> bool:
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
            (M_TRIM_THRESHOLD, trim_threshold(ram_bytes)),
            (M_ARENA_MAX, 1),
        )
    )


def daemon_environment(base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment to start a mount daemon with: ``base`` (this process's) with
    glibc's heap on transparent huge pages (see the module doc), unless it says
    otherwise already."""
    env = dict(os.environ if base is None else base)
    tunables = env.get("GLIBC_TUNABLES", "")
    if not any(t.split("=", 1)[0] == HUGE_PAGES_TUNABLE for t in tunables.split(":")):
        env["GLIBC_TUNABLES"] = ":".join(filter(None, (tunables, f"{HUGE_PAGES_TUNABLE}=1")))
    return env
