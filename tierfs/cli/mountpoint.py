"""The mountpoint and the kernel side: checks before mounting, the mount table, unmounting.

Every check that can fail before a mount answers with one line naming the
cause (`MountError`), so ``tierfs mount`` never shows a traceback:
mountpoint missing, not a directory, already mounted, ``/dev/fuse`` missing,
``fusermount3`` missing. A mountpoint left behind by a killed daemon
("Transport endpoint is not connected") is recognised and unmounted, so that
``tierfs unmount`` and a new ``tierfs mount`` both recover it. A mount whose daemon no
longer answers (stopped, deadlocked) is recognised by a probe with a time bound, never
waited for: ``tierfs unmount`` takes it off lazily and says so, ``tierfs mount`` says
the mountpoint is busy.
"""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
import threading
import time
from dataclasses import dataclass

from tierfs.cli.fdmount import fuse_fd

BUSY_WAIT_S = 1.0  # how long `unmount` tries again a mount found busy
BUSY_RETRY_S = 0.05
PROBE_S = 5.0  # how long a mount may take to answer statvfs before it counts as hung
ALIVE, DEAD, HUNG = "alive", "dead", "hung"


class MountError(Exception):
    """A failure to mount or unmount, as one line for the user."""


@dataclass(frozen=True)
class MountEntry:
    source: str
    mountpoint: str
    fstype: str


def canonical(path: str) -> str:
    """``path`` absolute, with its symlinks resolved, as the mount table names it (a home
    reached through a symlink, ``/home`` -> ``/var/home``; a mountpoint that is one,
    ``/data`` -> ``/mnt/disk/data``). The last part is only read as a link (readlink),
    never looked up: it may be a mount that does not answer. ``/dev/fd/N`` (a FUSE
    descriptor a privileged helper opened: `tierfs.cli.fdmount`) is left as it is."""
    if fuse_fd(path) is not None:
        return path
    absolute = os.path.abspath(path)
    for _ in range(_MAX_LINKS):
        parent, name = os.path.split(absolute)
        if not name:
            return absolute
        absolute = os.path.join(os.path.realpath(parent), name)
        try:
            target = os.readlink(absolute)  # (EINVAL for a directory or a mount: no lookup)
        except OSError:
            return absolute
        absolute = os.path.normpath(os.path.join(os.path.dirname(absolute), target))
    return absolute


_MAX_LINKS = 40  # as the kernel's path walk (ELOOP past it)


def mounts() -> list[MountEntry]:
    """The mount table (``/proc/self/mounts``), with octal escapes decoded."""
    entries = []
    with open("/proc/self/mounts", encoding="utf-8", errors="surrogateescape") as table:
        for line in table:
            fields = line.split()
            if len(fields) >= 3:
                entries.append(MountEntry(*(_unescape(f) for f in fields[:3])))
    return entries


def _unescape(text: str) -> str:
    out, i = [], 0
    while i < len(text):
        if text[i] == "\\" and i + 3 < len(text) and text[i + 1 : i + 4].isdigit():
            out.append(chr(int(text[i + 1 : i + 4], 8)))
            i += 4
        else:
            out.append(text[i])
            i += 1
    return "".join(out)


def device_of(mountpoint: str) -> str | None:
    """``MAJ:MIN`` of the mount on ``mountpoint`` from /proc/self/mountinfo (no stat: asking
    our own FUSE mount from the thread that serves it would wait for itself)."""
    path = canonical(mountpoint)
    found = None
    with open("/proc/self/mountinfo", encoding="utf-8", errors="surrogateescape") as table:
        for line in table:
            fields = line.split()
            if len(fields) > 4 and _unescape(fields[4]) == path:
                found = fields[2]
    return found


def set_read_ahead(mountpoint: str, kb: int) -> None:
    """Set the mount's read_ahead_kb (bigger kernel reads: 1 MiB requests at 1024)."""
    device = device_of(mountpoint)
    if device is None:
        raise MountError(f"cannot set read_ahead_kb: {mountpoint} is not in the mount table")
    try:
        with open(f"/sys/class/bdi/{device}/read_ahead_kb", "w", encoding="ascii") as knob:
            knob.write(f"{kb}\n")
    except OSError as err:
        raise MountError(f"cannot set read_ahead_kb={kb} on {mountpoint}: {err.strerror}") from None


def mounted_here(mountpoint: str) -> MountEntry | None:
    path = canonical(mountpoint)
    found = None
    for item in mounts():
        if item.mountpoint == path:
            found = item  # the last one is on top
    return found


def probe(mountpoint: str, timeout_s: float = PROBE_S) -> str:
    """`ALIVE`, `DEAD` or `HUNG`. A FUSE mount whose daemon is gone fails every call with
    ENOTCONN (ECONNABORTED while the dead daemon's threads still exit); one whose daemon
    is stopped or deadlocked never answers, so the call is made in a thread and given
    ``timeout_s``. statvfs, unlike stat, is never answered from the kernel's attribute
    cache, so it reaches the daemon."""
    answer: list[str] = []

    def call() -> None:
        try:
            os.statvfs(mountpoint)
        except OSError as err:
            answer.append(DEAD if err.errno in (errno.ENOTCONN, errno.ECONNABORTED) else ALIVE)
        else:
            answer.append(ALIVE)

    thread = threading.Thread(target=call, name="tierfs-probe", daemon=True)
    thread.start()
    thread.join(timeout_s)  # (a thread left waiting ends with the process)
    return answer[0] if answer else HUNG


def is_stale(mountpoint: str) -> bool:
    """Whether the mount's daemon is gone or does not answer (`probe`)."""
    return probe(mountpoint) != ALIVE


def check_before_mount(mountpoint: str) -> None:
    if not os.path.exists("/dev/fuse"):
        raise MountError(
            "/dev/fuse is missing: load the fuse module or give the container the device"
        )
    if shutil.which("fusermount3") is None:
        raise MountError("fusermount3 is missing: install the fuse3 package")
    state = probe(mountpoint)
    if state == HUNG:
        raise MountError(
            f"mountpoint {mountpoint} is busy: a mount there does not answer "
            f"(tierfs unmount {mountpoint} takes it off)"
        )
    if state == DEAD:
        unmount(mountpoint, lazy=True)
    try:
        st = os.stat(mountpoint)
    except FileNotFoundError:
        raise MountError(f"mountpoint {mountpoint} does not exist") from None
    except OSError as err:
        raise MountError(f"mountpoint {mountpoint}: {err.strerror}") from None
    if not os.path.isdir(mountpoint) or not (st.st_mode & 0o040000):
        raise MountError(f"mountpoint {mountpoint} is not a directory")
    entry = mounted_here(mountpoint)
    if entry is not None and entry.fstype.startswith("fuse"):
        raise MountError(
            f"mountpoint {mountpoint} is busy: {entry.source} is already mounted there"
        )


def unmount(mountpoint: str, *, lazy: bool = False) -> None:
    """Unmount with fusermount3 (umount as a fallback for root); one-line errors.

    A mount found busy is tried again for up to `BUSY_WAIT_S`: the daemon itself may
    hold one of its directories open for a moment (`tierfs.core.prefill` reads one
    through the mount after a burst of stats), which is no user's open file."""
    command = ["fusermount3", "-u", *(["-z"] if lazy else []), mountpoint]
    deadline = time.monotonic() + BUSY_WAIT_S
    while True:
        result = subprocess.run(command, capture_output=True, text=True, check=False)
        if result.returncode == 0:
            return
        message = (result.stderr.strip().splitlines() or ["failed"])[-1]
        if "busy" not in message.lower() or time.monotonic() >= deadline:
            break
        time.sleep(BUSY_RETRY_S)
    if os.geteuid() == 0:
        fallback = subprocess.run(
            ["umount", *(["-l"] if lazy else []), mountpoint],
            capture_output=True,
            text=True,
            check=False,
        )
        if fallback.returncode == 0:
            return
    if "busy" in message.lower():
        raise MountError(f"cannot unmount {mountpoint}: it is busy (files are open there)")
    raise MountError(f"cannot unmount {mountpoint}: {message.removeprefix('fusermount3: ')}")
