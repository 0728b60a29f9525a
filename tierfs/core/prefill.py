"""Directories read through the mount, so that the kernel learns all their names at once.

A cold stat storm (a data loader stat'ing every file of a dataset, ``os.path.exists``
over a list of names, a random-order ``stat`` of 10,000 files) sends the daemon one
LOOKUP per name: the kernel knows a name only once a lookup or a readdir has told it.
Each LOOKUP is a round trip through the kernel, pyfuse3 and trio, about 90 us of daemon
CPU here even for a file system that answers from a dict (``benchmarks.nullfs``), so
the storm runs at the speed of that round trip however fast the metadata cache is.
A readdir tells the kernel every entry of a directory with its attributes at once
(pyfuse3 answers READDIRPLUS only), and the names it learns are then answered by the
kernel's dentry cache, with no request at all.

So when lookups keep finding names in a directory the metadata prefetch has just
listed, the daemon reads that directory through its own mountpoint, from a worker
thread (`Kernel.read_dir`). The kernel asks the daemon for the entries, and the rest of
the storm's stats there never reach the daemon. Measured (``/tmp`` probe: 10,000 objects
in 100 directories, stat in random order, fresh mount, page cache dropped): 9,692-11,795
against 4,176-6,170 stat/s, 764-1,650 LOOKUPs against 10,100, the same 102 GCS listings.

When (`DirPrefill.found`):

* only after the metadata prefetch listed the directory, and only while the kernel
  keeps names (an entry timeout above 0: ``metadata-cache:ttl-secs:0`` makes it ask
  again at every stat anyway);
* after `MIN_LOOKUPS` lookups found names there, and at least one per
  `ENTRIES_PER_LOOKUP` entries of that listing (of a listing cut at a page, the
  prefetch's 1,000 names of a subdirectory: of that page): a readdir entry costs the
  daemon a small part of a LOOKUP, so a storm that stops right after costs at most a few
  times the lookups it made, and one stat of one file never reads a directory of
  thousands;
* once per listing, one directory at a time (`READERS`).

The read is answered from the prefetch's listing while that may still answer a readdir
(`tierfs.core.listahead`: whole, fresh, no change made here since), so it costs GCS
nothing; otherwise (a page of a larger directory, or stale) the readdir lists the
directory itself as an ``ls`` would, up to `MAX_ENTRIES`, and answers nothing if there
are more: the kernel then learns nothing, and the metadata cache holds the names listed.

What the kernel learns is what a lookup of each name would have told it, with the same
entry and attribute timeouts, and what an ``ls`` of the directory tells it anyway. A
mount whose mountpoint the daemon cannot open (mounted by another process through
``/dev/fd/N``, in another mount namespace) has no prefill; after `MAX_FAILURES` failed
reads in a row (the mountpoint gone, a permission; not a directory removed or replaced
meanwhile) it stops for the mount, with one INFO line. The prefill's own readdir is told
apart (by the FUSE adapter: ``PyfuseKernel.is_reader``): it lists nothing ahead and is
not a walker's.
"""

from __future__ import annotations

import logging

import trio

from tierfs.core.background import Background
from tierfs.core.kernel import Kernel
from tierfs.core.namespace import DirListing

log = logging.getLogger("tierfs.fs")

MIN_LOOKUPS = 2  # names found in a directory before it is read through the mount
ENTRIES_PER_LOOKUP = 32  # and at least one found per this many of its entries
MAX_ENTRIES = 50_000  # larger directories teach the kernel nothing
MAX_WATCHED = 4096  # directories watched at once (the oldest are dropped)
MAX_FAILURES = 3  # failed reads in a row before the prefill stops for the mount
READERS = 1  # directories read at once


class DirPrefill:
    """Counts the lookups that found names in freshly listed directories, and reads a
    directory through the mount once they make a storm (see the module doc)."""

    def __init__(self, kernel: Kernel, background: Background, kernel_keeps_names: bool) -> None:
        self._kernel = kernel
        self._background = background
        self._enabled = kernel_keeps_names  # (an entry timeout above 0)
        self._watched: dict[str, list[int]] = {}  # dir path -> [entries, lookups found]
        self._limiter = trio.CapacityLimiter(READERS)
        self._failures = 0
        self.off = False  # stopped for the mount after failures
        self.counts = {"dirs": 0, "entries": 0, "failed": 0}

    def listed(self, dir_path: str, listing: DirListing) -> None:
        """The metadata prefetch listed ``dir_path``: watch it for a storm."""
        watched = self._watched
        watched.pop(dir_path, None)  # (an older listing's count is moot)
        if self.off or not self._kernel.reads_dirs:
            return
        size = len(listing.files) + len(listing.dirs)  # (of a cut listing: at least that)
        if size <= MIN_LOOKUPS or size > MAX_ENTRIES or not self._enabled:
            return  # (a directory of one or two names: their lookups are the whole storm)
        if len(watched) >= MAX_WATCHED:
            del watched[next(iter(watched))]
        watched[dir_path] = [size, 0]

    def found(self, dir_path: str) -> None:
        """A lookup found a name in ``dir_path`` (one the kernel did not know)."""
        counts = self._watched.get(dir_path)
        if counts is None:
            return
        counts[1] += 1
        if counts[1] < MIN_LOOKUPS or counts[1] * ENTRIES_PER_LOOKUP < counts[0]:
            return
        del self._watched[dir_path]
        if self._background.running:
            self._background.spawn(self._read, dir_path)

    async def _read(self, dir_path: str) -> None:
        if self.off:
            return
        try:
            # Abandoned on cancel: the thread waits on this daemon's own replies, which a
            # mount shutting down no longer sends (the kernel fails it once the fd closes).
            entries = await trio.to_thread.run_sync(
                self._kernel.read_dir, dir_path, abandon_on_cancel=True, limiter=self._limiter
            )
        except (OSError, ValueError) as err:  # (ValueError: a name the OS cannot take)
            self.counts["failed"] += 1
            log.debug("reading %r through the mount failed: %s", dir_path, err)
            if isinstance(err, FileNotFoundError | NotADirectoryError):
                return  # (removed or replaced meanwhile: says nothing of the mountpoint)
            self._failures += 1
            if self._failures >= MAX_FAILURES and not self.off:  # (reads already under way
                # fail on their own after this: one line for the mount)
                self.off = True
                self._watched.clear()
                log.info(
                    "directories are not read through the mountpoint (%s): "
                    "each stat of a cold name is a request",
                    err,
                )
            return
        self._failures = 0
        self.counts["dirs"] += 1
        self.counts["entries"] += entries
