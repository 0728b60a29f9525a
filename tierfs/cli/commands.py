"""``tierfs stats``, ``tierfs sync`` and ``tierfs unmount``: the commands that talk to a mount.

Each asks a running daemon something, so each can meet a mount that is not
there, not tierfs, dead (its daemon killed), hung, or reachable only by another
user. The control socket's own error (ENOENT, ECONNREFUSED) says none of that:
it named the socket's absence as if the user's path were missing ("no tierfs
mount answers at /proc: No such file or directory"). So when a request fails,
the mount table and a probe say which of those it is (`unreachable`), and each
command prints that one line.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from tierfs.cli import daemon
from tierfs.cli.main import PROG, UsageError
from tierfs.cli.mountpoint import DEAD, MountError, canonical, mounted_here, probe

STATS_USAGE = "usage: tierfs stats [--json] MOUNTPOINT"
SYNC_USAGE = "usage: tierfs sync PATH"
UNMOUNT_USAGE = "usage: tierfs unmount MOUNTPOINT"


def unreachable(mountpoint: str, err: OSError) -> str:
    """Why the daemon of ``mountpoint`` did not answer, in one line naming the real cause."""
    from tierfs.cli.control import socket_path

    path = canonical(mountpoint)
    entry = mounted_here(path)
    if entry is None:
        return f"{mountpoint} is not a tierfs mount (nothing is mounted there)"
    if entry.fstype != "fuse.tierfs":
        return f"{mountpoint} is not a tierfs mount ({entry.fstype})"
    if probe(path) == DEAD:
        return f"the daemon of {path} is gone: tierfs unmount {path}"
    if isinstance(err, FileNotFoundError):
        where = socket_path(path)
        return f"{mountpoint} has no control socket at {where} (mounted by another user?)"
    return f"no tierfs mount answers at {mountpoint}: {err.strerror or err}"


def stats(argv: list[str]) -> int:
    """Print the counters of one mount; 1 (one line) when it cannot say."""
    from tierfs.cli.control import render_statistics, request_statistics

    as_json = "--json" in argv
    args = [a for a in argv if a != "--json"]
    if len(args) != 1 or args[0].startswith("-"):
        raise UsageError(STATS_USAGE)
    if not args[0]:
        raise UsageError("empty MOUNTPOINT: " + STATS_USAGE)
    try:
        data = request_statistics(args[0])
    except OSError as err:
        print(f"{PROG}: {unreachable(args[0], err)}", file=sys.stderr)
        return 1
    if "error" in data:  # (a daemon that failed to count: not a table of zeros, not 0)
        print(f"{PROG}: stats {args[0]}: {data['error']}", file=sys.stderr)
        return 1
    if as_json:
        print(json.dumps(data, indent=2))
        return 0
    try:
        text = render_statistics(data)
    except (KeyError, TypeError, ValueError, AttributeError):
        print(
            f"{PROG}: the daemon of {args[0]} answered in a format this tierfs does not know "
            "(remount after upgrading)",
            file=sys.stderr,
        )
        return 1
    print(text)
    return 0


def sync(argv: list[str]) -> int:
    """Exit 0 once every file closed (or written) at or below PATH (a tierfs mountpoint or a
    path inside one) is in GCS; else 1 and the first error, one line."""
    from tierfs.cli.control import request
    from tierfs.cli.prefetch import hung_mount_holding, tierfs_mount_of

    if len(argv) != 1 or argv[0].startswith("-"):
        raise UsageError(SYNC_USAGE)
    if not argv[0]:
        raise UsageError("empty PATH: " + SYNC_USAGE)
    target = canonical(argv[0])
    holder = hung_mount_holding(target)  # (its answer would never come)
    if holder is not None:
        print(f"{PROG}: sync {argv[0]}: the daemon of {holder} does not answer", file=sys.stderr)
        return 1
    if mounted_here(target) is not None:  # a mountpoint: never looked up (it may hang)
        mountpoint, relative = target, "."
    else:
        # Resolved whole, as `tierfs_mount_of` resolves it: a symlink to a directory in
        # a mount (~/data -> /mnt/gcs/data) was sent as "../home/u/data", which matched
        # no file, and sync said yes without waiting for anything.
        target = os.path.realpath(target)
        mountpoint = tierfs_mount_of(Path(target)) or ""
        relative = os.path.relpath(target, mountpoint) if mountpoint else ""
        if not mountpoint or relative.startswith(".."):
            print(
                f"{PROG}: no tierfs mount answers at {argv[0]}: it is not in a tierfs mount",
                file=sys.stderr,
            )
            return 1
    try:
        answer = request(mountpoint, "sync", None, {"path": "" if relative == "." else relative})
    except OSError as err:
        print(f"{PROG}: sync {argv[0]}: {unreachable(mountpoint, err)}", file=sys.stderr)
        return 1
    if "error" in answer:
        print(f"{PROG}: sync {argv[0]}: {answer['error']}", file=sys.stderr)
        return 1
    return 0


def unmount(argv: list[str]) -> int:
    if len(argv) != 1 or argv[0].startswith("-"):
        raise UsageError(UNMOUNT_USAGE)
    if not argv[0]:
        raise UsageError("empty MOUNTPOINT: " + UNMOUNT_USAGE)
    try:
        daemon.stop(argv[0])
    except MountError as err:
        print(f"{PROG}: {err}", file=sys.stderr)
        return 1
    return 0
