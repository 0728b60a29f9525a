"""Which FLUSH is a file's last close(), so that an object is only ever published whole.

The kernel sends FLUSH at every close() of a file descriptor and RELEASE once, when the
last descriptor sharing the open file goes. A forked child that inherited the fd (a
DataLoader worker, a subprocess) exiting, or the close of a dup'd fd, is a FLUSH while
the writer is still writing: uploading there publishes a partial object under the final
name. Without write-back the upload belongs at close() (gcsfuse's semantics: close()
waits for GCS and reports its errors), so the FLUSH that is not the last must be told
from the one that is:

- the closer is another process than the opener (FUSE gives the closing thread's id, so
  thread groups are compared): a child's copy, not the last close;
- the closer is the opener's process and still holds more descriptors on the file than
  the other handles it opened itself (so one is a dup of this handle's, or a dup2 onto
  stdout): not the last close either. A separate open() is a handle of its own: closing
  a writer while a reader fd stays open publishes, as in gcsfuse.

Anything else is taken as the last close and publishes. A FLUSH judged not last
publishes nothing, and RELEASE (the real last close) uploads what is left. The
closer's pid comes from the patched pyfuse3 (deploy/pyfuse3, ``flush_takes_context``);
with a stock pyfuse3 there is none, and every FLUSH publishes, as in gcsfuse.

Reading /proc costs a few microseconds a descriptor, and only on FLUSHes of files
opened without write-back, whose close() waits for an upload anyway.
"""

from __future__ import annotations

import os


def thread_group(pid: int) -> int | None:
    """The process (thread group) a thread belongs to, or None if it is gone."""
    try:
        with open(f"/proc/{pid}/status", "rb") as status:
            for line in status:
                if line.startswith(b"Tgid:"):
                    return int(line.split()[1])
    except (OSError, ValueError):
        return None
    return None


def mount_id(mountpoint: str) -> int | None:
    """The kernel's id of the mount at ``mountpoint`` (/proc/self/mountinfo), if found."""
    target = os.path.abspath(mountpoint)
    try:
        with open("/proc/self/mountinfo", encoding="utf-8", errors="replace") as info:
            lines = info.readlines()
    except OSError:
        return None
    found = None
    for line in lines:
        fields = line.split()
        # Spaces and the like in a mount point are octal escapes (\040).
        point = fields[4].encode().decode("unicode_escape") if len(fields) > 4 else ""
        if point == target:
            found = int(fields[0])  # the last one: a mount over another wins
    return found


def descriptors_on(process: int, ino: int, mnt_id: int | None) -> int:
    """How many descriptors ``process`` has open on inode ``ino`` of our mount. Without a
    mount id an inode number of another file system may count too: that only moves an
    upload from a FLUSH to RELEASE, never publishes early."""
    try:
        descriptors = os.listdir(f"/proc/{process}/fdinfo")
    except OSError:
        return 0  # gone, or another user's (not ours to read): the last close
    want_ino = f"ino:\t{ino}\n"
    want_mnt = None if mnt_id is None else f"mnt_id:\t{mnt_id}\n"
    count = 0
    for fd in descriptors:
        try:
            with open(f"/proc/{process}/fdinfo/{fd}", encoding="ascii", errors="replace") as f:
                text = f.read()
        except OSError:
            continue  # closed meanwhile
        if want_ino in text and (want_mnt is None or want_mnt in text):
            count += 1
    return count


class Closes:
    """Who opened each file handle, to judge its FLUSHes (see the module docstring)."""

    def __init__(self) -> None:
        self._openers: dict[int, tuple[int, int]] = {}  # fh -> (opener, inode): see opened
        self._handles: dict[int, set[int]] = {}  # inode -> its open fhs
        self.mnt_id: int | None = None

    def opened(self, fh: int, pid: int, ino: int, *, writable: bool = True) -> None:
        """Handle ``fh`` of inode ``ino`` opened by thread ``pid``. A writable handle's
        opener is kept as its process (read now, ~15 us): the thread may exit before the
        close (a worker pool's, a data loader's), and a gone opener compared with the
        closer read as another process's copy: close() returned before the upload, whose
        error no one then saw. A read-only handle publishes nothing: its thread will do."""
        opener = (thread_group(pid) or pid) if writable else pid
        self._openers[fh] = (opener, ino)
        self._handles.setdefault(ino, set()).add(fh)

    def released(self, fh: int) -> None:
        opener = self._openers.pop(fh, None)
        if opener is not None:
            handles = self._handles[opener[1]]
            handles.discard(fh)
            if not handles:
                del self._handles[opener[1]]

    def is_last(self, fh: int, pid: int) -> bool:
        """Whether a FLUSH of ``fh`` by thread ``pid`` is the file's last close()."""
        opener = self._openers.get(fh)
        if opener is None:
            return True
        if not self._same_process(opener[0], pid):
            return False  # a forked child's (or another process's) copy of the fd
        ino = opener[1]
        # Descriptors the closer still holds on the file beyond one per other handle it
        # opened itself are dups of this one. (/proc/<thread id> has the process's fds.)
        own_opens = sum(
            1
            for other in self._handles.get(ino, ())
            if other != fh and self._same_process(self._openers[other][0], pid)
        )
        return descriptors_on(pid, ino, self.mnt_id) <= own_opens

    @staticmethod
    def _same_process(opener: int, pid: int) -> bool:
        if opener == pid:
            return True
        process = thread_group(pid)
        # A closer already gone has nothing to compare: its close is taken as the last.
        return process is None or thread_group(opener) == process
