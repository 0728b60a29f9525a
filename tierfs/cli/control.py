"""The daemon's control socket: how `tierfs stats` asks a running mount for its counters.

Each mount listens on a Unix socket named after a hash of its mountpoint, in
``/run/tierfs`` (0700; ``$XDG_RUNTIME_DIR/tierfs`` or ``/tmp/tierfs-UID`` when
``/run`` is not writable). A client sends one line (``stats``) and reads one
JSON document back. Only the mount's owner (and root) can reach it.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import logging
import os
import socket
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import trio

from tierfs.cli.mountpoint import canonical

MAX_REQUEST_BYTES = 64 << 10  # a request names at most one path
REQUEST_WAIT_S = 30.0  # a client that sends no request line in this long is let go

log = logging.getLogger("tierfs")


def socket_dir() -> Path:
    for base in (Path("/run"), Path(os.environ.get("XDG_RUNTIME_DIR", "/nonexistent"))):
        if base.is_dir() and os.access(base, os.W_OK):
            return base / "tierfs"
    return Path(f"/tmp/tierfs-{os.getuid()}")


def socket_path(mountpoint: str) -> Path:
    # (fsencode: a mountpoint whose name is not UTF-8 is still a name; .encode() raised)
    digest = hashlib.sha256(os.fsencode(canonical(mountpoint))).hexdigest()[:20]
    return socket_dir() / f"{digest}.sock"


Handler = Callable[[dict[str, Any]], Awaitable[dict[str, Any]]]


async def serve_control(mountpoint: str, handlers: dict[str, Handler]) -> None:
    """Answer requests (``stats``, ``sync``: the keys of ``handlers``) until cancelled, one
    JSON line each; the socket file is removed on the way out. A request is one line: its
    name, then optionally a space and a JSON object of arguments (``sync {"path": "a/b"}``).

    Nothing here ends the mount: a socket that cannot be made (its directory another
    user's, a path too long for a Unix socket) is one warning, and a request that fails
    (JSON nested past Python's recursion limit raised RecursionError, past the
    ValueError caught) is one error answer; either ended the daemon's nursery before."""
    try:
        path = socket_path(mountpoint)
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(path.parent, 0o700)
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
        sock = trio.socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    except (OSError, ValueError) as err:
        log.warning("no control socket (%s): tierfs stats, sync and prefetch cannot reach it", err)
        return
    ours: int | None = None  # the socket file's inode, once bound
    try:
        try:
            await sock.bind(str(path))
            os.chmod(path, 0o600)
            ours = os.stat(path).st_ino
            sock.listen(8)
        except OSError as err:
            sock.close()
            log.warning(
                "no control socket at %s (%s): tierfs stats, sync and prefetch cannot reach it",
                path,
                err.strerror or err,
            )
            return
        listener = trio.SocketListener(sock)

        async def answer(stream: trio.SocketStream) -> None:
            async with stream:
                try:
                    body = await _answer(stream, mountpoint, handlers)
                except Exception as err:  # (a defect: one error answer, never the mount's end)
                    log.exception("control request failed")
                    body = {"error": f"internal error: {type(err).__name__}"}
                if body is None:
                    return  # the client sent nothing in time
                try:
                    await stream.send_all(json.dumps(body).encode() + b"\n")
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    pass  # the client left first (a sync's timeout, Ctrl-C): not the mount's end

        await trio.serve_listeners(answer, [listener])
    finally:
        _remove_if_ours(path, ours)


def _remove_if_ours(path: Path, ours: int | None) -> None:
    """Remove the socket file if it is still the one this daemon bound: a daemon that was
    stuck, taken off lazily and mounted over, then let go, removed the new daemon's
    socket on its way out (stats, sync and prefetch could no longer reach that mount)."""
    with contextlib.suppress(FileNotFoundError):
        if ours is None or os.stat(path).st_ino == ours:
            path.unlink()


async def _answer(
    stream: trio.SocketStream, mountpoint: str, handlers: dict[str, Handler]
) -> dict[str, Any] | None:
    """The answer to the one request ``stream`` sends; None if it sends none in time."""
    line = b""
    with trio.move_on_after(REQUEST_WAIT_S) as waited:
        while b"\n" not in line and len(line) < MAX_REQUEST_BYTES:
            chunk = await stream.receive_some(MAX_REQUEST_BYTES)
            if not chunk:
                break
            line += chunk
    if waited.cancelled_caught:
        return None
    name, _, raw = line.decode("utf-8", "replace").strip().partition(" ")
    handler = handlers.get(name)
    try:
        args = json.loads(raw) if raw else {}
    except (ValueError, RecursionError):
        args = None
    if handler is None or not isinstance(args, dict):
        return {"error": "unknown request"}
    return {"mountpoint": mountpoint, **await handler(args)}


def request_statistics(mountpoint: str, timeout_s: float = 10.0) -> dict[str, Any]:
    """Ask the daemon of ``mountpoint`` for its counters (blocking; for the CLI)."""
    return request(mountpoint, "stats", timeout_s)


def request(
    mountpoint: str,
    what: str,
    timeout_s: float | None = 10.0,
    args: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """One request to the daemon of ``mountpoint`` (blocking; for the CLI)."""
    path = socket_path(mountpoint)
    line = what if args is None else f"{what} {json.dumps(args)}"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as client:
        client.settimeout(timeout_s)
        client.connect(str(path))
        client.sendall(line.encode() + b"\n")
        chunks = []
        while chunk := client.recv(1 << 16):
            chunks.append(chunk)
    try:
        answer = json.loads(b"".join(chunks))
    except ValueError:  # (the daemon died or ended mid-request: "internal error" before)
        answer = None
    if not isinstance(answer, dict):
        raise OSError(errno.ECONNRESET, "the daemon ended the request without an answer")
    return answer


def _size(count: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(count) < 1024 or unit == "TiB":
            return f"{count:.0f} {unit}" if unit == "B" else f"{count:.1f} {unit}"
        count /= 1024
    return f"{count:.1f} TiB"


def render_statistics(data: dict[str, Any]) -> str:
    """The human table of `tierfs stats`."""
    gcs, blocks, meta = data["gcs"], data["data"], data["metadata_cache"]
    lines = [
        f"tierfs mount {data['mountpoint']}",
        "",
        "GCS         requests {:>10}   media reads {:>8}   read {:>10}   written {:>10}".format(
            gcs.get("requests", 0),
            gcs.get("media_reads", 0),
            _size(gcs.get("bytes_read", 0)),
            _size(gcs.get("bytes_written", 0)),
        ),
        "            errors {:>12}   retries {:>12}   blocks fetched {:>6}   shared {:>6}".format(
            gcs.get("errors", 0),
            gcs.get("retries", 0),
            blocks["gcs_blocks"],
            blocks["shared_waits"],
        ),
        "",
        f"{'tier':<10}{'hits':>10}{'misses':>10}{'served':>12}{'stored':>12}{'used':>12}"
        f"{'capacity':>12}{'evicted':>9}{'corrupt':>9}{'errors':>8}",
    ]
    for name, tier in blocks["tiers"].items():
        lines.append(
            f"{name:<10}{tier.get('hits', 0):>10}{tier.get('misses', 0):>10}"
            f"{_size(tier.get('bytes_read', 0)):>12}{_size(tier.get('bytes_written', 0)):>12}"
            f"{_size(tier.get('used_bytes', 0)):>12}{_size(tier.get('capacity_bytes', 0)):>12}"
            f"{tier.get('evictions', 0):>9}{tier.get('corrupt', 0):>9}{tier.get('errors', 0):>8}"
        )
    shared = blocks["tiers"].get("shared")
    if shared is not None:
        aside = "   (stepped aside now)" if shared.get("unavailable") else ""
        lines.append(
            f"shared      waits {shared.get('waits', 0)}   served after a wait "
            f"{shared.get('wait_hits', 0)}   waits timed out {shared.get('wait_timeouts', 0)}   "
            f"evicted {_size(shared.get('evicted_bytes', 0))}   outages "
            f"{shared.get('outages', 0)}{aside}"
        )
    if not blocks["tiers"]:
        lines.append("(no data tiers: ram-cache:max-size-mb is 0 and the file cache is off)")
    lines += [
        "",
        f"metadata    hits {meta['hits']}   negative hits {meta['negative_hits']}   "
        f"misses {meta['misses']}   entries {meta['entries']}   {_size(meta['used_bytes'])}",
        f"inodes {data['inodes']}   open files {data['open_files']}   "
        f"local files that could not be made {data.get('staging_errors', 0)}",
    ]
    requests = data.get("requests")
    if requests is not None:
        served = requests.get("operations", {}).values()
        lines.append(
            f"requests    served {sum(op['count'] for op in served)}   "
            f"errors {sum(op['errors'] for op in served)}   in flight {requests['in_flight']}   "
            f"longest wait {requests['longest_wait_s']:.3f} s   "
            f"interrupted {requests['interrupted']}   slow warnings {requests['slow_warnings']}"
        )
    dirs = data.get("directories")
    if dirs is not None:
        lines.append(
            f"listings    served {dirs['listings_served']}   opens {dirs['opens']}   "
            f"kept by the kernel {dirs['kept']}   listed ahead {dirs.get('listed_ahead', 0)}   "
            f"read for the kernel {dirs.get('prefilled', 0)}"
        )
    collector = data.get("python_gc")
    if collector is not None:
        lines.append(
            "python gc   collections {}   paused {:.3f} s   longest pause {:.1f} ms   "
            "kept out of collections {}".format(
                "/".join(map(str, collector["collections"])),
                collector["paused_s"],
                collector["longest_pause_s"] * 1e3,
                collector["frozen_objects"],
            )
        )
    direct = data.get("passthrough", {})
    if direct.get("enabled"):
        ssd = blocks["tiers"].get("ssd", {})
        lines.append(
            f"passthrough opens {direct['opens']}   handed to the kernel "
            f"{_size(ssd.get('passthrough_bytes', 0))}   files open {direct['files_open']}   "
            f"sealed {ssd.get('seals', 0)}   busy {direct['busy']}   failed {direct['failed']}"
        )
    writeback = data.get("writeback", {})
    if writeback.get("enabled"):
        lines.append(
            f"write-back  pending {writeback['pending']}   committed {writeback['committed']}   "
            f"uploaded {writeback['uploaded']}   failed {writeback['failed']}   "
            f"failing now {writeback['failing']}   conflicts {writeback['conflicts']}   "
            f"moving {writeback.get('moving', 0)}   deleting {writeback.get('deleting', 0)}   "
            f"SSD copies waiting {writeback.get('copying', 0)}   "
            f"not copied {writeback.get('not_copied', 0)}"
        )
    return "\n".join(lines)
