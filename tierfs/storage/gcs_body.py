"""The body of a one-request upload, read from the file as it is sent, and how long its
answer is waited for. Apart from `tierfs.storage.gcs_upload`, which sends it: the body
is plain file reading and summing, the sending is the client library's and GCS's.
"""

from __future__ import annotations

import base64
import os

import google_crc32c

# A resumable upload's chunk (`tierfs.storage.gcs_upload`), and the answer's bound's unit.
UPLOAD_CHUNK_BYTES = 64 * 1024 * 1024
# The longest a one-request upload waits for its answer once the body is sent, however
# large (`answer_timeout`): GCS answers within seconds, the emulator in O(size) (a 1 GiB
# body: more than 10 s); a lost answer must not hold a 4 GiB file's close() for 640 s
# (64 stall bounds), or an hour with the chunk timeout off (64 client timeouts).
ANSWER_WAIT_MAX_S = 120.0
_CRC_BLOCK = 8 * 1024 * 1024


def answer_timeout(stall_s: float | None, size: int) -> tuple[float, float] | None:
    """(send, answer) bounds of a one-request upload of ``size`` bytes: sending keeps the
    stall bound; the answer gets one per `UPLOAD_CHUNK_BYTES` of body, as a resumable
    upload's chunks would each have, up to `ANSWER_WAIT_MAX_S` (never below one stall
    bound). None: no stall bound."""
    if not stall_s:
        return None
    chunks = max(1, -(-size // UPLOAD_CHUNK_BYTES))
    return stall_s, max(stall_s, min(stall_s * chunks, ANSWER_WAIT_MAX_S))


def _file_crc(fd: int, size: int) -> str:
    """The base64 crc32c of the first ``size`` bytes of ``fd``, as GCS states it."""
    checksum = google_crc32c.Checksum()
    for offset in range(0, size, _CRC_BLOCK):
        checksum.update(os.pread(fd, min(_CRC_BLOCK, size - offset), offset))
    return base64.b64encode(checksum.digest()).decode("ascii")


class FileChanged(ValueError):
    """The file being sent ended before its size when it was taken (truncated meanwhile):
    the request fails, not hangs; the upload tries again with what the file holds then."""


class _FileBody:
    """A request body of ``head``, ``size`` bytes of ``fd`` from offset 0, and ``tail``,
    read as http.client sends it (it asks ``len`` for the Content-Length): a 64 MiB
    upload costs no 64 MiB of memory. The file's bytes are summed as they go (`sent`):
    a file written while it is sent goes out other than its declared crc32c, which GCS
    refuses and the emulator stores; if that answer is lost, the sum tells the object
    for ours."""

    def __init__(self, head: bytes, fd: int, size: int, tail: bytes) -> None:
        self._parts = [head, b"", tail]
        self._fd, self._size, self._offset = fd, size, 0
        self._left = len(head) + size + len(tail)
        self._checksum = google_crc32c.Checksum()

    @property
    def sent(self) -> tuple[str, int] | None:
        """(crc32c, size) of the file's bytes this body sent, once it sent all of them."""
        if self._offset < self._size or self._parts[2]:
            return None
        return base64.b64encode(self._checksum.digest()).decode("ascii"), self._size

    def __len__(self) -> int:
        return self._left

    def read(self, amount: int = -1) -> bytes:
        if amount < 0:
            amount = self._left
        if self._parts[0]:
            out, self._parts[0] = self._parts[0][:amount], self._parts[0][amount:]
        elif self._offset < self._size:
            out = os.pread(self._fd, min(amount, self._size - self._offset), self._offset)
            if not out:  # shrank under us: fail the request rather than leave it hanging
                raise FileChanged(f"file ended at {self._offset} of {self._size} bytes")
            self._checksum.update(out)
            self._offset += len(out)
        else:
            out, self._parts[2] = self._parts[2][:amount], self._parts[2][amount:]
        self._left -= len(out)
        return out
