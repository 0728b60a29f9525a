"""``python -m tierfs``: the same as the ``tierfs`` command (the daemon starts itself this way).

The mount daemon (``mount ... --foreground``, how `tierfs.cli.daemon` and the CSI plugin
start it) never speaks gRPC, but google-api-core imports grpc whenever it is installed,
and it is, for the CSI plugin: 9 MiB of the daemon's resident memory (measured: 68 -> 59
MiB after imports), inside the RAM tier's 100 MiB of overhead. A None in `sys.modules`
makes that import fail as if grpc were absent, which api-core is written to handle.
"""

import sys

if sys.argv[1:2] == ["mount"] and "--foreground" in sys.argv:
    sys.modules["grpc"] = None  # type: ignore[assignment]

from tierfs.cli.entry import main

main()
