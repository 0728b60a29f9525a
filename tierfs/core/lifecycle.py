"""Statistics, ``tierfs sync``, and the end of a mount: what waits for what at unmount.

A part of `tierfs.core.filesystem.Filesystem`, sharing its state.
"""

from __future__ import annotations

import contextlib
import logging
from typing import TYPE_CHECKING

import trio

from tierfs.core.inodes import Inode
from tierfs.core.uploads import LARGE_UPLOAD_BYTES
from tierfs.errors import BackendError

if TYPE_CHECKING:  # a part of `Filesystem`: its state is the core's (typed loosely
    # until the parts take collaborators instead of sharing one object)
    from typing import Any as _Base
else:
    _Base = object

log = logging.getLogger("tierfs.fs")
MOVES_AT_UNMOUNT_S = 300.0  # unmount waits this long for background renames (journaled)
FETCHES_AT_UNMOUNT_S = 60.0  # ... and for blocks read whose slower tiers are storing them
SYNC_UPLOADS = 16  # uploads at a time for `tierfs sync`, unmount and SIGTERM


class Lifecycle(_Base):
    """Statistics, ``tierfs sync``, and the end of a mount: what waits for what at unmount."""

    def statistics(self) -> dict[str, object]:
        """Everything `tierfs stats` shows: GCS requests and bytes, tiers, metadata cache."""
        return {
            "gcs": self.bucket.statistics(),
            "data": self.blocks.statistics(),
            "metadata_cache": self.metadata.statistics(),
            "directories": {
                **self.dir_counts,
                "listed_ahead": self._ahead.used,  # readdirs answered by a listing made ahead
                "listed_ahead_unused": self._ahead.stale,  # too old, or a change came after
                # Listings made ahead that a lookup or readdir waited for: urged, they ran
                # before the ones only bet on (tierfs.core.slots).
                "listings_urged": self._prefetch_slots.urged,
                # Read through the mount for a stat storm (tierfs.core.prefill): directories,
                # the entries the kernel learned, failed reads.
                "prefilled": self.prefill.counts["dirs"],
                "prefilled_entries": self.prefill.counts["entries"],
                "prefill_failed": self.prefill.counts["failed"],
            },
            "hidden_names": self.names.hidden_names,
            "passthrough": self.backings.statistics(),
            "inodes": len(self.inodes),
            "open_files": len(self.files),
            "staging_errors": self.staging_errors,
            "background_errors": self.background.errors,
            "write_requests": self.write_requests,
            "flushes_held": self.flushes_held,
            "writeback": {
                "enabled": self.journal is not None,
                "pending": self.pending_uploads(),
                "failing": len(self._failed),
                "moving": sum(1 for _ in self.pending_moves),
                "deleting": len(self.pending_deletes),
                "delete_errors": self.delete_errors,
                "copying": self._copies.running,
                "not_copied": self._copies.skipped,
                **self.writeback_counts,
            },
        }

    def pending_uploads(self) -> int:
        """Files closed (committed) but not in GCS yet."""
        return sum(
            1
            for inode in self.inodes.by_ino.values()
            if inode.staged is not None and inode.staged.committed and inode.staged.dirty
        )

    # -- shutdown ---------------------------------------------------------------------------------

    async def sync_all(
        self, path: str = "", *, moves: bool = True, stop_at_failure: bool = False
    ) -> bool:
        """Upload every dirty file now (``tierfs sync``, unmount, SIGTERM), write-back ones
        included; only ``path`` and what is below it, if given; SYNC_UPLOADS at a time (a
        save of small files is request latency, one by one it took 6 ms a file). Errors
        are raised after trying all: the first, with how many failed. ``stop_at_failure``:
        after the first upload that fails (its retries over), try no more (an unmount with
        write-back: the journal keeps the rest, and GCS is not answering); then False is
        returned, not the error."""
        failures: list[Exception] = []
        limit = trio.CapacityLimiter(SYNC_UPLOADS)
        stop = trio.CancelScope()

        async def one(inode: Inode) -> None:
            staged = inode.staged
            large = staged is not None and staged.size > LARGE_UPLOAD_BYTES
            try:
                async with limit, self._large_uploads if large else contextlib.nullcontext():
                    await self._sync(inode)
            except Exception as err:  # keep going: upload what can be uploaded
                failures.append(err)
                if stop_at_failure:
                    stop.cancel()
            else:
                if inode.open_handles == 0:
                    self._retire(inode)

        # With write-back, a file open for writing and written since its last commit (a
        # close of a dup, an fsync) is left to its close: it holds no version a close
        # committed (SIGTERM reaches the writer too). It was uploaded half written, and
        # the journal then let go of the version its last close had committed. Without
        # write-back, sync is fsync's: what the file holds now.
        writing = (
            {id(h.inode) for h in self.files.values() if h.writable and not _clean(h.inode)}
            if self.journal is not None
            else set()
        )
        with stop:
            async with trio.open_nursery() as nursery:
                for inode in list(self.inodes.by_ino.values()):
                    if path and inode.path != path and not inode.path.startswith(path + "/"):
                        continue
                    if id(inode) in writing:
                        continue
                    if inode.staged is not None and inode.staged.dirty and not inode.unlinked:
                        nursery.start_soon(one, inode)
        if stop_at_failure and failures:  # (all may have failed before the cancel bit)
            log.warning(
                "GCS fails (%s): %d file(s) stay in the write-back journal; the next mount "
                "uploads them",
                failures[0],
                self.pending_uploads(),
            )
            return False
        if len(failures) > 1:
            log.error("%d files could not be uploaded; the first: %s", len(failures), failures[0])
        if failures:
            raise failures[0]
        for moving in self.pending_moves.covering(path) if moves else []:
            await moving.wait()  # durable means moved too
        if moves:
            await self.pending_deletes.settled(path)  # and deleted
        return True

    async def finish(self) -> None:
        """At unmount, while background tasks still run: upload every dirty file, let the
        SSD-tier copies of uploads finish, and seal what is whole, so that the next mount
        reads those files from local disk, directly. An upload error is logged, not raised:
        the daemon is going away either way (a write-back journal keeps the file)."""
        try:
            # Without write-back nothing else has these files: try them all. With it, the
            # journal has them: one upload that fails its retries ends the attempt, and
            # the renames and deletes are not waited for either (GCS is not answering;
            # they wait in the journal too: unmount took 120 s + 300 s so).
            answering = await self.sync_all(moves=False, stop_at_failure=self.journal is not None)
        except Exception as err:
            log.error("pending writes could not be uploaded: %s", err)
            answering = True
        if not answering:  # nor the requests retrying in flight (the journal has them)
            self.bucket.let_go()
        with trio.move_on_after(MOVES_AT_UNMOUNT_S if answering else 0):  # journaled: bounded
            for moving in self.pending_moves:
                await moving.done.wait()
            if self.deletes.running:  # (not when the loop failed: nothing deletes then)
                with contextlib.suppress(BackendError):  # failing: the journal keeps them
                    await self.pending_deletes.settled("")
        if self.pending_deletes:
            log.warning(
                "unmount: %d deletes not done in GCS yet; the next mount does them from the "
                "journal",
                len(self.pending_deletes),
            )
        if self.pending_moves:
            log.warning(
                "unmount: %d directory rename(s) still moving objects; the next mount "
                "finishes them from the journal",
                sum(1 for _ in self.pending_moves),
            )
        if self._copies.running:
            log.info("unmount: finishing the SSD-tier copies of %d uploads", self._copies.running)
        await self._copies.wait_idle()
        with trio.move_on_after(FETCHES_AT_UNMOUNT_S):  # blocks read, still being stored
            await self.blocks.fetches_settled()
        await self.blocks.seal_pending()

    def close(self) -> None:
        if self.journal is not None:
            self.journal.drop_spares()
        for inode in self.inodes.by_ino.values():
            if inode.staged is not None:
                inode.staged.close()
                inode.staged = None

    # -- helpers --------------------------------------------------------------------------------


def _clean(inode: Inode) -> bool:
    """Whether the file holds what was last committed (the kernel's direct writes are
    seen only by their writer's lock holder: a file written directly is not taken as so)."""
    staged = inode.staged
    return staged is not None and staged.committed and not staged.direct
