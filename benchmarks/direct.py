"""GCS used directly, as fast as this harness knows how: the backend limit.

Why raw JSON-API requests and not ``Blob.download_as_bytes``/``upload_from_file``:
the library's helpers copy and checksum in Python (0.7-1.0 GB/s from the
emulator against 2.6 GB/s for a plain streamed GET), and its uploads of more
than 8 MiB are resumable, which the emulator serves slowly (it recomputes
MD5/CRC32C over the whole object for every chunk). So this module speaks the
same HTTP the library speaks, over the same transport
(``google.auth.transport.requests.AuthorizedSession``, one per thread, so
credentials would work on real GCS), and:

- downloads are ranged GETs of ``chunk_bytes`` in parallel, streamed with
  ``readinto`` straight into the caller's buffer (no copies in Python);
- uploads are single-request media uploads (``uploadType=media``), many
  objects in parallel. Real GCS accepts these for any size; on the emulator
  they are the fast path. The harness says so next to the numbers;
- listings ask for only the fields a stat needs, and walk prefixes in
  parallel.

Everything goes through one thread pool (``threads`` workers), the same
parallelism for every operation.
"""

from __future__ import annotations

import builtins  # (`Direct.list` hides the type inside the class)
import concurrent.futures
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any, TypeVar
from urllib.parse import quote

import requests
import requests.adapters
from google.auth.credentials import AnonymousCredentials
from google.auth.transport.requests import AuthorizedSession

from benchmarks.data import WrongBytes

T = TypeVar("T")
DEFAULT_THREADS = 16
DEFAULT_CHUNK_BYTES = 16 << 20
TIMEOUT_S = 120.0
_LIST_FIELDS = "items(name,size,crc32c,generation),prefixes,nextPageToken"


class Direct:
    """Parallel JSON-API calls to one endpoint (``http://127.0.0.1:PORT``)."""

    def __init__(
        self,
        endpoint: str,
        *,
        threads: int = DEFAULT_THREADS,
        chunk_bytes: int = DEFAULT_CHUNK_BYTES,
    ) -> None:
        self.endpoint = endpoint.rstrip("/")
        self.threads = threads
        self.chunk_bytes = chunk_bytes
        self._local = threading.local()
        self._sessions: list[requests.Session] = []
        self._lock = threading.Lock()
        self._pool = concurrent.futures.ThreadPoolExecutor(threads, thread_name_prefix="direct")

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)
        with self._lock:
            for session in self._sessions:
                session.close()
            self._sessions.clear()

    # -- plumbing ----------------------------------------------------------------------

    def _session(self) -> requests.Session:
        session: requests.Session | None = getattr(self._local, "session", None)
        if session is None:
            session = AuthorizedSession(AnonymousCredentials())
            session.mount("http://", requests.adapters.HTTPAdapter(pool_maxsize=4))
            session.trust_env = False
            self._local.session = session
            with self._lock:
                self._sessions.append(session)
        return session

    def _object_url(self, bucket: str, name: str) -> str:
        return f"{self.endpoint}/storage/v1/b/{bucket}/o/{quote(name, safe='')}"

    def map(self, fn: Callable[..., T], *iterables: Iterable[Any]) -> list[T]:
        """``fn`` over the items in the pool; the first exception is raised."""
        return list(self._pool.map(fn, *iterables))

    # -- objects -----------------------------------------------------------------------

    def create_bucket(self, bucket: str) -> None:
        response = self._session().post(
            f"{self.endpoint}/storage/v1/b?project=test", json={"name": bucket}, timeout=TIMEOUT_S
        )
        response.raise_for_status()

    def upload(self, bucket: str, name: str, data: bytes | memoryview) -> dict[str, Any]:
        """One single-request media upload; the object's JSON resource."""
        response = self._session().post(
            f"{self.endpoint}/upload/storage/v1/b/{bucket}/o",
            params={"uploadType": "media", "name": name},
            data=data,  # type: ignore[arg-type]  # (requests sends any buffer)
            headers={"Content-Type": "application/octet-stream"},
            timeout=TIMEOUT_S,
        )
        response.raise_for_status()
        result: dict[str, Any] = response.json()
        return result

    def upload_many(self, bucket: str, items: Sequence[tuple[str, bytes | memoryview]]) -> None:
        self.map(lambda item: self.upload(bucket, item[0], item[1]), items)

    def read_range_into(self, bucket: str, name: str, offset: int, view: memoryview) -> int:
        """Stream bytes ``offset..offset+len(view)`` of an object into ``view``."""
        if len(view) == 0:
            return 0
        headers = {"Range": f"bytes={offset}-{offset + len(view) - 1}"}
        url = self._object_url(bucket, name)
        with self._session().get(
            url, params={"alt": "media"}, headers=headers, stream=True, timeout=TIMEOUT_S
        ) as response:
            response.raise_for_status()
            got = 0
            while got < len(view):
                n = response.raw.readinto(view[got:])
                if not n:
                    break
                got += n
            return got

    def read_range(self, bucket: str, name: str, offset: int, length: int) -> bytes:
        buffer = bytearray(length)
        n = self.read_range_into(bucket, name, offset, memoryview(buffer))
        return bytes(buffer[:n])

    def download_many(self, bucket: str, targets: Sequence[tuple[str, memoryview]]) -> None:
        """Fill each (name, buffer) with the object's bytes: parallel ranged GETs."""
        jobs = []
        for name, view in targets:
            for start in range(0, len(view), self.chunk_bytes):
                jobs.append((name, start, view[start : start + self.chunk_bytes]))

        def run(job: tuple[str, int, memoryview]) -> None:
            name, start, part = job
            got = self.read_range_into(bucket, name, start, part)
            if got != len(part):
                raise OSError(f"gs://{bucket}/{name}: short read at {start}: {got}/{len(part)}")

        self.map(run, jobs)

    def stat(self, bucket: str, name: str) -> dict[str, Any]:
        response = self._session().get(
            self._object_url(bucket, name),
            params={"fields": "name,size,crc32c,generation"},
            timeout=TIMEOUT_S,
        )
        response.raise_for_status()
        result: dict[str, Any] = response.json()
        return result

    def list(
        self, bucket: str, prefix: str = "", delimiter: str | None = None
    ) -> tuple[list[dict[str, Any]], list[str]]:
        """All objects (and prefixes, with a delimiter) under ``prefix``."""
        items: list[dict[str, Any]] = []
        prefixes: list[str] = []
        params: dict[str, str] = {"prefix": prefix, "fields": _LIST_FIELDS, "maxResults": "1000"}
        if delimiter:
            params["delimiter"] = delimiter
        session = self._session()
        while True:
            response = session.get(
                f"{self.endpoint}/storage/v1/b/{bucket}/o", params=params, timeout=TIMEOUT_S
            )
            response.raise_for_status()
            page = response.json()
            items.extend(page.get("items", []))
            prefixes.extend(page.get("prefixes", []))
            token = page.get("nextPageToken")
            if not token:
                return items, prefixes
            params["pageToken"] = token

    def walk(self, bucket: str) -> builtins.list[dict[str, Any]]:
        """Every object, as ``ls -lR`` would find it: one listing per directory, in parallel."""
        found: builtins.list[dict[str, Any]] = []
        level = [""]
        while level:
            pages = self.map(lambda prefix: self.list(bucket, prefix, "/"), level)
            level = []
            for items, prefixes in pages:
                found.extend(items)
                level.extend(prefixes)
        return found

    def delete(self, bucket: str, name: str) -> None:
        response = self._session().delete(self._object_url(bucket, name), timeout=TIMEOUT_S)
        if response.status_code not in (200, 204, 404):
            response.raise_for_status()

    def delete_all(self, bucket: str, prefix: str = "") -> int:
        items, _ = self.list(bucket, prefix)
        self.map(lambda item: self.delete(bucket, item["name"]), items)
        return len(items)

    def wait_for(
        self,
        bucket: str,
        expected: dict[str, str],
        *,
        prefix: str = "",
        timeout_s: float,
        poll_s: float = 0.01,
    ) -> float:
        """Poll until every name in ``expected`` exists with that CRC32C; the time it took.

        Raises ``TimeoutError`` naming what is still missing or different.
        """
        start = time.monotonic()
        deadline = start + timeout_s
        while True:
            items, _ = self.list(bucket, prefix)
            have = {item["name"]: item.get("crc32c") for item in items}
            missing = [name for name, crc in expected.items() if have.get(name) != crc]
            if not missing:
                return time.monotonic() - start
            if time.monotonic() > deadline:
                wrong = [name for name in missing if name in have]
                if wrong:
                    raise WrongBytes(
                        f"gs://{bucket}/{wrong[0]} (and {len(wrong) - 1} more) still holds"
                        f" other bytes {timeout_s:.0f}s after the writer finished"
                    )
                raise TimeoutError(
                    f"not durable after {timeout_s:.0f}s: {len(missing)} of {len(expected)}"
                    f" objects missing (e.g. gs://{bucket}/{missing[0]})"
                )
            time.sleep(poll_s)
