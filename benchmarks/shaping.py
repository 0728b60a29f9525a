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
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time

DEFAULT_DELAY_S = 0.020
DEFAULT_RATE_BYTES_S = 200_000_000
_CHUNK = 256 * 1024
_BURST_S = 0.002


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
                        self.proxy.requests += 1
                        time.sleep(self.proxy.delay_s)
                else:
                    self.awaiting_request = True
                bucket.take(n)
                dst.sendall(view[:n])
                if request_side:
                    self.proxy.bytes_up += n
                else:
                    self.proxy.bytes_down += n
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


class ShapingProxy:
    """``ShapingProxy(("127.0.0.1", emulator_port)).start()``; ``.endpoint``; ``.stop()``."""

    def __init__(
        self,
        upstream: tuple[str, int],
        *,
        delay_s: float = DEFAULT_DELAY_S,
        rate_bytes_s: float = DEFAULT_RATE_BYTES_S,
    ) -> None:
        self.upstream = upstream
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
