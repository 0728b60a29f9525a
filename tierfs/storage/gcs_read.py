"""Ranged reads from GCS: one streamed GET of an exact generation and byte range, read
from the socket into one bytes object, or into a buffer the caller gives (``into``: a
block buffer, `tierfs.cache.buffers`).

Reads ask for an exact generation and a byte range; GCS (and the emulator) answer 416
for a range starting at or past the end, which is simply EOF here.  Objects are read
raw, as gcsfuse does (``Accept-Encoding: gzip``, never decoded), so a gzip-encoded object
reads as the bytes that ``size`` counts.

A read whose response stops coming is cut by the read-stall timeout
(`tierfs.storage.stall`) and retried. Part of `GcsBucket` (a mixin sharing its client,
retries, limiter and counters).
"""

from __future__ import annotations

import http.client
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import requests
import urllib3
from google.api_core import exceptions as api_exceptions

from tierfs.errors import BackendError
from tierfs.storage import Into, Progress, nothing_to_read

if TYPE_CHECKING:  # a part of GcsBucket, sharing its state
    from typing import Any as _Base
else:
    _Base = object


# How much of a block buffer is read before its waiting readers are told (`_receive_into`):
# the largest read the kernel asks for (1 MiB at ``read_ahead_kb=1024``), so a reader's
# next request is whole in one step.
PROGRESS_BYTES = 1 << 20


class _Reads(_Base):
    async def read(
        self,
        name: str,
        *,
        generation: int,
        offset: int,
        length: int,
        into: Into | None = None,
        progress: Progress | None = None,
    ) -> bytes | memoryview:
        if await nothing_to_read(offset, length):
            return b""
        retry, timeout, stall = self._retry, self._timeout_s, self._stall
        counters = self._counters
        session: requests.Session = self._client._http
        # The library's own URL (host, escaping, userProject), fetched our way below.
        url = self._bucket.blob(name, generation=generation)._get_download_url(self._client)
        # "gzip": the stored bytes. Without it GCS unzips an object stored with
        # Content-Encoding: gzip, and then sends it whole, the range ignored.
        headers = {"Range": f"bytes={offset}-{offset + length - 1}", "Accept-Encoding": "gzip"}

        def attempt() -> bytes | memoryview:
            # A raw streamed GET read into one bytes object: the client library's
            # download_as_bytes copies through a BytesIO in small pieces, at about half the
            # speed and twice the memory (measured on the emulator).
            if stall is None:
                return receive(timeout or None)
            try:
                return receive((timeout or None, stall.current()), stall.observe)
            except (requests.Timeout, urllib3.exceptions.TimeoutError, TimeoutError):
                stall.stalled()  # no head in time, or the body stopped coming
                counters.add(read_stalls=1)
                raise

        def receive(
            limit: float | tuple[float | None, float] | None,
            on_head: Callable[[float], None] | None = None,
        ) -> bytes | memoryview:
            started = time.monotonic()
            response = session.get(url, headers=headers, stream=True, timeout=limit)
            if on_head is not None:
                on_head(time.monotonic() - started)
            try:
                if response.status_code == 416:  # range starts at or past the end
                    return b""
                if response.status_code >= 400:
                    _ = response.content
                    raise api_exceptions.from_http_response(response)
                if offset and response.status_code != 206:
                    # The range was not honoured (a proxy in the way): the body starts at
                    # byte 0, and was taken for the bytes at ``offset``.
                    raise BackendError(
                        f"gs://{self.name}/{name}: HTTP {response.status_code} to a read "
                        f"from byte {offset}: the range was ignored"
                    )
                declared = response.headers.get("Content-Length")
                if declared is None:  # no length announced (chunked): as it comes, raw
                    chunked: bytes = response.raw.read(length, decode_content=False)
                    return chunked
                # One bytes object, filled from the socket by the buffered reader under
                # http.client (no zero-filled buffer first, no copy after: those two were
                # a third of the daemon's CPU in a cold 1 GiB read).
                wanted = min(int(declared), length)
                view = into(wanted) if into is not None and wanted > 0 else None
                if view is not None:
                    return _receive_into(response, view, progress)
                data: bytes = response.raw.read(wanted, decode_content=False)
                if len(data) < wanted:  # the connection ended early: never a short block
                    raise requests.ConnectionError(f"short read: {len(data)} of {wanted} bytes")
                return data
            finally:
                response.close()

        def run() -> bytes | memoryview:
            return retry(attempt)()

        data = await self._call(
            run,
            f"gs://{self.name}/{name}#{generation}",
            abandon=True,
            nbytes=length,
            requests=1,
            media_reads=1,
        )
        self._counters.add(bytes_read=len(data))
        return data


def _receive_into(
    response: requests.Response, view: memoryview, progress: Progress | None = None
) -> memoryview:
    """Fill ``view`` with the body of ``response`` (exactly its length, announced), read from
    the socket straight into it: urllib3's own ``readinto`` reads into a new bytes object and
    copies that. The connection goes back to the pool once the body is read, as urllib3
    would do itself.

    With ``progress``, the body is read `PROGRESS_BYTES` at a time, each told: a reader
    waiting for the start of a block has it while the rest still comes."""
    raw = response.raw
    body = raw._fp  # http.client's response: its readinto reads the socket into ``view``
    if not isinstance(body, http.client.HTTPResponse):
        raise requests.ConnectionError("no response body to read")
    step = PROGRESS_BYTES if progress is not None else len(view)
    done = 0
    while done < len(view):
        n = body.readinto(view[done : done + step])
        if not n:  # the connection ended early: never a short block
            raise requests.ConnectionError(f"short read: {done} of {len(view)} bytes")
        done += n
        if progress is not None:
            progress(view, done)
    if body.isclosed():  # the whole body read: the connection can serve the next request
        raw.release_conn()
    return view
