"""`GcsBucket`: the `Bucket` protocol over google-cloud-storage (real GCS or the emulator).

This is the only module that imports ``google.*``. Three jobs happen here and nowhere else:

Threads.  The client library blocks, so every call runs in ``trio.to_thread.run_sync``
under one ``trio.CapacityLimiter`` per client: the limiter bounds concurrent requests
(and threads), and the HTTP connection pool is sized to it so no connection is ever
thrown away.  A thread gets only immutable inputs (names, numbers, copies of dicts) and
builds its own ``Blob``; the only shared state threads touch is the statistics counter,
behind a lock.  Cancelling a trio task waits for its request to finish (the HTTP timeout
bounds that), so no thread outlives the call that started it; only requests that change
nothing (reads, stats, lists) may be abandoned to finish alone, when a killed caller's
FUSE request is interrupted (`tierfs.interrupts`).

Retries.  gcsfuse's ``gcs-retries`` options (max attempts, backoff cap, multiplier) are
mapped onto the library's own machinery, ``google.api_core.retry.Retry``, which wraps
each HTTP request (one JSON call, one media GET, one upload chunk).  api_core has no
attempt limit (only a deadline), so `_BoundedRetry` adds one: its ``on_error`` hook
counts the attempts of one request and raises once the cap is reached.  Only transient
failures are retried (408, 429, 5xx, connection and timeout errors).  Reads, stats,
lists and metadata patches of a named generation are idempotent and always retried;
writes, copies and deletes only when they carry an ``if_generation_match`` (a retried
conditional write cannot clobber anyone; an unconditional one could).

Errors.  Library exceptions become `tierfs.errors` at this edge: 404 -> `NotFound`,
412 -> `PreconditionFailed`, 401/403 and credential failures -> `AccessDenied`,
anything else (after retries) -> `BackendError`.  Messages are one line naming the
object (``gs://bucket/name#generation``) and the cause, because they end up in logs and
in the one-line error of ``tierfs mount``.  The original exception is kept as
``__cause__`` for tracebacks in the log.

Bounds.  No request waits without end: every request gives up after its retry deadline
(``request-deadline-secs``; uploads: ``chunk-retry-deadline-secs``), a read whose
response stops coming is cut by the read-stall timeout (`tierfs.storage.stall`) and
retried, and an upload that makes no progress for ``chunk-transfer-timeout-secs`` is
cut and retried.  The last transient failure is kept (`last_error`) for the daemon's
warnings about slow requests.

Reads ask for an exact generation and a byte range; GCS (and the emulator) answer 416
for a range starting at or past the end, which is simply EOF here.  Objects are read
raw (``raw_download``), as gcsfuse does, so a gzip-encoded object reads as the bytes
that ``size`` counts.

Library quirks handled here: google-cloud-storage >= 3.17 starts a thread of its own to
fetch bucket metadata for tracing (a request outside the limiter and the retry policy,
which may outlive `close`), so that cache is switched off; a failed streamed download
leaves its connection checked out until the response is read or closed (`_release`);
with anonymous credentials a 401 must not trigger a token refresh.
"""

from __future__ import annotations

import base64
import builtins
import contextlib
import copy
import functools
import http.client
import json
import math
import os
import re
import secrets
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar
from urllib.parse import urlsplit

import google.auth
import google_crc32c
import requests
import requests.adapters
import trio
import urllib3
from google.api_core import exceptions as api_exceptions
from google.api_core.client_info import ClientInfo
from google.api_core.retry import Retry, exponential_sleep_generator, retry_target
from google.auth import exceptions as auth_exceptions
from google.auth.credentials import AnonymousCredentials, Credentials
from google.auth.transport.requests import AuthorizedSession
from google.cloud import storage
from google.cloud.storage.exceptions import InvalidResponse
from google.oauth2 import credentials as user_credentials
from google.oauth2 import service_account

import tierfs
from tierfs.errors import (
    AccessDenied,
    BackendError,
    NotFound,
    PreconditionFailed,
    TierfsError,
)
from tierfs.storage import STAT_KEYS, Listing, ObjectInfo, check_name
from tierfs.storage.ratelimit import Throttle
from tierfs.storage.stall import ReadStallSettings, StallTimeout

__all__ = ["NO_CREDENTIALS", "GcsBucket", "RetrySettings"]

NO_CREDENTIALS = (
    "no credentials found: set GOOGLE_APPLICATION_CREDENTIALS, use --key-file,"
    " or --anonymous-access"
)
DEFAULT_CONCURRENCY = 32
DEFAULT_HTTP_TIMEOUT_S = 60.0
UPLOAD_CHUNK_BYTES = 64 * 1024 * 1024
# Files up to this size are uploaded in one request, larger ones as resumable uploads
# in UPLOAD_CHUNK_BYTES chunks: a failed request re-sends at most one chunk's worth
# either way, and one request saves the session's set-up (docs/uploads.md).
SINGLE_REQUEST_BYTES = UPLOAD_CHUNK_BYTES
_CRC_BLOCK = 8 * 1024 * 1024
DEFAULT_CONTENT_TYPE = "application/octet-stream"
_CHECK_ATTEMPTS = 3
_MAX_DETAIL_CHARS = 300
_ERRNO = re.compile(r"\[Errno -?\d+\][^'\")]*")
_TRANSIENT_STATUS = frozenset({408, 429, 500, 502, 503, 504})
_TRANSIENT_TYPES: tuple[type[BaseException], ...] = (
    ConnectionError,
    TimeoutError,
    requests.ConnectionError,
    requests.Timeout,
    requests.exceptions.ChunkedEncodingError,
    http.client.HTTPException,
    urllib3.exceptions.HTTPError,
)

T = TypeVar("T")


@dataclass(frozen=True)
class RetrySettings:
    """gcsfuse's ``gcs-retries`` options, in the units api_core wants.

    ``max_attempts`` counts requests, the first included (``max-retry-attempts``; 0 = no
    cap, as in gcsfuse).  Sleeps grow from ``initial_sleep_s`` by ``multiplier`` up to
    ``max_sleep_s`` (``max-retry-sleep``), with full jitter.  ``deadline_s`` bounds the
    total time spent retrying one request (``request-deadline-secs``; None = no bound, as
    in gcsfuse); ``upload_deadline_s`` does the same for an upload request or chunk
    (``chunk-retry-deadline-secs``), and ``upload_stall_s`` cuts an upload request that
    sends or receives nothing for that long (``chunk-transfer-timeout-secs``; None: the
    HTTP timeout).  ``read_stall``: the read-stall timeout (None: the HTTP timeout).
    """

    max_attempts: int = 0
    max_sleep_s: float = 30.0
    multiplier: float = 2.0
    deadline_s: float | None = None
    initial_sleep_s: float = 1.0
    upload_deadline_s: float | None = None
    upload_stall_s: float | None = None
    read_stall: ReadStallSettings | None = None

    def __post_init__(self) -> None:
        if self.max_attempts < 0:
            raise ValueError(f"max_attempts must be >= 0, got {self.max_attempts}")
        if self.multiplier < 1:
            raise ValueError(f"multiplier must be >= 1, got {self.multiplier}")
        if self.initial_sleep_s <= 0 or self.max_sleep_s <= 0:
            raise ValueError("retry sleeps must be > 0")
        for name in ("deadline_s", "upload_deadline_s", "upload_stall_s"):
            value = getattr(self, name)
            if value is not None and value <= 0:
                raise ValueError(f"{name} must be > 0 or None, got {value}")


class _RetriesExhausted(Exception):
    """Raised from the retry hook when a request used up its attempts, or its time."""

    def __init__(self, attempts: int, cause: Exception, seconds: float | None = None) -> None:
        self.reason = (
            f"gave up after {attempts} attempts"
            if seconds is None
            else f"gave up after {seconds:g} s, {attempts} attempts"
        )
        super().__init__(f"{self.reason}: {cause!r}")
        self.attempts = attempts
        self.cause = cause


def _release(exc: BaseException) -> None:
    """Close the HTTP response an error carries, if any.

    A failed media download raises with its streamed response unread; until read or
    closed, its connection is neither reused nor closed (a leaked socket per failed read).
    """
    for error in (exc, getattr(exc, "cause", None), exc.__cause__):
        response = getattr(error, "response", None)
        if isinstance(response, requests.Response):
            if response.status_code >= 400:
                with contextlib.suppress(Exception):
                    _ = response.content  # a short error body: read, the connection is reused
            response.close()


def _is_transient(exc: Exception) -> bool:
    """Worth another attempt: throttling, server errors, broken or slow connections."""
    if isinstance(exc, api_exceptions.GoogleAPICallError):
        return exc.code in _TRANSIENT_STATUS
    if isinstance(exc, InvalidResponse):
        return exc.response.status_code in _TRANSIENT_STATUS
    if isinstance(exc, auth_exceptions.TransportError):
        return True  # the token endpoint could not be reached
    return isinstance(exc, _TRANSIENT_TYPES)


class _BoundedRetry(Retry):
    """api_core's exponential-backoff `Retry`, plus a cap on the attempts of one request,
    and a deadline kept to the end: api_core gives up as soon as its next sleep would pass
    the deadline (a request with 120 s may give up after 30), this one sleeps no further
    than the deadline and tries once more there.

    ``Retry`` wraps one request at a time; each wrapped call gets its own attempt counter
    (a closure), so the object itself stays immutable and is shared by all threads.
    ``on_retry`` runs (in the worker thread) before every retry; it must be thread-safe.
    """

    def __init__(
        self,
        *,
        max_attempts: int = 0,
        on_retry: Callable[[Exception], None] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self._max_attempts = max_attempts
        self._on_retry = on_retry

    def __call__(
        self, func: Callable[..., Any], on_error: Callable[[Exception], Any] | None = None
    ) -> Callable[..., Any]:
        max_attempts, on_retry, deadline_s = self._max_attempts, self._on_retry, self._timeout
        predicate, initial, maximum = self._predicate, self._initial, self._maximum
        multiplier = self._multiplier

        @functools.wraps(func)
        def run(*args: Any, **kwargs: Any) -> Any:
            attempts = 1
            give_up_at = time.monotonic() + deadline_s if deadline_s is not None else None

            def sleeps() -> Iterator[float]:
                for delay in exponential_sleep_generator(initial, maximum, multiplier):
                    if give_up_at is not None:
                        delay = min(delay, max(0.0, give_up_at - time.monotonic()))
                    yield delay

            def before_retry(exc: Exception) -> None:
                nonlocal attempts
                _release(exc)
                if max_attempts and attempts >= max_attempts:
                    raise _RetriesExhausted(attempts, exc) from exc
                if give_up_at is not None and time.monotonic() >= give_up_at:
                    raise _RetriesExhausted(attempts, exc, deadline_s) from exc
                attempts += 1
                if on_retry is not None:
                    on_retry(exc)
                if on_error is not None:
                    on_error(exc)

            return retry_target(
                functools.partial(func, *args, **kwargs),
                predicate,
                sleeps(),
                timeout=None,
                on_error=before_retry,
            )

        return run

    def _keep(self, other: _BoundedRetry) -> _BoundedRetry:
        other._max_attempts, other._on_retry = self._max_attempts, self._on_retry
        return other

    def with_timeout(self, timeout: float | None) -> _BoundedRetry:
        return self._keep(super().with_timeout(timeout))

    def with_predicate(self, predicate: Callable[[Exception], bool]) -> _BoundedRetry:
        return self._keep(super().with_predicate(predicate))

    def with_delay(
        self,
        initial: float | None = None,
        maximum: float | None = None,
        multiplier: float | None = None,
    ) -> _BoundedRetry:
        return self._keep(super().with_delay(initial, maximum, multiplier))


class _Counters:
    """Statistics shared by trio code and worker threads, hence the lock."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._values = dict.fromkeys(STAT_KEYS, 0)
        self._in_flight = 0

    def add(self, **increments: int) -> None:
        with self._lock:
            for key, value in increments.items():
                self._values[key] += value

    def enter(self) -> None:
        """A request's thread starts (for ``in_flight_peak``)."""
        with self._lock:
            self._in_flight += 1
            self._values["in_flight_peak"] = max(self._values["in_flight_peak"], self._in_flight)

    def leave(self) -> None:
        with self._lock:
            self._in_flight -= 1

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return dict(self._values)


def _one_line(text: str) -> str:
    line = " ".join(text.split())
    return line if len(line) <= _MAX_DETAIL_CHARS else line[: _MAX_DETAIL_CHARS - 1] + "…"


def _status_of(exc: BaseException) -> int | None:
    if isinstance(exc, api_exceptions.GoogleAPICallError):
        return int(exc.code) if exc.code is not None else None
    if isinstance(exc, InvalidResponse):
        return int(exc.response.status_code)
    return None


def _describe(exc: BaseException) -> str:
    """The cause of a failure in one short line, without URLs or response dumps."""
    if isinstance(exc, _RetriesExhausted):
        return f"{_describe(exc.cause)} ({exc.reason})"
    if isinstance(exc, api_exceptions.RetryError):
        cause = exc.cause
        detail = _describe(cause) if cause is not None else "retry deadline exceeded"
        return f"{detail} (retry deadline exceeded)"
    status = _status_of(exc)
    if status is not None:
        reason = ""
        if isinstance(exc, api_exceptions.GoogleAPICallError):
            errors = [e for e in exc.errors if isinstance(e, Mapping)]
            if errors and errors[0].get("message"):
                reason = str(errors[0]["message"])
        response = getattr(exc, "response", None)
        if not reason and isinstance(response, requests.Response):
            reason = _server_message(response) or response.reason or ""
        if not reason:
            reason = http.client.responses.get(status, "")
        return _one_line(f"HTTP {status} {reason}".strip())
    if isinstance(exc, requests.RequestException):
        return _describe_transport(exc)
    text = str(exc)
    return _one_line(f"{type(exc).__name__}: {text}" if text else type(exc).__name__)


def _server_message(response: requests.Response) -> str:
    """``error.message`` of a JSON error body already read, else ""."""
    consumed = getattr(response, "_content_consumed", False)
    if consumed is not True or not response._content:
        return ""  # never read a body here: it may be a stream
    try:
        message = response.json()["error"]["message"]
    except (ValueError, KeyError, TypeError):
        return ""
    return str(message)


def _describe_transport(exc: requests.RequestException) -> str:
    """``connection failed (host:port): [Errno 111] Connection refused`` and the like."""
    if isinstance(exc, requests.Timeout):
        kind = "timed out"
    elif isinstance(exc, requests.ConnectionError):
        kind = "connection failed"
    else:
        kind = type(exc).__name__
    request = exc.request
    host = urlsplit(request.url).netloc if request is not None and request.url else ""
    inner: object = exc.args[0] if exc.args else None
    if isinstance(inner, urllib3.exceptions.MaxRetryError) and inner.reason is not None:
        inner = inner.reason
    found = _ERRNO.search(str(exc))
    detail = found.group(0).strip() if found else type(inner or exc).__name__
    return _one_line(f"{kind} ({host}): {detail}" if host else f"{kind}: {detail}")


def _map_error(exc: BaseException, what: str) -> TierfsError:
    """The tierfs error for a library failure while working on ``what``."""
    if isinstance(exc, TierfsError):
        return exc
    root: BaseException = exc
    if isinstance(exc, _RetriesExhausted):
        root = exc.cause
    status = _status_of(root)
    if status == 404:
        return NotFound(f"{what}: not found")
    if status == 412:
        return PreconditionFailed(f"{what}: generation precondition failed")
    if status in (401, 403) or isinstance(
        root, auth_exceptions.RefreshError | auth_exceptions.DefaultCredentialsError
    ):
        return AccessDenied(f"{what}: access denied: {_describe(root)}")
    return BackendError(f"{what}: {_describe(exc)}")


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
            writer.close()  # the last chunk; the object exists from here
            blob.reload()  # BlobWriter keeps no response: read back the new generation
            return _info(blob)

        info = await self._owner._call(run, f"gs://{self._owner.name}/{blob.name}", requests=2)
        self._owner._counters.add(bytes_written=self._written % self._chunk)
        return info

    async def abort(self) -> None:
        writer = self._writer

        def run() -> None:
            with contextlib.suppress(Exception):
                writer.terminate()

        await trio.to_thread.run_sync(run)


def _info(blob: storage.Blob) -> ObjectInfo:
    """An `ObjectInfo` from the object resource the server returned."""
    if blob.generation is None:
        raise BackendError(f"{blob.name}: the server returned an object without a generation")
    updated = blob.updated
    return ObjectInfo(
        name=blob.name,
        size=int(blob.size or 0),
        generation=int(blob.generation),
        metageneration=int(blob.metageneration or 1),
        updated_s=updated.timestamp() if updated is not None else 0.0,
        metadata=dict(blob.metadata or {}),
        content_type=blob.content_type,
        crc32c=blob.crc32c,
    )


def _normalize_endpoint(endpoint: str) -> str:
    """``host:port``, ``http://host:port/`` or ``.../storage/v1/`` -> ``scheme://host:port``."""
    url = endpoint.strip().rstrip("/")
    if url.endswith("/storage/v1"):
        url = url[: -len("/storage/v1")]
    if "://" not in url:
        url = "https://" + url
    return url


def _credentials(key_file: str, anonymous: bool, endpoint: str = "") -> Credentials:
    """Credentials from a key file, anonymous, or Application Default Credentials. With a
    custom endpoint and none of them, the one line says which flag an emulator needs
    (anonymous access is never chosen silently: a private endpoint may want a token)."""
    scopes = list(storage.Client.SCOPE)
    if anonymous:
        return AnonymousCredentials()
    if key_file:
        return _key_file_credentials(key_file, scopes)
    try:
        credentials, _ = google.auth.default(scopes=scopes)
    except auth_exceptions.DefaultCredentialsError as exc:
        if endpoint:
            raise AccessDenied(
                f"no credentials for {endpoint}: add --anonymous-access (an emulator) or "
                "--key-file=KEY.json"
            ) from None
        env = os.environ.get("GOOGLE_APPLICATION_CREDENTIALS")
        detail = f" (GOOGLE_APPLICATION_CREDENTIALS: {_one_line(str(exc))})" if env else ""
        raise AccessDenied(NO_CREDENTIALS + detail) from None
    return credentials


def _key_file_credentials(key_file: str, scopes: list[str]) -> Credentials:
    """A service-account (or gcloud user) JSON key, loaded by its declared type only."""
    try:
        with open(key_file, encoding="utf-8") as stream:
            info = json.load(stream)
        kind = info.get("type") if isinstance(info, dict) else None
        if kind == "service_account":
            return service_account.Credentials.from_service_account_info(info, scopes=scopes)
        if kind == "authorized_user":
            return user_credentials.Credentials.from_authorized_user_info(info, scopes=scopes)
    except (auth_exceptions.GoogleAuthError, OSError, ValueError) as exc:
        detail = exc.strerror if isinstance(exc, OSError) and exc.strerror else _describe(exc)
        raise AccessDenied(f"cannot use key file {key_file!r}: {detail}") from None
    raise AccessDenied(
        f"cannot use key file {key_file!r}: type {kind!r} is not a service account key"
    )


class GcsBucket:
    """One bucket on GCS or a GCS-compatible endpoint.  Build it with `connect`."""

    def __init__(
        self,
        client: storage.Client,
        bucket_name: str,
        *,
        retry: RetrySettings | None = None,
        http_timeout_s: float = 0,
        limiter: trio.CapacityLimiter | None = None,
        billing_project: str = "",
        throttle: Throttle | None = None,
    ) -> None:
        settings = retry if retry is not None else RetrySettings()
        self._throttle = throttle if throttle is not None else Throttle()
        self.name = bucket_name
        # google-cloud-storage >= 3.17 fetches bucket metadata for tracing attributes in
        # a background thread of its own on first use: a request outside the limiter
        # (and the retry policy) that may outlive close().  No tracing here: turn it off.
        client._bucket_metadata_cache = None
        self._client = client
        self._bucket = client.bucket(bucket_name, user_project=billing_project or None)
        connection = client._connection
        host = (
            connection.get_api_base_url_for_mtls()
            if hasattr(connection, "get_api_base_url_for_mtls")
            else connection.API_BASE_URL
        )
        self._upload_url = f"{host}/upload/storage/v1{self._bucket.path}/o"
        self._limiter = (
            limiter if limiter is not None else trio.CapacityLimiter(DEFAULT_CONCURRENCY)
        )
        self._timeout_s = http_timeout_s if http_timeout_s > 0 else DEFAULT_HTTP_TIMEOUT_S
        self._counters = _Counters()
        self.last_error = ""  # the last transient failure, in one line (for slow-request logs)
        self._retry = self._make_retry(settings, settings.max_attempts)
        self._check_retry = self._make_retry(settings, settings.max_attempts or _CHECK_ATTEMPTS)
        self._upload_retry = self._make_retry(
            settings, settings.max_attempts, deadline_s=settings.upload_deadline_s
        )
        self._upload_timeout_s = settings.upload_stall_s or self._timeout_s
        stall = settings.read_stall
        self._stall = StallTimeout(stall) if stall is not None and stall.enabled else None
        self._page_size: int | None = None  # None: the server's page size (1,000 on GCS)
        self._chunk_bytes = UPLOAD_CHUNK_BYTES

    @classmethod
    def connect(
        cls,
        bucket_name: str,
        *,
        endpoint: str = "",
        key_file: str = "",
        anonymous: bool = False,
        billing_project: str = "",
        app_name: str = "",
        retry: RetrySettings | None = None,
        http_timeout_s: float = 0,
        limiter: trio.CapacityLimiter | None = None,
        max_connections: int = 0,
        throttle: Throttle | None = None,
    ) -> GcsBucket:
        """A bucket handle; no request is made (call `check` for that).

        Credentials: ``key_file`` if given; anonymous if asked for (an emulator must
        ask); otherwise Application Default Credentials, which may consult the GCE
        metadata server: this call can
        block for a few seconds, so run it in a thread from async code.  Raises
        `AccessDenied` with a one-line message when no credentials can be found.

        ``max_connections`` (gcsfuse's ``max-conns-per-host``; 0: no cap of its own)
        caps requests in flight, hence connections: the limiter gets that many tokens.
        """
        if limiter is None:
            limiter = trio.CapacityLimiter(max_connections or DEFAULT_CONCURRENCY)
        credentials = _credentials(key_file, anonymous, endpoint)
        anonymous_credentials = isinstance(credentials, AnonymousCredentials)
        # Anonymous credentials cannot be refreshed: let a 401 be a 401, not a refresh error.
        session = AuthorizedSession(
            credentials, refresh_status_codes=() if anonymous_credentials else (401,)
        )
        _settle_environment(
            session, _normalize_endpoint(endpoint) if endpoint else "https://storage.googleapis.com"
        )
        tokens = limiter.total_tokens
        pool = (int(tokens) if math.isfinite(tokens) else DEFAULT_CONCURRENCY) + 2
        for scheme in ("https://", "http://"):
            session.mount(scheme, requests.adapters.HTTPAdapter(pool_maxsize=pool))
        user_agent = f"tierfs/{tierfs.__version__}" + (f" {app_name}" if app_name else "")
        client_options = {"api_endpoint": _normalize_endpoint(endpoint)} if endpoint else None
        client = storage.Client(
            project=billing_project or None,
            credentials=credentials,
            _http=session,
            client_info=ClientInfo(user_agent=user_agent),
            client_options=client_options,
        )
        return cls(
            client,
            bucket_name,
            retry=retry,
            http_timeout_s=http_timeout_s,
            limiter=limiter,
            billing_project=billing_project,
            throttle=throttle,
        )

    def close(self) -> None:
        """Close the HTTP connections.  The handle must not be used afterwards."""
        self._client.close()

    def statistics(self) -> dict[str, int]:
        return {**self._counters.snapshot(), **self._throttle.statistics()}

    # -- the protocol --------------------------------------------------------------------

    async def check(self) -> None:
        """Verify the bucket exists and its objects can be listed (what a mount needs).

        Lists at most one object rather than reading bucket metadata, so principals with
        object roles only (no ``storage.buckets.get``) pass.  Transient failures are
        retried a few times at most, so a mount fails fast instead of hanging.
        """
        bucket, retry, timeout = self._bucket, self._check_retry, self._timeout_s
        client = self._client

        def run() -> None:
            iterator = client.list_blobs(bucket, max_results=1, retry=retry, timeout=timeout)
            for _ in iterator:
                pass

        self._counters.add(requests=1, lists=1)
        try:
            await trio.to_thread.run_sync(run, limiter=self._limiter)
        except Exception as exc:
            self._counters.add(errors=1)
            error = _map_error(exc, f"gs://{self.name}")
            if isinstance(error, NotFound):
                raise NotFound(f"bucket {self.name!r} does not exist") from exc
            if isinstance(error, AccessDenied):
                raise AccessDenied(
                    f"access to bucket {self.name!r} denied: {_describe(exc)}"
                ) from exc
            raise BackendError(f"cannot reach bucket {self.name!r}: {_describe(exc)}") from exc

    async def stat(self, name: str) -> ObjectInfo:
        bucket, retry, timeout = self._bucket, self._retry, self._timeout_s

        def run() -> ObjectInfo:
            blob = bucket.get_blob(name, retry=retry, timeout=timeout)
            if blob is None:
                raise NotFound(f"gs://{bucket.name}/{name}: not found")
            return _info(blob)

        return await self._call(run, f"gs://{self.name}/{name}", abandon=True, requests=1, stats=1)

    async def list(
        self,
        prefix: str,
        *,
        delimiter: str | None = "/",
        max_results: int | None = None,
        start_offset: str | None = None,
    ) -> Listing:
        if max_results is not None and max_results <= 0:
            raise ValueError(f"max_results must be positive, got {max_results}")
        client, bucket, retry, timeout = self._client, self._bucket, self._retry, self._timeout_s
        page_size = self._page_size
        if max_results is not None:
            page_size = min(page_size or max_results, max_results)
        counters = self._counters

        def run() -> Listing:
            iterator = client.list_blobs(
                bucket,
                prefix=prefix or None,
                delimiter=delimiter,
                start_offset=start_offset or None,
                page_size=page_size,
                retry=retry,
                timeout=timeout,
            )
            objects: list[ObjectInfo] = []
            prefixes: set[str] = set()
            for page in iterator.pages:
                counters.add(requests=1, lists=1)
                objects.extend(_info(blob) for blob in page)
                prefixes.update(page.prefixes)
                if max_results is not None and len(objects) + len(prefixes) >= max_results:
                    break
            return _listing(objects, prefixes, max_results)

        return await self._call(run, f"gs://{self.name}/{prefix}*", abandon=True)

    async def read(self, name: str, *, generation: int, offset: int, length: int) -> bytes:
        if offset < 0 or length < 0:
            raise ValueError(f"negative offset or length: {offset}, {length}")
        if length == 0:
            await trio.lowlevel.checkpoint()
            return b""
        retry, timeout, stall = self._retry, self._timeout_s, self._stall
        counters = self._counters
        session: requests.Session = self._client._http
        # The library's own URL (host, escaping, userProject), fetched our way below.
        url = self._bucket.blob(name, generation=generation)._get_download_url(self._client)
        headers = {"Range": f"bytes={offset}-{offset + length - 1}", "Accept-Encoding": "identity"}

        def attempt() -> bytes:
            # A raw streamed GET into one preallocated buffer: the client library's
            # download_as_bytes copies through a BytesIO in small pieces, at about half the
            # speed and twice the memory (measured on the emulator).
            if stall is None:
                return receive(timeout or None)
            try:
                return receive((timeout or None, stall.current()), stall.observe)
            except (requests.Timeout, urllib3.exceptions.TimeoutError):
                stall.stalled()  # no head in time, or the body stopped coming
                counters.add(read_stalls=1)
                raise

        def receive(
            limit: float | tuple[float | None, float] | None,
            on_head: Callable[[float], None] | None = None,
        ) -> bytes:
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
                declared = response.headers.get("Content-Length")
                if declared is None:  # no length announced: let requests assemble it
                    return response.content[:length]
                buffer = bytearray(min(int(declared), length))
                view, filled = memoryview(buffer), 0
                while filled < len(buffer):
                    count = response.raw.readinto(view[filled:])
                    if not count:
                        break
                    filled += count
                view.release()
                if filled < len(buffer):  # the connection ended early: never a short block
                    raise requests.ConnectionError(f"short read: {filled} of {len(buffer)} bytes")
                return bytes(buffer)
            finally:
                response.close()

        def run() -> bytes:
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
        blob = self._bucket.blob(name, chunk_size=chunk)
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

        # Opened first, outside `_call`: a local failure (ENOENT, EACCES...) stays an
        # OSError with its errno, as with `MemoryBucket`, instead of a BackendError.
        stream = await trio.to_thread.run_sync(open, path, "rb")

        def run() -> ObjectInfo:
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
            blob = bucket.blob(name, chunk_size=chunk_bytes)
            blob.metadata = blob_metadata
            blob.upload_from_file(
                stream,
                size=size,
                content_type=content_type or DEFAULT_CONTENT_TYPE,
                if_generation_match=if_generation_match,
                checksum="crc32c",
                retry=retry,
                timeout=timeout,
            )
            counters.add(bytes_written=size)
            return _info(blob)

        try:
            return await self._call(run, f"gs://{self.name}/{name}", requests=1, uploads=1)
        finally:
            stream.close()

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
        checksum = google_crc32c.Checksum()
        for offset in range(0, size, _CRC_BLOCK):
            checksum.update(os.pread(fd, min(_CRC_BLOCK, size - offset), offset))
        crc = base64.b64encode(checksum.digest()).decode("ascii")
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
        timeout = self._upload_timeout_s or None

        tries = 0

        def attempt() -> dict[str, Any]:
            nonlocal tries
            tries += 1
            body = _FileBody(head, fd, size, tail)  # anew each attempt: from the start
            response = session.post(url, params=params, data=body, headers=headers, timeout=timeout)
            if response.status_code >= 400:
                raise api_exceptions.from_http_response(response)
            result: dict[str, Any] = response.json()
            return result

        try:
            answer = retry(attempt)() if retry is not None else attempt()
        except api_exceptions.PreconditionFailed:
            # A retry whose precondition fails may be failing on our own first attempt:
            # GCS made the object and its answer was lost (a reset, a stall cut short).
            # Then the live object holds exactly these bytes, and the upload succeeded.
            own = self._own_object(name, crc, size) if tries > 1 else None
            if own is None:
                raise
            answer = dict(own._properties)
        if answer.get("crc32c", crc) != crc or int(answer.get("size", size)) != size:
            raise BackendError(f"gs://{self.name}/{name}: GCS holds other bytes than were sent")
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
            blob = bucket.blob(name, chunk_size=chunk_bytes)
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

    async def delete(self, name: str, *, if_generation_match: int | None = None) -> None:
        # Retried even without a precondition, as gcsfuse retries every request: a retry
        # after a lost answer finds nothing (NotFound, which callers take as done).
        bucket, timeout, retry = self._bucket, self._timeout_s, self._retry

        def run() -> None:
            bucket.blob(name).delete(
                if_generation_match=if_generation_match, retry=retry, timeout=timeout
            )

        await self._call(run, f"gs://{self.name}/{name}", requests=1, deletes=1)

    async def copy(
        self,
        source: str,
        destination: str,
        *,
        source_generation: int,
        if_generation_match: int | None,
    ) -> ObjectInfo:
        check_name(destination)
        bucket, timeout = self._bucket, self._timeout_s
        retry, retries = self._counting(self._retry if if_generation_match is not None else None)
        counters = self._counters

        def run() -> ObjectInfo:
            # rewrite, not copyTo: large or cross-class copies may take several calls.
            source_blob = bucket.blob(source, generation=source_generation)
            target = bucket.blob(destination)
            token: str | None = None
            while True:
                counters.add(requests=1, copies=1)
                try:
                    token, _, _ = target.rewrite(
                        source_blob,
                        token=token,
                        if_generation_match=if_generation_match,
                        retry=retry,
                        timeout=timeout,
                    )
                except api_exceptions.PreconditionFailed:
                    own = copied() if retries[0] else None
                    if own is None:
                        raise
                    return _info(own)
                if token is None:
                    return _info(target)

        def copied() -> storage.Blob | None:
            """The destination, if it is the copy the lost answer was about."""
            original = bucket.get_blob(source, generation=source_generation, retry=self._retry)
            if original is None:
                return None
            return self._own_object(destination, original.crc32c, original.size)

        what = f"gs://{self.name}/{source}#{source_generation} -> {destination}"
        return await self._call(run, what)

    async def update_metadata(
        self, name: str, metadata: Mapping[str, str | None], *, generation: int
    ) -> ObjectInfo:
        changes = dict(metadata)
        bucket, retry, timeout = self._bucket, self._retry, self._timeout_s

        def run() -> ObjectInfo:
            blob = bucket.blob(name, generation=generation)
            blob.metadata = changes  # a None value is sent as null: GCS removes the key
            blob.patch(retry=retry, timeout=timeout)
            return _info(blob)

        return await self._call(run, f"gs://{self.name}/{name}#{generation}", requests=1)

    # -- internals -----------------------------------------------------------------------

    def _make_retry(
        self, settings: RetrySettings, max_attempts: int, *, deadline_s: float | None = None
    ) -> _BoundedRetry:
        counters = self._counters

        def on_retry(exc: Exception) -> None:
            counters.add(retries=1, requests=1)
            self.last_error = _describe(exc)  # one str assignment: atomic under the GIL

        return _BoundedRetry(
            predicate=_is_transient,
            initial=settings.initial_sleep_s,
            maximum=settings.max_sleep_s,
            multiplier=settings.multiplier,
            timeout=deadline_s if deadline_s is not None else settings.deadline_s,
            max_attempts=max_attempts,
            on_retry=on_retry,
        )

    async def _call(
        self,
        run: Callable[[], T],
        what: str,
        *,
        abandon: bool = False,
        nbytes: int = 0,
        **counts: int,
    ) -> T:
        """Run ``run`` in a worker thread under the limiter; map its failure at the edge.
        ``abandon``: a request that changes nothing (a read, a stat, a list) may be left to
        finish alone when the caller is cancelled (FUSE INTERRUPT of a killed reader); its
        thread keeps its limiter token until it ends, within its HTTP timeouts.
        ``nbytes``: what a read asks for, charged to ``limit-bytes-per-sec``."""
        if counts:
            self._counters.add(**counts)
        await self._throttle.admit(nbytes)
        counters = self._counters

        def counted() -> T:
            counters.enter()
            try:
                return run()
            finally:
                counters.leave()

        try:
            return await trio.to_thread.run_sync(
                counted, limiter=self._limiter, abandon_on_cancel=abandon
            )
        except Exception as exc:
            error = _map_error(exc, what)
            if not isinstance(error, NotFound | PreconditionFailed):
                self._counters.add(errors=1)  # "not there" and "changed" are answers, not faults
            if error is exc:
                raise
            raise error from exc


class _FileBody:
    """A request body of ``head``, ``size`` bytes of ``fd`` from offset 0, and ``tail``,
    read as http.client sends it (it asks ``len`` for the Content-Length): a 64 MiB
    upload costs no 64 MiB of memory."""

    def __init__(self, head: bytes, fd: int, size: int, tail: bytes) -> None:
        self._parts = [head, b"", tail]
        self._fd, self._size, self._offset = fd, size, 0
        self._left = len(head) + size + len(tail)

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
                raise ValueError(f"file ended at {self._offset} of {self._size} bytes")
            self._offset += len(out)
        else:
            out, self._parts[2] = self._parts[2][:amount], self._parts[2][amount:]
        self._left -= len(out)
        return out


def _settle_environment(session: requests.Session, url: str) -> None:
    """Read the environment's proxy and CA-bundle settings (HTTPS_PROXY, NO_PROXY,
    REQUESTS_CA_BUNDLE...) once, for the one endpoint this session talks to, instead of
    at every request: requests looks them up, and ~/.netrc, per request, about a tenth of
    the CPU of a small upload."""
    session.proxies.update(requests.utils.get_environ_proxies(url))
    bundle = os.environ.get("REQUESTS_CA_BUNDLE") or os.environ.get("CURL_CA_BUNDLE")
    if bundle:
        session.verify = bundle
    session.trust_env = False


def _listing(objects: list[ObjectInfo], prefixes: set[str], max_results: int | None) -> Listing:
    """Sort, and cap objects + prefixes together at ``max_results`` in name order."""
    objects.sort(key=lambda info: info.name)
    ordered = sorted(prefixes)
    if max_results is not None and len(objects) + len(ordered) > max_results:
        merged = sorted(
            [(info.name, info) for info in objects] + [(p, None) for p in ordered],
            key=lambda entry: entry[0],
        )[:max_results]
        objects = [info for _, info in merged if info is not None]
        ordered = [name for name, info in merged if info is None]
    return Listing(objects=tuple(objects), prefixes=tuple(ordered))
