"""GCS failures as `tierfs.errors`, in one line naming the object and the cause.

404 -> `NotFound`, 412 -> `PreconditionFailed`, 401/403 and credential failures ->
`AccessDenied`, anything else (after retries) -> `BackendError`. The messages end up
in logs and in the one-line error of ``tierfs mount``, so they are short and never
carry a response body whole.
"""

from __future__ import annotations

import http.client
import re
from collections.abc import Mapping
from urllib.parse import urlsplit

import requests
import urllib3
from google.api_core import exceptions as api_exceptions
from google.auth import exceptions as auth_exceptions
from google.cloud.storage.exceptions import InvalidResponse

from tierfs.errors import AccessDenied, BackendError, NotFound, PreconditionFailed, TierfsError
from tierfs.storage.retry import _RetriesExhausted

_MAX_DETAIL_CHARS = 300
_ERRNO = re.compile(r"\[Errno -?\d+\][^'\")]*")
_QUOTED = re.compile(r"'([^'\s]+)'")  # a URL in requests' words: 'http://h:1/storage/v1/...'


def _cut_url(match: re.Match[str]) -> str:
    """A quoted URL cut to its scheme and host: no path, no query string."""
    text = match.group(1)
    scheme, sep, rest = text.partition("://")
    return f"'{scheme}{sep}{rest.split('/')[0]}'" if sep else f"'{text.split('/')[0]}'"


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
    elif isinstance(exc, requests.exceptions.InvalidURL | requests.exceptions.InvalidSchema):
        kind = "bad endpoint"  # (STORAGE_EMULATOR_HOST or --custom-endpoint)
    else:
        kind = type(exc).__name__
    request = exc.request
    host = urlsplit(request.url).netloc if request is not None and request.url else ""
    inner: object = exc.args[0] if exc.args else None
    if isinstance(inner, urllib3.exceptions.MaxRetryError) and inner.reason is not None:
        inner = inner.reason
    found = _ERRNO.search(str(exc))
    if found:
        detail = found.group(0).strip()
    elif isinstance(inner, str) and inner:  # (requests' own words: InvalidSchema, InvalidURL)
        detail = _QUOTED.sub(_cut_url, inner)
    else:
        detail = type(inner or exc).__name__
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
