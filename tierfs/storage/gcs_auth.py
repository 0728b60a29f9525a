"""Credentials, the endpoint and the client of `GcsBucket`: a key file, anonymous access
(an emulator must ask for it), or Application Default Credentials; the environment's
proxy and CA settings read once for the one endpoint; the HTTP session and its pool.
"""

from __future__ import annotations

import json
import os

import google.auth
import requests
import requests.adapters
from google.api_core.client_info import ClientInfo
from google.auth import exceptions as auth_exceptions
from google.auth.credentials import AnonymousCredentials, Credentials
from google.auth.transport.requests import AuthorizedSession
from google.cloud import storage
from google.oauth2 import credentials as user_credentials
from google.oauth2 import service_account

import tierfs
from tierfs.errors import (
    AccessDenied,
)
from tierfs.storage.gcs_errors import _describe, _one_line
from tierfs.storage.smallfile import read_small_file

NO_CREDENTIALS = (
    "no credentials found: set GOOGLE_APPLICATION_CREDENTIALS, use --key-file,"
    " or --anonymous-access"
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
    env = os.environ.get("GOOGLE_APPLICATION_CREDENTIALS")
    try:
        if env:  # (google.auth reads it with no bound: a FIFO or /dev/zero hung the mount)
            read_small_file(env)
        credentials, _ = google.auth.default(scopes=scopes)
    except (
        auth_exceptions.DefaultCredentialsError,
        OSError,
        ValueError,
        AttributeError,
        TypeError,
    ) as exc:
        # A directory, ``[]`` or bad JSON there raised IsADirectoryError, AttributeError
        # or a tuple of (message, cause): "internal error" or a repr, never one line. A
        # file that is not there is the same as no credentials at all.
        missing = isinstance(exc, FileNotFoundError)
        if env and not missing:
            raise AccessDenied(
                f"cannot use GOOGLE_APPLICATION_CREDENTIALS={env!r}: {_detail(exc)}"
            ) from None
        if endpoint:
            raise AccessDenied(
                f"no credentials for {endpoint}: add --anonymous-access (an emulator) or "
                "--key-file=KEY.json"
            ) from None
        detail = f" (GOOGLE_APPLICATION_CREDENTIALS: {env} does not exist)" if env else ""
        raise AccessDenied(NO_CREDENTIALS + detail) from None
    return credentials


def _detail(exc: BaseException) -> str:
    """The cause of a credentials failure in words: an OSError's strerror, an exception's
    first argument (google.auth wraps a JSONDecodeError as ``(message, cause)``)."""
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    if isinstance(exc, UnicodeDecodeError):
        return "not UTF-8 text"
    if isinstance(exc, AttributeError | TypeError):
        return "not a JSON object of credentials"
    first = exc.args[0] if exc.args else ""
    return _one_line(str(first)) or type(exc).__name__


def _key_file_credentials(key_file: str, scopes: list[str]) -> Credentials:
    """A service-account (or gcloud user) JSON key, loaded by its declared type only."""
    try:
        info = json.loads(read_small_file(key_file))
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


def client_for(
    *, endpoint: str, key_file: str, anonymous: bool, billing_project: str, app_name: str, pool: int
) -> storage.Client:
    """A google-cloud-storage client for ``endpoint`` (empty: GCS) with its credentials and
    an HTTP pool of ``pool`` connections. Raises `AccessDenied` (one line) without
    credentials."""
    credentials = _credentials(key_file, anonymous, endpoint)
    anonymous_credentials = isinstance(credentials, AnonymousCredentials)
    # Anonymous credentials cannot be refreshed: let a 401 be a 401, not a refresh error.
    session = AuthorizedSession(
        credentials, refresh_status_codes=() if anonymous_credentials else (401,)
    )
    _settle_environment(
        session, _normalize_endpoint(endpoint) if endpoint else "https://storage.googleapis.com"
    )
    for scheme in ("https://", "http://"):
        session.mount(scheme, requests.adapters.HTTPAdapter(pool_maxsize=pool))
    user_agent = f"tierfs/{tierfs.__version__}" + (f" {app_name}" if app_name else "")
    client_options = {"api_endpoint": _normalize_endpoint(endpoint)} if endpoint else None
    return storage.Client(
        project=billing_project or None,
        credentials=credentials,
        _http=session,
        client_info=ClientInfo(user_agent=user_agent),
        client_options=client_options,
    )
