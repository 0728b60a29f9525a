"""``python -m tierfs``: the same as the ``tierfs`` command (the daemon starts itself this way)."""

from tierfs.cli.main import main

main()
