"""``tierfs csi``: a Kubernetes CSI node plugin serving tierfs volumes (docs/kubernetes.md).

`main` is the one entry point (``tierfs csi ...`` in `tierfs.cli.main`); the gRPC
machinery is imported only when it runs, so the rest of tierfs never loads grpcio.
"""

from __future__ import annotations


def main(argv: list[str]) -> int:
    """Run the plugin until SIGTERM/SIGINT; the exit status (2: bad usage, one line)."""
    from tierfs.csi.server import run

    return run(argv)
