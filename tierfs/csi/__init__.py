"""``tierfs csi``: a Kubernetes CSI node plugin serving tierfs volumes (docs/kubernetes.md).

`main` is the one entry point (``tierfs csi ...`` in `tierfs.cli.main`); the gRPC
machinery is imported only when it runs, so the rest of tierfs never loads grpcio.
"""

from __future__ import annotations


def main(argv: list[str]) -> int:
    """Run the plugin until SIGTERM/SIGINT; the exit status (2: bad usage, one line)."""
    import os

    # gRPC's C core logs a failed bind on stderr itself, in its own format, before the
    # one line the plugin prints; the plugin's JSON log says what matters.
    os.environ.setdefault("GRPC_VERBOSITY", "NONE")
    from tierfs.csi.server import run

    return run(argv)
