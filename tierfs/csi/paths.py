"""Where the plugin may mount, and where each volume keeps its local files.

A target path comes from the kubelet, but the plugin runs privileged and mounts
whatever path it is given, so it checks: the path must be absolute and, once
``..`` and every symlink are resolved, lie strictly below the kubelet root
(itself resolved, so a kubelet root that is a symlink still works). The
resolved path is what gets mounted, so a symlink swapped in after the check
cannot redirect the mount elsewhere below the root either.

Each published target gets a volume directory ``STATE/volumes/NAME`` (0700,
its parents too): its cache, temp and write-back directories and, while it is
published, the service-account key (0600). NAME is readable (the volume id,
made safe) and unique per target (a hash of it), since one PV can be published
to several pods on a node and each publish has its own daemon.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
from pathlib import Path
from typing import Any

from tierfs.cli.mountpoint import mounted_here

RECORD = "volume.json"


class OutsideRoot(ValueError):
    """A target path that is not below the kubelet root (PERMISSION_DENIED)."""


def resolve_target(target: str, kubelet_root: Path) -> Path:
    """The target with ``..`` and symlinks resolved; `OutsideRoot` unless below the root."""
    if not os.path.isabs(target):
        raise OutsideRoot(f"target path '{target}' is not absolute")
    root = kubelet_root.resolve()
    parent, name = os.path.split(os.path.normpath(target))
    resolved = Path(os.path.realpath(parent)) / name
    if mounted_here(str(resolved)) is None:
        # Not a mount: its last part may be a symlink (followed by mount(2)): resolved too.
        # A mount is never looked up: its daemon may not answer, and the lstat would wait.
        resolved = Path(os.path.realpath(resolved))
    if resolved == root or root not in resolved.parents:
        raise OutsideRoot(f"target path '{target}' is outside the kubelet root {root}")
    return resolved


def private_dir(path: Path) -> Path:
    """Make ``path`` (and missing parents) 0700, whatever the umask; an existing one too."""
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(path, 0o700)
    return path


def _safe(volume_id: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", volume_id)[:64] or "volume"


def volume_dir(state_dir: Path, volume_id: str, target: Path) -> Path:
    digest = hashlib.sha256(str(target).encode()).hexdigest()[:16]
    return state_dir / "volumes" / f"{_safe(volume_id)}-{digest}"


def adopt_left_journal(state_dir: Path, volume_id: str, directory: Path) -> Path | None:
    """Give ``directory`` (a volume about to be mounted with write-back, on a new target)
    the write-back journal an unpublish of the same volume left on another target: data
    not in GCS yet, which its daemon, dead or stuck, could not upload. A new pod's target
    is a new directory, where no daemon would ever look for it; here the next daemon's
    recovery uploads it. Only from a directory with no record (not published) and only
    into one with no journal yet. The directory it came from, or None."""
    if (directory / "write-back").exists():
        return None
    name = re.compile(re.escape(_safe(volume_id)) + r"-[0-9a-f]{16}")
    for other in sorted((state_dir / "volumes").glob("*")):
        if other == directory or not name.fullmatch(other.name) or (other / RECORD).exists():
            continue
        if not has_pending_writes(other):
            continue
        os.replace(other / "write-back", directory / "write-back")
        shutil.rmtree(other, ignore_errors=True)
        return other
    return None


def write_private(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` created 0600 (never readable by others, even for an instant),
    replacing an older file atomically."""
    partial = path.with_name(path.name + ".partial")
    with contextlib.suppress(FileNotFoundError):
        partial.unlink()
    fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as stream:
        stream.write(text)
    os.replace(partial, path)


def write_record(directory: Path, record: dict[str, Any]) -> None:
    write_private(directory / RECORD, json.dumps(record, sort_keys=True))


def read_record(directory: Path) -> dict[str, Any] | None:
    try:
        value = json.loads((directory / RECORD).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return value if isinstance(value, dict) else None


def has_pending_writes(directory: Path) -> bool:
    """Whether the write-back directory holds data a later daemon would recover, or a
    conflict kept for the user: any file but a journal's lock (a journal drained clean
    keeps its directories and its lock file)."""
    staged = directory / "write-back"
    return staged.is_dir() and any(
        path.is_file() and path.suffix != ".lock" for path in staged.rglob("*")
    )


def remove_volume_dir(directory: Path, *, keep_write_back: bool = False) -> None:
    """Remove a volume's files: the key first, then everything (the write-back journal kept
    when asked: it holds data not yet in GCS)."""
    with contextlib.suppress(FileNotFoundError):
        (directory / "key.json").unlink()
    if keep_write_back:
        for child in directory.iterdir() if directory.is_dir() else ():
            if child.name != "write-back":
                _remove(child)
        return
    shutil.rmtree(directory, ignore_errors=True)


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
