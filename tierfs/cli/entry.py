"""The console scripts' entry points (``tierfs``, ``mount.tierfs``).

Why a module of their own: the command line's modules take about 0.3 s to load (trio is
half of it), and a Ctrl-C meanwhile printed a Python traceback instead of the one line a
Ctrl-C later gets (`tierfs.cli.main`). This module loads nothing heavy before it can say
"interrupted".
"""

from __future__ import annotations

import sys
from importlib import import_module
from typing import Any

PROG = "tierfs"


def _load() -> Any:
    try:
        return import_module("tierfs.cli.main")
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted", file=sys.stderr)
        raise SystemExit(130) from None


def main() -> None:
    _load().main()


def mount_helper_main() -> None:
    _load().mount_helper_main()
