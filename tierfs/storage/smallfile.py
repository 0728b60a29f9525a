"""Reading the small files a user names: a config file, a key file, CSI volume attributes.

Each of them is a few KiB of text, read whole before anything is mounted. A name
that is not a regular file (``/dev/zero``, a FIFO nobody writes to, a terminal)
made the reader wait for ever or grow without bound, and the command hung. So
every such file is read here and only here: opened without blocking (a FIFO's
open would wait for a writer), accepted only if it is a regular file, and read
up to a limit. Every failure is an `OSError` with a ``strerror`` fit for the end
of one line (``cannot read config file 'X': is not a regular file``), so callers
keep catching what they caught for a missing file. (It lives in the storage layer, the
lowest that reads such a file, the key file: the command line above may import it.)
"""

from __future__ import annotations

import errno
import os
import stat

MAX_BYTES = 1 << 20  # far above any real config or key file


def read_small_file(path: str, limit: int = MAX_BYTES) -> str:
    """The UTF-8 text of regular file ``path``, at most ``limit`` bytes.

    Raises `OSError` (with ``strerror`` set) for a file that cannot be opened, is not a
    regular file or is larger than ``limit``; `UnicodeDecodeError` for text that is not
    UTF-8 (callers already say "not UTF-8 text")."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except ValueError:  # a NUL byte in the name
        raise OSError(errno.EINVAL, "a NUL character in the file name") from None
    try:
        mode = os.fstat(fd).st_mode
        if stat.S_ISDIR(mode):
            raise OSError(errno.EISDIR, os.strerror(errno.EISDIR))
        if not stat.S_ISREG(mode):
            raise OSError(errno.EINVAL, "is not a regular file")
        chunks: list[bytes] = []
        size = 0
        while size <= limit:
            chunk = os.read(fd, limit + 1 - size)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        if size > limit:
            raise OSError(errno.EFBIG, f"larger than {_size(limit)}")
    finally:
        os.close(fd)
    return b"".join(chunks).decode("utf-8")


def _size(nbytes: int) -> str:
    return f"{nbytes >> 20} MiB" if nbytes >= 1 << 20 else f"{nbytes} bytes"
