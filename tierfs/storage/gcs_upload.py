"""Uploads to GCS: one multipart request for a small file, a resumable session in
64 MiB chunks for a large one, and the lost answer recognised.

A write whose answer was lost (a reset, a stall cut short, an upload let go at unmount)
may have been made by GCS: when a write then fails its precondition (its retry, or the
next mount's upload from the journal), `_own_object` checks whether the live object
holds exactly the bytes sent (size and crc32c) and, if so, takes it as the upload's
result. A resumable session that says 404 is started again once, as GCS advises. Part
of `GcsBucket` (a mixin sharing its client, retries and limiter).
"""

from __future__ import annotations

import base64
import builtins
import contextlib
import copy
import json
import os
import secrets
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import google_crc32c
import requests
import requests.adapters
import trio
from google.api_core import exceptions as api_exceptions
from google.api_core.retry import Retry
from google.cloud import storage
from google.cloud.storage import exceptions as storage_exceptions

from tierfs.errors import (
    BackendError,
    UploadedOtherBytes,
)
from tierfs.storage import ObjectInfo, check_name
from tierfs.storage.gcs_body import (
    UPLOAD_CHUNK_BYTES,
    FileChanged,
    _file_crc,
    _FileBody,
    answer_timeout,
)
from tierfs.storage.gcs_resource import _info, upload_blob
from tierfs.storage.retry import (
    _BoundedRetry,
)

if TYPE_CHECKING:  # a part of GcsBucket, sharing its state
    from typing import Any as _Base

    from tierfs.storage.gcs import GcsBucket
else:
    _Base = object

# Files up to this size are uploaded in one request, retried as one request: a failed
# request re-sends at most one chunk's worth, as a resumable upload's chunk would, and
# one request saves the session's set-up (docs/uploads.md).
SINGLE_REQUEST_BYTES = UPLOAD_CHUNK_BYTES
# Files up to this size are tried once as one request too (one stream, no per-chunk
# round trips); if that attempt fails with an error worth retrying, the upload goes on
# as a resumable one, so a broken link costs one attempt's bytes, then at most a chunk.
ONE_ATTEMPT_BYTES = 4 * 1024 * 1024 * 1024
DEFAULT_CONTENT_TYPE = "application/octet-stream"


class GcsUpload:
    """A resumable upload fed as the file is written (google-cloud-storage's BlobWriter:
    it buffers one chunk and sends it when full, in the calling worker thread)."""

    def __init__(self, owner: GcsBucket, blob: storage.Blob, writer: Any, chunk: int) -> None:
        self._owner, self._blob, self._writer, self._chunk = owner, blob, writer, chunk
        self._written = 0

    async def write(self, data: bytes) -> None:
        before = self._written // self._chunk
        self._written += len(data)
        sent = self._written // self._chunk - before
        what = f"gs://{self._owner.name}/{self._blob.name}"
        await self._owner._call(lambda: self._writer.write(data), what, requests=sent)
        if sent:  # counted when sent: buffered bytes of an aborted upload never reach GCS
            self._owner._counters.add(bytes_written=sent * self._chunk)

    async def finish(self) -> ObjectInfo:
        blob, writer = self._blob, self._writer

        def run() -> ObjectInfo:
            answers = _answers_of(writer)
            try:
                writer.close()  # the last chunk; the object exists from here
            except storage_exceptions.DataCorruption as err:
                # The session made an object, of other bytes than were written (a chunk
                # whose answer was lost, sent again: the emulator appends it twice). That
                # generation is ours: the whole upload that follows replaces it.
                generation = _generation_of(err.response)
                if not generation:
                    raise
                raise UploadedOtherBytes(
                    f"gs://{self._owner.name}/{blob.name}: GCS holds other bytes than were"
                    f" streamed ({err})",
                    generation,
                ) from err
            # The object the last chunk's answer names: BlobWriter drops that answer, and
            # reading the object back (blob.reload) named whatever generation was live by
            # then: another client's, written in between, was taken for ours, and the next
            # upload, conditional on it, replaced that client's object.
            if not answers or not _generation_of(answers[-1]):
                raise BackendError(
                    f"gs://{self._owner.name}/{blob.name}: the upload's last answer names no object"
                )
            blob._set_properties(answers[-1].json())
            return _info(blob)

        info = await self._owner._call(run, f"gs://{self._owner.name}/{blob.name}", requests=1)
        self._owner._counters.add(bytes_written=self._written % self._chunk)
        return info

    async def abort(self) -> None:
        writer = self._writer

        def run() -> None:
            with contextlib.suppress(Exception):
                writer.terminate()

        await trio.to_thread.run_sync(run)


def _answers_of(writer: Any) -> list[Any]:
    """The answers to the chunks ``writer`` (a BlobWriter) sends from now on, in order: its
    session's ``transmit_next_chunk``, wrapped (the session is started first if no chunk
    went yet; BlobWriter would start it at close)."""
    if not writer._upload_and_transport:
        writer._initiate_upload()
    upload = writer._upload_and_transport[0]
    send = upload.transmit_next_chunk
    answers: list[Any] = []

    def kept(*args: Any, **kwargs: Any) -> Any:
        answer = send(*args, **kwargs)
        answers.append(answer)
        return answer

    upload.transmit_next_chunk = kept
    return answers


def _generation_of(response: Any) -> int:
    """The generation an upload's answer names (0: none, or no answer to read)."""
    try:
        return int(response.json().get("generation", 0))
    except Exception:  # (no JSON body, or none at all)
        return 0


class _Uploads(_Base):
    """open_upload, write_file and write_bytes of `GcsBucket`."""

    async def open_upload(
        self,
        name: str,
        *,
        if_generation_match: int | None,
        chunk_bytes: int,
        content_type: str | None = None,
    ) -> GcsUpload:
        check_name(name)
        chunk = max(256 << 10, chunk_bytes // (256 << 10) * (256 << 10))  # GCS's unit
        blob = upload_blob(self._bucket, name, chunk)
        writer = blob.open(
            "wb",
            chunk_size=chunk,
            ignore_flush=True,
            content_type=content_type or DEFAULT_CONTENT_TYPE,
            if_generation_match=if_generation_match,
            retry=self._upload_retry if if_generation_match is not None else None,
            timeout=self._upload_timeout_s,
        )
        return GcsUpload(self, blob, writer, chunk)

    async def write_file(
        self,
        name: str,
        path: str,
        *,
        if_generation_match: int | None,
        metadata: Mapping[str, str] | None = None,
        content_type: str | None = None,
    ) -> ObjectInfo:
        check_name(name)
        blob_metadata = dict(metadata) if metadata else None
        retry = self._upload_retry if if_generation_match is not None else None
        bucket, timeout, chunk_bytes = self._bucket, self._upload_timeout_s, self._chunk_bytes
        counters = self._counters

        streams: builtins.list[Any] = []

        def run() -> ObjectInfo | OSError:
            # Opened in the request's own thread (one thread hop an upload, not two), but
            # a local failure (ENOENT, EACCES...) is returned, not raised, so that it stays
            # an OSError with its errno, as with `MemoryBucket`, not a BackendError.
            try:
                stream = open(path, "rb")  # closed below, after `_call`
            except OSError as err:
                return err
            streams.append(stream)
            size = os.fstat(stream.fileno()).st_size
            if size <= SINGLE_REQUEST_BYTES:
                info = self._upload_one_request(
                    name,
                    stream.fileno(),
                    size,
                    if_generation_match=if_generation_match,
                    metadata=blob_metadata,
                    content_type=content_type or DEFAULT_CONTENT_TYPE,
                    retry=retry,
                )
                counters.add(bytes_written=size)
                return info
            if size <= ONE_ATTEMPT_BYTES and retry is not None:
                try:
                    info = self._upload_one_request(
                        name,
                        stream.fileno(),
                        size,
                        if_generation_match=if_generation_match,
                        metadata=blob_metadata,
                        content_type=content_type or DEFAULT_CONTENT_TYPE,
                        retry=None,
                    )
                    counters.add(bytes_written=size)
                    return info
                except Exception as err:
                    if not retry._predicate(err):
                        raise
            precondition, session_retry = if_generation_match, retry
            for session in range(2):
                blob = upload_blob(bucket, name, chunk_bytes)
                blob.metadata = blob_metadata
                stream.seek(0)
                try:
                    blob.upload_from_file(
                        stream,
                        size=size,
                        content_type=content_type or DEFAULT_CONTENT_TYPE,
                        if_generation_match=precondition,
                        checksum="crc32c",
                        retry=session_retry,
                        timeout=timeout,
                    )
                except api_exceptions.NotFound:
                    # The session is gone (after a chunk whose answer was lost, GCS may
                    # have made the object and ended it): GCS says start again, once. The
                    # object may be ours, which the new session's precondition tells.
                    if session:
                        raise
                    continue
                except storage_exceptions.DataCorruption as err:
                    # The session made an object of other bytes than were sent (a chunk
                    # whose answer was lost, sent again: the emulator appends it twice).
                    # That generation is ours: one more session replaces it.
                    generation = _generation_of(err.response)
                    if session or not generation:
                        raise
                    precondition, session_retry = generation, self._upload_retry
                    continue
                except api_exceptions.PreconditionFailed:
                    # Ours if it holds these bytes (see `_upload_one_request`).
                    own = self._own_object(name, _file_crc(stream.fileno(), size), size)
                    if own is None:
                        raise
                    counters.add(bytes_written=size)
                    return _info(own)
                counters.add(bytes_written=size)
                return _info(blob)
            raise AssertionError("unreachable: the second session returns or raises")

        try:
            result = await self._call(run, f"gs://{self.name}/{name}", requests=1, uploads=1)
        finally:
            for stream in streams:
                stream.close()
        if isinstance(result, OSError):
            raise result
        return result

    def _upload_one_request(
        self,
        name: str,
        fd: int,
        size: int,
        *,
        if_generation_match: int | None,
        metadata: Mapping[str, str] | None,
        content_type: str,
        retry: Retry | None,
    ) -> ObjectInfo:
        """The first ``size`` bytes of ``fd`` as one multipart (resource + media) POST, read
        from the file as it is sent, in the calling worker thread. The client library's
        own upload costs about 3 ms of CPU per small file (retry and tracing wrappers,
        argument building) and holds the whole body in memory. The crc32c goes in the
        resource, so GCS refuses bytes that do not match it (a file changed under us)."""
        crc = _file_crc(fd, size)
        resource: dict[str, Any] = {"name": name, "contentType": content_type, "crc32c": crc}
        if metadata:
            resource["metadata"] = dict(metadata)
        boundary = "tierfs-" + secrets.token_hex(16)
        head = (
            f"--{boundary}\r\nContent-Type: application/json; charset=UTF-8\r\n\r\n"
            f"{json.dumps(resource)}\r\n--{boundary}\r\nContent-Type: {content_type}\r\n\r\n"
        ).encode()
        tail = f"\r\n--{boundary}--\r\n".encode()
        params: dict[str, str | int] = {"uploadType": "multipart"}
        if if_generation_match is not None:
            params["ifGenerationMatch"] = if_generation_match
        if self._bucket.user_project:
            params["userProject"] = self._bucket.user_project
        session: requests.Session = self._client._http
        url = self._upload_url
        headers = {"Content-Type": f'multipart/related; boundary="{boundary}"'}
        # Sending, the stall bound as it is; the answer, one bound per chunk's worth of
        # body, at most 120 s (`answer_timeout`): the server answers once it has taken the
        # whole body in, which the emulator does in O(size) (hashing, storing). Staged
        # 1 GiB writes: its answer came after more than 10 s, the upload went on in
        # resumable chunks, whose answers took as long; the session was lost and close()
        # failed (ENOENT), 3 of 4 runs.
        timeout = answer_timeout(self._upload_timeout_s, size)

        bodies: builtins.list[_FileBody] = []

        def attempt() -> dict[str, Any]:
            body = _FileBody(head, fd, size, tail)  # anew each attempt: from the start
            bodies.append(body)
            response = session.post(url, params=params, data=body, headers=headers, timeout=timeout)
            if response.status_code >= 400:
                raise api_exceptions.from_http_response(response)
            result: dict[str, Any] = response.json()
            return result

        try:
            answer = retry(attempt)() if retry is not None else attempt()
        except (api_exceptions.PreconditionFailed, FileChanged) as err:
            # A precondition that fails, or a retry that finds the file changed under it
            # (`_FileBody`: written or truncated meanwhile), may come after our own
            # attempt was made by GCS, its answer lost (a reset, a stall cut short; or an
            # earlier upload of these bytes let go at unmount, now sent from the journal).
            # If the live object holds exactly these bytes, the upload succeeded: the
            # object is ours (else a rename or unlink would not know it is there, and the
            # next upload would fail its precondition on it as on another writer's).
            # A body sent whole but other than declared (the file written meanwhile) may
            # have been stored by the emulator, answer lost: ours too, to replace.
            sent = {body.sent for body in bodies} - {None}
            if not sent:  # (a first attempt cut short by FileChanged made nothing)
                raise
            live = self._live_or_none(name)
            if live is None:
                raise
            if (live.crc32c, live.size) != (crc, size):
                if (live.crc32c, live.size) in sent:
                    raise UploadedOtherBytes(
                        f"gs://{self.name}/{name}: GCS holds other bytes than were sent",
                        int(live.generation or 0),
                    ) from err
                raise
            answer = dict(live._properties)
        if answer.get("crc32c", crc) != crc or int(answer.get("size", size)) != size:
            what = f"gs://{self.name}/{name}: GCS holds other bytes than were sent"
            generation = int(answer.get("generation", 0))
            if generation:  # made all the same: the caller's to replace
                raise UploadedOtherBytes(what, generation)
            raise BackendError(what)
        blob = self._bucket.blob(name)
        blob._set_properties(answer)  # as the library reads its own upload's answer
        return _info(blob)

    def _own_object(self, name: str, crc: str | None, size: int | None) -> storage.Blob | None:
        """Live object ``name`` if it holds ``size`` bytes with checksum ``crc`` (what this
        client just wrote), else None; in the calling worker thread."""
        blob = self._bucket.get_blob(name, retry=self._retry, timeout=self._timeout_s)
        if blob is None or crc is None or blob.crc32c != crc or blob.size != size:
            return None
        return blob

    def _live_or_none(self, name: str) -> storage.Blob | None:
        """The live object ``name``, or None if there is none or GCS cannot tell (the
        caller's error is then the one to raise)."""
        try:
            blob: storage.Blob | None = self._bucket.get_blob(
                name, retry=self._retry, timeout=self._timeout_s
            )
        except Exception:
            return None
        return blob

    @staticmethod
    def _counting(retry: _BoundedRetry | None) -> tuple[_BoundedRetry | None, builtins.list[int]]:
        """A copy of ``retry`` that counts, in the list returned, the retries of the call
        it is given to: a write whose precondition fails after a retry may have failed on
        its own first attempt (the answer lost), which `_own_object` then tells."""
        count = [0]
        if retry is None:
            return None, count
        counted = copy.copy(retry)
        inner = retry._on_retry

        def on_retry(exc: Exception) -> None:
            count[0] += 1
            if inner is not None:
                inner(exc)

        counted._on_retry = on_retry
        return counted, count

    async def write_bytes(
        self,
        name: str,
        data: bytes,
        *,
        if_generation_match: int | None,
        metadata: Mapping[str, str] | None = None,
        content_type: str | None = None,
    ) -> ObjectInfo:
        check_name(name)
        body = bytes(data)
        blob_metadata = dict(metadata) if metadata else None
        retry, retries = self._counting(
            self._upload_retry if if_generation_match is not None else None
        )
        bucket, timeout, chunk_bytes = self._bucket, self._upload_timeout_s, self._chunk_bytes
        crc = base64.b64encode(google_crc32c.Checksum(body).digest()).decode("ascii")

        def run() -> ObjectInfo:
            blob = upload_blob(bucket, name, chunk_bytes)
            blob.metadata = blob_metadata
            try:
                blob.upload_from_string(
                    body,
                    content_type=content_type or DEFAULT_CONTENT_TYPE,
                    if_generation_match=if_generation_match,
                    checksum="crc32c",
                    retry=retry,
                    timeout=timeout,
                )
            except api_exceptions.PreconditionFailed:
                own = self._own_object(name, crc, len(body)) if retries[0] else None
                if own is None:
                    raise
                return _info(own)
            return _info(blob)

        info = await self._call(run, f"gs://{self.name}/{name}", requests=1, uploads=1)
        self._counters.add(bytes_written=len(body))
        return info
