"""A GCS-shaped link in front of the emulator: a TCP proxy on 127.0.0.1.

Why: the emulator answers from RAM in about 1.5 ms at over 2 GB/s; real GCS
takes tens of ms to the first byte and gives roughly 100-300 MB/s per stream.
Caches, read-ahead and parallel requests only show their worth against the
second kind of link, so every workload also runs through this proxy.

What it does, per TCP connection, in both directions:

- **Latency per HTTP request, not per connection.** A keep-alive connection
  carries many requests; each must pay the delay. The proxy does not parse
  HTTP: a request is "new" when client bytes arrive after the server has sent
  something since the previous request (or on a fresh connection). Those first
  bytes are held for ``delay_s`` before they are forwarded; the rest of a
  request body (an upload) flows without further delay. HTTP/1.1 clients
  (requests, Go's net/http) never send the next request before the previous
  response started, so this is exact for them.
- **A bandwidth cap per connection** (a token bucket per direction), so one
  stream cannot exceed ``rate_bytes_s`` but N parallel streams get N times it,
  as on GCS.

Threads, not asyncio: the pumps spend their time in ``recv_into``/``sendall``,
which release the GIL, so a few threads per connection move GB/s with little
CPU, and a blocked peer never stalls other connections.

The alternative, ``tc netem`` inside a network namespace, shapes packets, not
requests, and has no per-connection rate; the proxy needs no privileges and
leaves nothing behind but its threads.

**Faults** (the test suite's, ``tests/faults.py``): given ``faults``, a callable
that sees each request's method and target (``"GET"``, ``"/storage/v1/b/..."``)
and returns an action or None, the proxy answers that request itself with an
HTTP error status (draining what the client still sends, then closing), resets
the connection, forwards only part of the response, or holds the response back
for a while: the faults a client meets on a real link, at the HTTP level, in
front of the real emulator.
"""

from __future__ import annotations

import contextlib
import socket
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

DEFAULT_DELAY_S = 0.020
DEFAULT_RATE_BYTES_S = 200_000_000
_CHUNK = 256 * 1024
_BURST_S = 0.002


@dataclass(frozen=True)
class Action:
    """What the proxy does to one request instead of passing it through untouched.

    ``status``: answer it with this HTTP status (not forwarded). ``reset``: close the
    connection with a TCP reset (not forwarded). ``truncate``: forward it, then pass on
    only the response's first bytes (its head and half of what came with it) and reset.
    ``stall_s``: forward it, and hold the response back this long before passing it on.
    ``hold_after``: pass on this many bytes of the response (its head included), then
    hold the rest until ``release`` is set (a test sees what a client does with a
    response half come, for as long as it looks).
    """

    status: int = 0
    reset: bool = False
    truncate: bool = False
    stall_s: float = 0.0
    hold_after: int = 0
    release: threading.Event | None = None


Faults = Callable[[str, str], Action | None]
_HEAD_LIMIT = 16 * 1024


def _abort(sock: socket.socket) -> None:
    """End the connection at once with a TCP reset (SO_LINGER 0), as a crashed peer or a
    middlebox would. shutdown() first: a close() alone does not wake the other pump
    thread blocked reading this socket, and until it wakes nothing is sent."""
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)
    sock.close()


def _error_response(status: int) -> bytes:
    body = b'{"error":{"code":%d,"message":"injected by the fault proxy"}}' % status
    return (
        b"HTTP/1.1 %d Injected\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\nConnection: close\r\n\r\n" % (status, len(body))
    ) + body


class _Bucket:
    """A token bucket: ``take(n)`` sleeps as long as sending ``n`` bytes requires."""

    def __init__(self, rate_bytes_s: float) -> None:
        self.rate = rate_bytes_s
        self.next_free = 0.0

    def take(self, n: int) -> None:
        now = time.monotonic()
        # An idle connection may send a small burst at once, never a backlog of credit.
        self.next_free = max(self.next_free, now - _BURST_S) + n / self.rate
        wait = self.next_free - now
        if wait > 0:
            time.sleep(wait)


class _Link:
    """One proxied connection: two pump threads sharing the "response seen" flag."""

    def __init__(self, proxy: ShapingProxy, client: socket.socket) -> None:
        self.proxy = proxy
        self.client = client
        self.upstream = socket.create_connection(proxy.upstream, timeout=None)
        for sock in (client, self.upstream):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.awaiting_request = True  # the next client bytes start a new request
        self.closed = threading.Event()
        self.action: Action | None = None  # the current request's, for the response side
        self.hold: tuple[int, threading.Event] | None = None  # (bytes left to pass, release)

    def start(self) -> None:
        for target in (self._requests, self._responses):
            threading.Thread(target=target, daemon=True, name="shaping-pump").start()

    def _requests(self) -> None:
        self._pump(self.client, self.upstream, request_side=True)

    def _responses(self) -> None:
        self._pump(self.upstream, self.client, request_side=False)

    def _pump(self, src: socket.socket, dst: socket.socket, *, request_side: bool) -> None:
        bucket = _Bucket(self.proxy.rate_bytes_s)
        buffer = bytearray(_CHUNK)
        view = memoryview(buffer)
        try:
            while True:
                n = src.recv_into(buffer)
                if n == 0:
                    break
                if request_side:
                    if self.awaiting_request:
                        self.awaiting_request = False
                        # (no pipelining: the last response is whole; a hold it did not
                        # reach is not the next one's)
                        self.hold = None
                        self.proxy.requests += 1
                        time.sleep(self.proxy.delay_s)
                        if self.proxy.faults is not None:
                            head = self._fault(src, bytes(view[:n]))
                            if head is None:
                                return
                            if len(head) > n:  # read on to see the request line
                                bucket.take(len(head))
                                dst.sendall(head)
                                self.proxy.bytes_up += len(head)
                                continue
                else:
                    self.awaiting_request = True
                    action, self.action = self.action, None
                    if action is not None and action.stall_s:
                        time.sleep(action.stall_s)
                    if action is not None and action.truncate:
                        head = bytes(view[:n])
                        cut = head.find(b"\r\n\r\n")
                        cut = n // 2 if cut < 0 else cut + 4 + (n - cut - 4) // 2
                        dst.sendall(view[:cut])
                        _abort(dst)
                        return
                    if action is not None and action.release is not None:
                        self.hold = (action.hold_after, action.release)
                    if self.hold is not None:
                        n = self._held(view, n, dst, bucket)
                bucket.take(n)
                # Counted before it is sent: counted after, a client could have the whole
                # answer before the count did (a test read 0 bytes down for its answer).
                if request_side:
                    self.proxy.bytes_up += n
                else:
                    self.proxy.bytes_down += n
                dst.sendall(view[:n])
        except OSError:
            pass
        finally:
            # Half-close so the peer sees EOF; the second pump to finish closes both.
            with contextlib.suppress(OSError):
                dst.shutdown(socket.SHUT_WR)
            if self.closed.is_set():
                self.client.close()
                self.upstream.close()
            else:
                self.closed.set()

    def _held(self, view: memoryview, n: int, dst: socket.socket, bucket: _Bucket) -> int:
        """`Action.hold_after`: pass on what comes before the mark, then wait for the
        release, with the rest of this chunk moved to the front of ``view``; how many
        bytes there are to send now."""
        assert self.hold is not None
        left, release = self.hold
        if n < left:
            self.hold = (left - n, release)
            return n
        bucket.take(left)
        self.proxy.bytes_down += left  # (before it is sent, as in `_pump`)
        dst.sendall(view[:left])
        self.hold = None
        release.wait()
        view[: n - left] = view[left:n]
        return n - left

    def _fault(self, src: socket.socket, head: bytes) -> bytes | None:
        """Ask the proxy's ``faults`` about the request that starts with ``head`` (read on
        until its request line is whole); None when the request was answered here and the
        link is done, else the bytes to forward."""
        while b"\r\n" not in head and len(head) < _HEAD_LIMIT:
            more = src.recv(_HEAD_LIMIT)
            if not more:
                break
            head += more
        method, _, rest = head.partition(b" ")
        target = rest.partition(b" ")[0]
        assert self.proxy.faults is not None
        action = self.proxy.faults(method.decode("latin-1"), target.decode("latin-1"))
        if action is None:
            return head
        self.proxy.faults_injected += 1
        if action.reset:
            _abort(self.client)
            _abort(self.upstream)
            return None
        if action.status:
            self.client.sendall(_error_response(action.status))
            self.client.settimeout(5)
            with contextlib.suppress(OSError):  # let the client finish sending its body
                while self.client.recv(_CHUNK):
                    pass
            self.client.close()
            self.upstream.close()
            return None
        self.action = action
        return head


class ShapingProxy:
    """``ShapingProxy(("127.0.0.1", emulator_port)).start()``; ``.endpoint``; ``.stop()``."""

    def __init__(
        self,
        upstream: tuple[str, int],
        *,
        delay_s: float = DEFAULT_DELAY_S,
        rate_bytes_s: float = DEFAULT_RATE_BYTES_S,
        faults: Faults | None = None,
    ) -> None:
        self.upstream = upstream
        self.faults = faults
        self.faults_injected = 0
        self.delay_s = delay_s
        self.rate_bytes_s = rate_bytes_s
        self.requests = 0
        self.bytes_up = 0
        self.bytes_down = 0
        self._listener: socket.socket | None = None
        self._thread: threading.Thread | None = None

    @property
    def endpoint(self) -> str:
        assert self._listener is not None, "proxy not started"
        host, port = self._listener.getsockname()[:2]
        return f"http://{host}:{port}"

    def describe(self) -> str:
        return (
            f"+{self.delay_s * 1000:.0f} ms per request,"
            f" {self.rate_bytes_s / 1e6:.0f} MB/s per connection"
        )

    def start(self) -> ShapingProxy:
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", 0))
        listener.listen(512)
        self._listener = listener
        self._thread = threading.Thread(target=self._accept, daemon=True, name="shaping-accept")
        self._thread.start()
        return self

    def _accept(self) -> None:
        assert self._listener is not None
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            try:
                _Link(self, client).start()
            except OSError:
                client.close()

    def stop(self) -> None:
        listener, self._listener = self._listener, None
        if listener is not None:
            with contextlib.suppress(OSError):
                listener.shutdown(socket.SHUT_RDWR)
            listener.close()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None
