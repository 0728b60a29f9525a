"""``tierfs csi``: the plugin's command line, its gRPC server on a unix socket, its shutdown.

The socket is the plugin's whole attack surface (whoever reaches it mounts
anything below the kubelet root as root), so it is created 0600: the process
umask is 077 from the start (no window in which the socket, or a file under the
state directory, is readable by others) and the socket is chmod-ed 0600 once
bound. A socket file left by a previous run is replaced.

SIGTERM/SIGINT stop the gRPC server; the volume daemons run in their own
sessions and keep their mounts served (in a container they end with it; a
plugin started again recognises its mounts by their records, see
`tierfs.csi.node`).
"""

from __future__ import annotations

import argparse
import logging
import math
import os
import signal
import stat
import sys
import threading
from concurrent import futures
from pathlib import Path
from types import FrameType
from typing import NoReturn

import grpc

from tierfs.cli.logs import JsonFormatter
from tierfs.cli.main import UsageError
from tierfs.csi.identity import DRIVER_NAME, Controller, Identity
from tierfs.csi.node import Node, NodeSettings
from tierfs.csi.proto import csi_pb2_grpc

log = logging.getLogger("tierfs.csi")
WORKERS = 8


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # one line (tierfs.cli.main), never usage + exit
        raise UsageError(f"csi: {message} (try 'tierfs csi --help')")


def positive_seconds(text: str) -> float:
    """A finite number of seconds above 0: 0 made the control socket non-blocking (every
    unpublish UNAVAILABLE), a negative one or nan made settimeout/select raise ValueError
    (every publish INTERNAL)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, not {text!r}") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"expected a number of seconds above 0, not {text!r}")
    return value


def parser() -> argparse.ArgumentParser:
    p = _Parser(prog="tierfs csi", description="A Kubernetes CSI node plugin serving tierfs.")
    p.add_argument("--endpoint", default="unix:///csi/csi.sock", help="unix:///PATH of the socket")
    p.add_argument("--node-id", required=True, help="this node's name (NodeGetInfo)")
    p.add_argument(
        "--kubelet-root", default="/var/lib/kubelet", type=Path, help="targets must lie below it"
    )
    p.add_argument(
        "--state-dir",
        default="/var/lib/tierfs-csi",
        type=Path,
        help="per-volume cache, temp and write-back directories (0700)",
    )
    p.add_argument("--driver-name", default=DRIVER_NAME, help="the name GetPluginInfo answers")
    p.add_argument(
        "--metrics-address",
        default="",
        help="HOST:PORT serving every volume's Prometheus metrics, labelled volume_id",
    )
    p.add_argument(
        "--upload-timeout-s",
        type=positive_seconds,
        default=90.0,
        help="how long NodeUnpublishVolume waits for written data to reach GCS",
    )
    p.add_argument(
        "--start-timeout-s",
        type=positive_seconds,
        default=120.0,
        help="how long NodePublishVolume waits for a daemon that says nothing while it starts",
    )
    p.add_argument("--log-severity", default="info", choices=["debug", "info", "warning", "error"])
    return p


MAX_SOCKET_PATH = 107  # bytes in sockaddr_un.sun_path, less the terminating NUL


def socket_path(endpoint: str) -> Path:
    if not endpoint.startswith("unix://"):
        raise UsageError(f"csi: --endpoint must be unix:///PATH, not '{endpoint}'")
    path = endpoint.removeprefix("unix://")
    if not path.startswith("/"):
        raise UsageError(f"csi: --endpoint needs an absolute path: '{endpoint}'")
    if len(os.fsencode(path)) > MAX_SOCKET_PATH:
        raise UsageError(
            f"csi: --endpoint {path} is longer than {MAX_SOCKET_PATH} bytes, "
            "the limit for a unix socket"
        )
    return Path(path)


class _Unusable(Exception):
    """A local path the plugin cannot use; ``str()`` is the line for the user."""


def prepare_endpoint(path: Path) -> None:
    """Make the socket's directory and clear a socket left by a previous run; a path that
    is something else (a regular file, a directory) is not replaced but refused: gRPC's
    bind failed on it with a C-core log line and a vague second one."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        mode = path.lstat().st_mode
    except FileNotFoundError:
        return
    except OSError as err:
        raise _Unusable(f"cannot use --endpoint {path}: {err.strerror or err}") from None
    if not stat.S_ISSOCK(mode):
        raise _Unusable(f"cannot use --endpoint {path}: it exists and is not a socket")
    path.unlink()


def prepare_state_dir(path: Path) -> None:
    try:
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError as err:  # (a file on the way, /proc: NotADirectoryError, "internal error")
        raise _Unusable(f"cannot use --state-dir {path}: {err.strerror or err}") from None


def setup_logging(severity: str) -> None:
    logger = logging.getLogger("tierfs.csi")
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter())
    logger.addHandler(handler)
    logger.setLevel(severity.upper())
    logger.propagate = False


def run(argv: list[str]) -> int:
    p = parser()
    args = p.parse_args(argv)
    if not args.node_id.strip():  # (kubelet cannot register a node plugin without one)
        p.error("--node-id must not be empty")
    if not args.driver_name.strip():
        p.error("--driver-name must not be empty")
    path = socket_path(args.endpoint)
    if args.metrics_address:
        from tierfs.csi.metrics import parse_address

        try:
            parse_address(args.metrics_address)
        except ValueError as err:
            raise UsageError(f"csi: bad --metrics-address: {err}") from None
    os.umask(0o077)
    setup_logging(args.log_severity)
    settings = NodeSettings(
        node_id=args.node_id,
        kubelet_root=args.kubelet_root,
        state_dir=args.state_dir,
        start_timeout_s=args.start_timeout_s,
        upload_timeout_s=args.upload_timeout_s,
    )
    try:
        prepare_state_dir(args.state_dir)
        prepare_endpoint(path)
    except _Unusable as err:
        print(f"tierfs: csi: {err}", file=sys.stderr)
        return 1
    node = Node(settings, metrics=bool(args.metrics_address))
    exporter = None
    if args.metrics_address:
        from tierfs.csi.metrics import serve_metrics

        try:
            exporter = serve_metrics(args.metrics_address, node)
        except OSError as err:
            print(
                f"tierfs: csi: cannot serve metrics on {args.metrics_address}: {err}",
                file=sys.stderr,
            )
            return 1
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=WORKERS))
    csi_pb2_grpc.add_IdentityServicer_to_server(Identity(args.driver_name), server)
    csi_pb2_grpc.add_NodeServicer_to_server(node, server)
    csi_pb2_grpc.add_ControllerServicer_to_server(Controller(), server)
    try:
        server.add_insecure_port(f"unix://{path}")
    except RuntimeError as err:
        print(f"tierfs: csi: cannot listen on {path}: {err}", file=sys.stderr)
        return 1
    server.start()
    os.chmod(path, 0o600)
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, on_signal)
    log.info(
        "tierfs CSI node plugin %s serving on %s (node %s)", args.driver_name, path, args.node_id
    )
    stop.wait()
    log.info("stopping (mounts stay served by their daemons)")
    server.stop(grace=5).wait()
    if exporter is not None:
        exporter.close()
    if path.is_socket():
        path.unlink()
    return 0
