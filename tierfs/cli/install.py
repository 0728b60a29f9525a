"""``tierfs install-helper``: make ``mount -t tierfs`` and fstab lines work.

mount(8) runs ``/sbin/mount.TYPE SPEC DIR [-sfnv] -o OPTIONS`` for a filesystem
type it does not know, and looks for the helper only in ``/sbin`` (and
``/sbin/fs.d``, ``/sbin/fs``), never on ``PATH``. pip installs the
``mount.tierfs`` console script into the environment's bin directory, so this
writes a two-line shell script into ``/sbin`` that execs that console script
by its absolute path: the helper then runs the exact environment that
installed it, whatever ``PATH`` mount(8) was started with.

A script rather than a symlink, because it carries a marker line: running the
install again is a no-op, a helper written by another tierfs environment is
replaced, and any other file at that path (another tool's helper, a
hand-written wrapper) is never overwritten.
"""

from __future__ import annotations

import os
import shlex
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

DEFAULT_PREFIX = "/sbin"
HELPER_NAME = "mount.tierfs"
MARKER = "# written by 'tierfs install-helper'"
USAGE = "usage: tierfs install-helper [--prefix DIR]   (default DIR: /sbin)"


class InstallError(Exception):
    """The helper cannot be installed; ``str()`` is one line for the user."""


@dataclass(frozen=True)
class Installed:
    path: Path
    target: Path
    changed: bool


def console_script() -> Path:
    """The ``mount.tierfs`` console script next to the running interpreter (not resolved:
    a venv's ``bin/python`` is a symlink to the system interpreter), else next to the
    running ``tierfs`` script: a system-wide ``pip install`` puts the scripts in
    /usr/local/bin while the interpreter is /usr/bin/python3."""
    beside_python = Path(os.path.abspath(sys.executable)).parent / HELPER_NAME
    running = Path(os.path.abspath(sys.argv[0])) if sys.argv and sys.argv[0] else None
    if os.access(beside_python, os.X_OK) or running is None or running.name != "tierfs":
        return beside_python
    beside_script = running.parent / HELPER_NAME
    return beside_script if os.access(beside_script, os.X_OK) else beside_python


def helper_text(target: Path) -> str:
    return (
        "#!/bin/sh\n"
        f"{MARKER}: mount(8) runs this for type tierfs.\n"
        f'exec {shlex.quote(str(target))} "$@"\n'
    )


def install_helper(prefix: str | os.PathLike[str] = DEFAULT_PREFIX) -> Installed:
    """Write ``PREFIX/mount.tierfs`` pointing at this environment's console script.

    Idempotent; replaces only a helper this command wrote before (or a symlink to the
    same console script); raises `InstallError` for anything else at that path.
    """
    target = console_script()
    if not os.access(target, os.X_OK):
        raise InstallError(
            f"{target} is missing or not executable: install tierfs in this environment first"
        )
    directory = Path(prefix)
    path = directory / HELPER_NAME
    text = helper_text(target)
    if os.path.lexists(path):
        if path.is_symlink():
            if os.path.realpath(path) != os.path.realpath(target):
                raise InstallError(
                    f"{path} exists and is not tierfs's helper (a symlink to"
                    f" {os.readlink(path)}): remove it first"
                )
        else:
            current = _read_text(path)
            if current == text and os.access(path, os.X_OK):
                return Installed(path, target, changed=False)
            if current is None or MARKER not in current:
                raise InstallError(f"{path} exists and is not tierfs's helper: remove it first")
    try:
        directory.mkdir(parents=True, exist_ok=True)
        fd, temporary = tempfile.mkstemp(prefix=f".{HELPER_NAME}.", dir=directory)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as stream:
                stream.write(text)
            os.chmod(temporary, 0o755)
            os.replace(temporary, path)
        except BaseException:
            os.unlink(temporary)
            raise
    except OSError as err:
        where = err.filename or directory
        raise InstallError(f"cannot write {path}: {where}: {err.strerror}") from None
    return Installed(path, target, changed=True)


def _read_text(path: Path) -> str | None:
    """The file's text, or None if it is not a small readable text file."""
    try:
        if not path.is_file() or path.stat().st_size > 64 * 1024:
            return None
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return None


def main(argv: list[str]) -> int:
    """``tierfs install-helper [--prefix DIR]``: 0 installed or unchanged, 1 refused, 2 usage."""
    prefix = DEFAULT_PREFIX
    args = list(argv)
    while args:
        arg = args.pop(0)
        if arg in ("-h", "--help"):
            print(USAGE)
            return 0
        if arg == "--prefix" and args:
            prefix = args.pop(0)
        elif arg.startswith("--prefix="):
            prefix = arg.partition("=")[2]
        else:
            print(f"tierfs: {USAGE}", file=sys.stderr)
            return 2
    if not prefix:
        print(f"tierfs: {USAGE}", file=sys.stderr)
        return 2
    try:
        done = install_helper(prefix)
    except InstallError as err:
        print(f"tierfs: {err}", file=sys.stderr)
        return 1
    state = "installed" if done.changed else "already installed"
    print(f"{state}: {done.path} -> {done.target}")
    return 0
