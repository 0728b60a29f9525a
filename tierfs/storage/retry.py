"""Retries of GCS requests: gcsfuse's ``gcs-retries`` options on api_core's machinery.

api_core's `Retry` wraps each HTTP request (one JSON call, one media GET, one upload
chunk). It has no attempt limit, only a deadline, and gives up as soon as its next
sleep would pass the deadline; `_BoundedRetry` adds the attempt cap (its ``on_error``
hook counts the attempts of one request) and keeps retrying until the deadline itself,
sleeping no further than it. Only transient failures are retried: 408, 429, 5xx,
connection and timeout errors (`_is_transient`).
"""

from __future__ import annotations

import contextlib
import functools
import http.client
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import requests
import urllib3
from google.api_core import exceptions as api_exceptions
from google.api_core.retry import Retry, exponential_sleep_generator, retry_target
from google.auth import exceptions as auth_exceptions
from google.cloud.storage.exceptions import InvalidResponse

from tierfs.storage.stall import ReadStallSettings

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


def _drop_frames(exc: BaseException) -> None:
    """Let go of the frames a failed attempt's error holds. The retry helper keeps every
    error until the call ends, and each error's traceback its attempt's locals: a read's
    8 MiB block buffer per failed attempt, alive until the retries end (and a collection
    runs), outside the RAM tier's budget. The error's text, all that is logged, stays."""
    seen: set[int] = set()
    error: BaseException | None = exc
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        error.__traceback__ = None
        error = error.__cause__ or error.__context__


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
                _drop_frames(exc)
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
