"""``tierfs mount BUCKET /dev/fd/N``: serve a FUSE mount someone else made, on its /dev/fuse fd.

A privileged helper (a CSI node plugin, a container runtime hook) opens
/dev/fuse, mounts it itself (``mount(2)`` with ``fd=N,rootmode=40000,...``)
and hands the descriptor to tierfs, which then needs no privilege at all: no
fusermount3, no CAP_SYS_ADMIN, not even a view of the mountpoint. libfuse
(3.3 and later, so the 3.17 pyfuse3 is linked to) takes ``/dev/fd/N`` as the
mount point in `fuse_session_mount` and uses the descriptor as it is; GKE's
gcsfuse sidecar and Mountpoint for S3 work the same way.

What changes for tierfs with such a "mountpoint": there is no directory to
check before mounting, the daemon never unmounts (whoever mounted does; when
they do, the kernel ends the session and the daemon exits after its uploads),
and what needs the mount's path is not available: ``read_ahead_kb`` is the
mounter's to set, `tierfs stats`/`sync` cannot find the mount by path, and the
last-close detection (`tierfs.fuse.closes`) has no mount id, so when the closing
process can be inspected (same user, or a root daemon) and holds a descriptor
with the same inode number on another file system, the upload moves from
close() to the RELEASE just after it (never earlier than the last close).
"""

from __future__ import annotations

import fcntl
import re

_FD_PATH = re.compile(r"/dev/fd/(\d+)")


def fuse_fd(mountpoint: str) -> int | None:
    """N when ``mountpoint`` is ``/dev/fd/N`` (libfuse's own rule), else None."""
    match = _FD_PATH.fullmatch(mountpoint)
    return int(match.group(1)) if match else None


def check_fd(fd: int) -> str | None:
    """Why descriptor ``fd`` cannot be served (one line), or None if it is open."""
    try:
        fcntl.fcntl(fd, fcntl.F_GETFD)
    except OSError as err:
        return f"/dev/fd/{fd} is not an open descriptor: {err.strerror}"
    except OverflowError:  # (/dev/fd/99999999999999999999: past any C int)
        return f"/dev/fd/{fd} is not an open descriptor: the number is too large"
    return None
