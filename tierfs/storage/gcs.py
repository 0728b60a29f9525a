"""`GcsBucket`: the `Bucket` protocol over google-cloud-storage (real GCS or the emulator).

It and its parts (``gcs_*.py``: uploads, reads, resources, credentials, errors) are the
only modules that import ``google.*``. Three jobs happen here and nowhere else:

Threads.  The client library blocks, so every call runs in ``trio.to_thread.run_sync``
under one ``trio.CapacityLimiter`` per client: the limiter bounds concurrent requests
(and threads), and the HTTP connection pool is sized to it so no connection is ever
thrown away.  A thread gets only immutable inputs (names, numbers, copies of dicts) and
builds its own ``Blob``; the only shared state threads touch is the statistics counter,
behind a lock.  Cancelling a trio task waits for its request to finish (the HTTP timeout
bounds that), so no thread outlives the call that started it; only requests that change
nothing (reads, stats, lists) may be abandoned to finish alone, when a killed caller's
FUSE request is interrupted (`tierfs.fuse.interrupts`), and the others at the end of an
unmount with GCS not answering (`let_go`; `tierfs.storage.unfinished`).

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

Library quirks handled here: google-cloud-storage >= 3.17 starts a thread of its own to
fetch bucket metadata for tracing (a request outside the limiter and the retry policy,
which may outlive `close`), so that cache is switched off; a failed streamed download
leaves its connection checked out until the response is read or closed (`_release`);
with anonymous credentials a 401 must not trigger a token refresh.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from functools import partial
from typing import TypeVar

import trio
from google.api_core import exceptions as api_exceptions
from google.cloud import storage

from tierfs.errors import (
    AccessDenied,
    BackendError,
    NotFound,
    PreconditionFailed,
)
from tierfs.storage import Listing, ObjectInfo, check_name
from tierfs.storage.counters import Counters
from tierfs.storage.gcs_auth import NO_CREDENTIALS, client_for
from tierfs.storage.gcs_errors import _describe, _map_error
from tierfs.storage.gcs_read import _Reads
from tierfs.storage.gcs_resource import _info, item_info
from tierfs.storage.gcs_upload import (
    UPLOAD_CHUNK_BYTES,
    _Uploads,
)
from tierfs.storage.ratelimit import Throttle
from tierfs.storage.retry import (
    RetrySettings,
    _BoundedRetry,
    _is_transient,
)
from tierfs.storage.stall import StallTimeout
from tierfs.storage.unfinished import Unfinished

__all__ = ["NO_CREDENTIALS", "GcsBucket", "RetrySettings"]

DEFAULT_CONCURRENCY = 32
POOL_MAX = 512  # connections the HTTP pool keeps at most (see `GcsBucket.connect`)
DEFAULT_HTTP_TIMEOUT_S = 60.0
_CHECK_ATTEMPTS = 3

T = TypeVar("T")


class GcsBucket(_Uploads, _Reads):
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
        self._unfinished = Unfinished()
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
        self._counters = Counters()
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
        tokens = limiter.total_tokens
        # The HTTP pool is sized to the limiter, so no connection is ever thrown away, up to
        # `POOL_MAX`: urllib3 makes a slot per connection up front (a max-conns-per-host of
        # 10**9 took the daemon past 7 GB before it mounted); past it, extra connections
        # are opened and closed as needed.
        pool = min(int(tokens) if math.isfinite(tokens) else DEFAULT_CONCURRENCY, POOL_MAX) + 2
        client = client_for(
            endpoint=endpoint,
            key_file=key_file,
            anonymous=anonymous,
            billing_project=billing_project,
            app_name=app_name,
            pool=pool,
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

    def let_go(self) -> None:
        """Requests in flight that change GCS fail at once, and new ones (`Unfinished`)."""
        self._unfinished.let_go()

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
                # (as text: the client would send Python's "True", which the emulator
                # reads as false; GCS takes either)
                include_trailing_delimiter="true" if delimiter else None,
                start_offset=start_offset or None,
                page_size=page_size,
                retry=retry,
                timeout=timeout,
            )
            iterator.item_to_value = item_info  # (not a storage.Blob each: `info_of`)
            objects: list[ObjectInfo] = []
            folded: list[ObjectInfo] = []  # named as a prefix: a directory's placeholder
            prefixes: set[str] = set()
            for page in iterator.pages:
                counters.add(requests=1, lists=1)
                for info in page:
                    if delimiter and info.name.find(delimiter, len(prefix)) >= 0:
                        folded.append(info)
                    else:
                        objects.append(info)
                prefixes.update(page.prefixes)
                if max_results is not None and len(objects) + len(prefixes) >= max_results:
                    break
            return _listing(objects, prefixes, max_results, folded)

        return await self._call(run, f"gs://{self.name}/{prefix}*", abandon=True)

    async def delete(self, name: str, *, if_generation_match: int | None = None) -> None:
        # A delete of a named generation is retried: after a lost answer the retry finds
        # that generation gone (NotFound) or a newer one another client made since (412,
        # answered as NotFound: the generation asked for is not live, and what is there
        # is not ours to delete). An unconditional delete is sent once, as an
        # unconditional write: retried after a lost answer, it would delete the object
        # someone made in between (callers name a generation: `delete_named`).
        bucket, timeout = self._bucket, self._timeout_s
        retry, retries = self._counting(self._retry if if_generation_match is not None else None)

        def run() -> None:
            try:
                bucket.blob(name).delete(
                    if_generation_match=if_generation_match, retry=retry, timeout=timeout
                )
            except api_exceptions.PreconditionFailed as err:
                if not retries[0]:
                    raise
                raise api_exceptions.NotFound(f"generation {if_generation_match}") from err

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
            if abandon:
                return await trio.to_thread.run_sync(
                    counted, limiter=self._limiter, abandon_on_cancel=True
                )
            return await self._unfinished.run(
                partial(
                    trio.to_thread.run_sync, counted, limiter=self._limiter, abandon_on_cancel=True
                ),
                what,
            )
        except Exception as exc:
            error = _map_error(exc, what)
            if not isinstance(error, NotFound | PreconditionFailed):
                self._counters.add(errors=1)  # "not there" and "changed" are answers, not faults
            if error is exc:
                raise
            raise error from exc


def _listing(
    objects: list[ObjectInfo],
    prefixes: set[str],
    max_results: int | None,
    folded: list[ObjectInfo],
) -> Listing:
    """Sort, and cap objects + prefixes together at ``max_results`` in name order; the
    placeholders of the prefixes kept."""
    objects.sort(key=lambda info: info.name)
    ordered = sorted(prefixes)
    if max_results is not None and len(objects) + len(ordered) > max_results:
        merged = sorted(
            [(info.name, info) for info in objects] + [(p, None) for p in ordered],
            key=lambda entry: entry[0],
        )[:max_results]
        objects = [info for _, info in merged if info is not None]
        ordered = [name for name, info in merged if info is None]
    kept = set(ordered)
    placeholders = sorted((i for i in folded if i.name in kept), key=lambda info: info.name)
    return Listing(
        objects=tuple(objects), prefixes=tuple(ordered), placeholders=tuple(placeholders)
    )
