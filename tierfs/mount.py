"""The composition root: config -> bucket -> filesystem -> a live FUSE mount.

`serve` runs in the daemon (or in the foreground with ``--foreground``): it
checks the mountpoint, connects to the bucket and checks it exists, mounts,
tells the waiting parent that the mount answers (``ready``), then serves
until the mount goes away. SIGTERM, SIGINT and SIGHUP upload pending writes
and unmount; so does ``tierfs unmount`` (the kernel ends the session after
every file is closed, and closing a file uploads it).

The one nursery that owns background work lives here; pyfuse3's request
loop runs inside it.
"""

from __future__ import annotations

import functools
import logging
import os
import re
import resource
import signal
import tempfile
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pyfuse3
import trio

from mount_options import Config
from tierfs import settings
from tierfs.cache import Tier
from tierfs.cache.ram import RamTier
from tierfs.cache.shared import SharedTier
from tierfs.cache.ssd import SsdTier
from tierfs.cli.control import Handler, serve_control
from tierfs.cli.fdmount import check_fd, fuse_fd
from tierfs.cli.mountpoint import MountError, check_before_mount, set_read_ahead
from tierfs.core.background import Background
from tierfs.core.blocks import Blocks
from tierfs.core.filesystem import Filesystem
from tierfs.core.writeback import Journal
from tierfs.errors import TierfsError, root_cause
from tierfs.fuse.collector import freeze_startup
from tierfs.fuse.kernel import PyfuseKernel
from tierfs.fuse.operations import Operations
from tierfs.metrics import MetricsServer
from tierfs.storage import Bucket
from tierfs.storage.gcs import GcsBucket

log = logging.getLogger("tierfs.mount")
# Background uploads at a time with write-back on (per mount): a small file's upload is
# one request of a few ms, so a save of thousands waits on request latency, not bytes;
# large files are held to fewer (tierfs.core.filesystem.LARGE_UPLOADS).
WRITEBACK_UPLOADS = 16
# The part of its volume's space a file cache sized -1 takes when the write-back journal
# is on the same volume: the journal needs room for the saves waiting for GCS. (Taking
# it all, the cache filled the volume to its margin, and a save larger than the margin,
# 1 GiB at most, failed with ENOSPC once restores and past saves had filled the cache.)
JOURNAL_SHARE = 0.5


def connect(config: Config) -> GcsBucket:
    """The bucket of a config, through the same client path production and tests use."""
    return GcsBucket.connect(config.bucket, **settings.gcs_connection(config))


def fuse_options(config: Config) -> set[str]:
    options = set(pyfuse3.default_options)
    options.add(f"fsname={config.bucket}")
    options.add("subtype=tierfs")
    options.update(config.fuse_options)
    return options


def raise_open_file_limit() -> int:
    """Raise this process's soft limit on open files to its hard limit; the new soft limit.

    Each file written and not yet uploaded keeps its staged file open, so a write-back
    save of a few thousand small files (an Orbax step) needs more than the soft limit
    many systems start a process with (1,024): past it every create failed with EMFILE.
    """
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or hard > soft:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            return hard
        except (ValueError, OSError):
            pass
    return soft


async def serve(
    config: Config,
    ready: Callable[[str | None], None],
    *,
    bucket: Bucket | None = None,
    progress: Callable[[str], None] | None = None,
) -> None:
    """Mount and serve until unmounted or signalled. ``ready(None)`` once the mount answers,
    ``ready(message)`` if it never will; ``progress(what)`` meanwhile, while a long step
    moves on (`tierfs.cli.readiness`)."""
    mountpoint = config.mountpoint
    owned: GcsBucket | None = None
    log.debug("open files: up to %d", raise_open_file_limit())
    try:
        fd = fuse_fd(mountpoint)  # /dev/fd/N: mounted by someone else (tierfs/cli/fdmount.py)
        if fd is None:
            check_before_mount(mountpoint)
        elif (problem := check_fd(fd)) is not None:
            raise MountError(problem)
        for option, directory in settings.local_directories(config):
            try:
                await trio.to_thread.run_sync(check_writable, directory)
            except OSError as err:
                raise MountError(
                    f"cannot use {option} {directory}: {err.strerror or err}"
                ) from None
        if bucket is None:
            # Finding credentials may block (ADC can ask the metadata server): not on trio's thread.
            owned = await trio.to_thread.run_sync(connect, config)
            await owned.check()
            bucket = owned
    except (MountError, TierfsError) as err:
        if owned is not None:
            owned.close()
        ready(str(err))
        return
    try:
        await _serve_mounted(config, bucket, ready, progress or (lambda what: None))
    finally:
        if owned is not None:
            owned.close()


async def tiers(
    config: Config, limiter: trio.CapacityLimiter, background: Background | None = None
) -> list[Tier]:
    """RAM, then the SSD file cache (when ``cache-dir`` is set and its size is not 0), then
    the shared tier (``enable-experimental-shared-chunk-cache``)."""
    wanted = settings.tiers(config)
    chain: list[Tier] = []
    if wanted.ram_bytes > 0:
        chain.append(RamTier(wanted.ram_bytes))
    if wanted.ssd:
        journal_beside = config["write:write-back"] and await trio.to_thread.run_sync(
            _same_volume, wanted.cache_dir, settings.writeback_root(config)[1]
        )
        chain.append(
            await SsdTier.create(
                Path(wanted.cache_dir),
                config.bucket,
                wanted.ssd_bytes,
                block_size=wanted.block_bytes,
                include=re.compile(wanted.include) if wanted.include else None,
                exclude=re.compile(wanted.exclude) if wanted.exclude else None,
                limiter=limiter,
                auto_share=JOURNAL_SHARE if journal_beside else 1.0,
            )
        )
    shared = settings.shared(config)
    if shared.enabled:
        tier = SharedTier(
            Path(shared.directory),
            config.bucket,
            shared.max_bytes,
            block_size=wanted.block_bytes,
            include=re.compile(wanted.include) if wanted.include else None,
            exclude=re.compile(wanted.exclude) if wanted.exclude else None,
            limiter=trio.CapacityLimiter(8),  # its own: a stalled share must not stall the SSD
            background=_starter(background),
        )
        await tier.open()
        chain.append(tier)
    elif config["file-cache:enable-experimental-shared-chunk-cache"]:
        log.warning(
            "enable-experimental-shared-chunk-cache needs a directory (cache-dir or "
            "file-cache:shared-cache-dir) and a size other than 0: no shared cache"
        )
    return chain


def _same_volume(first: str, second: str) -> bool:
    """Whether two existing directories are on one file system."""
    try:
        return os.stat(first).st_dev == os.stat(second).st_dev
    except OSError:
        return False


def _starter(
    background: Background | None,
) -> Callable[[Callable[[], Awaitable[None]]], bool] | None:
    """For a tier: start a task in the mount's background if it runs (True), else False."""
    if background is None:
        return None
    spawner = background

    def start(fn: Callable[[], Awaitable[None]]) -> bool:
        if not spawner.running:
            return False
        spawner.spawn(fn)
        return True

    return start


def check_writable(directory: str) -> None:
    """Make ``directory`` if missing and write a file in it; OSError if either fails. A
    cache that cannot be written would otherwise be a mount that caches nothing, or fails
    every create, while looking healthy."""
    os.makedirs(directory, exist_ok=True)
    with tempfile.TemporaryFile(dir=directory) as probe:
        probe.write(b"tierfs")
        probe.flush()


def blocks_for(config: Config, bucket: Bucket, chain: list[Tier]) -> Blocks:
    wanted = settings.blocks(config)
    return Blocks(
        bucket,
        chain,
        block_size=wanted.block_bytes,
        downloads=trio.CapacityLimiter(wanted.downloads),
        per_file=wanted.per_file,
        check_crc=wanted.check_crc,
        memory=next((tier for tier in chain if isinstance(tier, RamTier)), None),
    )


PROGRESS_EVERY_S = 10.0


async def _recovered(journal: Journal, bucket: Bucket, progress: Callable[[str], None]) -> Any:
    """`Journal.recover`, saying ``progress`` every `PROGRESS_EVERY_S` in which GCS got
    requests or bytes from it: whoever started the daemon waits as long as it moves on,
    and no longer than a quiet spell if it hangs."""

    def moved() -> int:
        counts = bucket.statistics()
        return counts.get("requests", 0) + counts.get("bytes_written", 0)

    async def say_it_moves() -> None:
        seen = moved()
        while True:
            await trio.sleep(PROGRESS_EVERY_S)
            now = moved()
            if now != seen:
                progress("uploading what a previous daemon left in the write-back journal")
            seen = now

    async with trio.open_nursery() as nursery:
        nursery.start_soon(say_it_moves)
        result = await journal.recover(bucket, trio.to_thread.run_sync)
        nursery.cancel_scope.cancel()
    return result


async def _serve_mounted(
    config: Config,
    bucket: Bucket,
    ready: Callable[[str | None], None],
    progress: Callable[[str], None],
) -> None:
    mountpoint = config.mountpoint
    core = settings.filesystem(config, uid=os.getuid(), gid=os.getgid())
    # (A /dev/fd/N mountpoint was mounted by someone else, maybe where this daemon cannot
    # see it: no directories read through it, `tierfs.core.prefill`.)
    readable = None if fuse_fd(mountpoint) is not None else os.path.abspath(mountpoint)
    background, kernel = Background(), PyfuseKernel(readable)
    try:
        chain = await tiers(config, trio.CapacityLimiter(8), background)
    except OSError as err:
        ready(f"cannot use cache-dir {config['cache-dir']}: {err.strerror or err}")
        return
    journal = None
    if config["write:write-back"]:
        root = settings.writeback_root(config)[1]
        try:
            journal = await trio.to_thread.run_sync(
                functools.partial(Journal, Path(root), config.bucket, only_dir=config["only-dir"])
            )
            recovered = await _recovered(journal, bucket, progress)
        except OSError as err:
            ready(f"cannot use {root} for write-back: {err.strerror or err}")
            return
        if recovered.uploaded or recovered.already_there or recovered.conflicts:
            # (Finished directory renames say so themselves, one line each.)
            log.warning(
                "write-back: finished %d upload(s) left by a previous daemon (%d were already "
                "in GCS, %d kept as conflicts)",
                len(recovered.uploaded),
                len(recovered.already_there),
                len(recovered.conflicts),
            )
    blocks = blocks_for(config, bucket, chain)
    fs = Filesystem(
        bucket, core, blocks=blocks, journal=journal, background=background, kernel=kernel
    )
    operations = Operations(fs, mountpoint, kernel)
    metrics: MetricsServer | None = None
    port, host = settings.metrics(config)
    if port:
        try:
            metrics = MetricsServer(
                port, host, lambda: (operations.statistics(), operations.inflight.latencies())
            )
        except OSError as err:
            ready(f"cannot serve Prometheus metrics on port {port}: {err.strerror or err}")
            return
    operations.collections.install()
    # Everything alive now lives as long as the mount: out of every later collection.
    operations.collections.frozen = freeze_startup()
    try:
        pyfuse3.init(operations, mountpoint, fuse_options(config))
    except RuntimeError as err:
        if metrics is not None:
            metrics.close()
        operations.collections.remove()
        ready(f"cannot mount {mountpoint}: {err}")
        return
    log.info("mounted gs://%s on %s", config.bucket, mountpoint)
    signalled = trio.Event()
    finished = False
    try:
        async with trio.open_nursery() as nursery:
            with background.attached(nursery):
                nursery.start_soon(_on_signals, fs, signalled)
                nursery.start_soon(serve_control, mountpoint, _control_handlers(fs, operations))
                nursery.start_soon(operations.inflight.run)
                if journal is not None:
                    nursery.start_soon(fs.run_uploads, WRITEBACK_UPLOADS)
                read_ahead = (config["read-ahead-kb"], "read-ahead-kb" in config.assigned)
                nursery.start_soon(_announce, mountpoint, read_ahead, ready, signalled)
                await pyfuse3.main()
                with trio.CancelScope(shield=True):
                    await fs.finish()  # with the background tasks still running
                    finished = True
                nursery.cancel_scope.cancel()
    finally:
        if not finished:  # the loop failed: upload what is still dirty without the nursery
            with trio.CancelScope(shield=True):
                await fs.finish()
        if metrics is not None:
            with trio.CancelScope(shield=True):  # a scrape may be waiting for this thread
                await trio.to_thread.run_sync(metrics.close)
        fs.close()
        operations.collections.remove()
        # After a signal we unmount ourselves; after `tierfs unmount` the kernel already has.
        pyfuse3.close(unmount=signalled.is_set())
        log.info("unmounted %s", mountpoint)


def _control_handlers(fs: Filesystem, operations: Operations) -> dict[str, Handler]:
    async def stats(args: dict[str, Any]) -> dict[str, Any]:
        return operations.statistics()

    async def sync(args: dict[str, Any]) -> dict[str, Any]:
        """``tierfs sync [PATH]``: everything written so far (at or below ``path``, relative
        to the mount root) is in GCS, or the first error."""
        try:
            await fs.sync_all(str(args.get("path", "")))
        except Exception as err:
            return {"error": f"{describe(err)} ({fs.pending_uploads()} file(s) not in GCS yet)"}
        return {"synced": True}

    return {"stats": stats, "sync": sync}


def describe(error: BaseException) -> str:
    """One line for a user: the root cause's message (exception groups unwrapped)."""
    cause = root_cause(error)
    return " ".join(str(cause).split()) or type(cause).__name__


async def _announce(
    mountpoint: str,
    read_ahead: tuple[int, bool],
    ready: Callable[[str | None], None],
    stop: trio.Event,
) -> None:
    """Say ``ready`` once the mount answers: a statvfs from a thread returns only after the
    kernel's FUSE INIT, served by the request loop running beside it. INIT resets the
    mount's read-ahead, so ``read_ahead_kb`` is applied here, before announcing.

    ``read_ahead`` is (KiB, asked for by the user). The default, 1 MiB, makes the kernel
    send 1 MiB reads instead of 128 KiB ones: RAM-tier hits went from 0.8-1.0 to 1.7-2.2
    GB/s. Where it cannot be set (not root), only a value the user asked for warns."""
    read_ahead_kb, asked = read_ahead
    try:
        await trio.to_thread.run_sync(os.statvfs, mountpoint)
    except OSError as err:
        ready(f"mounted, but {mountpoint} does not answer: {err.strerror}")
        stop.set()  # we unmount ourselves on the way out
        pyfuse3.terminate()
        return
    if read_ahead_kb:
        try:
            set_read_ahead(mountpoint, read_ahead_kb)
            log.info("read_ahead_kb=%d on %s", read_ahead_kb, mountpoint)
        except MountError as err:
            log.log(logging.WARNING if asked else logging.DEBUG, "%s", err)
    ready(None)


async def _on_signals(fs: Filesystem, signalled: trio.Event) -> None:
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT, signal.SIGHUP) as signals:
        async for signum in signals:
            log.info("%s: uploading pending writes, then unmounting", signal.Signals(signum).name)
            try:
                # With write-back the journal keeps what GCS does not take now: stop at the
                # first upload that fails its retries (else each pending file waited its own
                # retry deadline, 120 s, and Kubernetes' grace period ended in a SIGKILL).
                await fs.sync_all(stop_at_failure=fs.journal is not None)
            except Exception as err:
                log.error("pending writes could not be uploaded: %s", err)
            signalled.set()
            pyfuse3.terminate()
            return
