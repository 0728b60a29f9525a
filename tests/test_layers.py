"""The import rules of docs/architecture.md, checked on the source (no import is run)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# The command line and the composition root: the only tierfs modules that may read the
# option language (everything below them takes plain settings from tierfs/settings.py).
READS_OPTIONS = {"cli.py", "mount.py", "settings.py", "logs.py", "emulator.py", "csi/volume.py"}
FUSE_ADAPTER = {"operations.py", "interrupts.py", "mount.py", "passthrough.py"}
GOOGLE = {  # GcsBucket and its parts, and the emulator helper
    "storage/gcs.py",
    "storage/gcs_auth.py",
    "storage/gcs_errors.py",
    "storage/gcs_upload.py",
    "storage/retry.py",
    "emulator.py",
}


def imported(path: Path) -> set[str]:
    """Top-level package names this module imports (at any depth of the file)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module)
    return names


def modules(package: str) -> list[Path]:
    return sorted((ROOT / package).rglob("*.py"))


def rel(path: Path) -> str:
    return path.relative_to(ROOT / "tierfs").as_posix()


@pytest.mark.parametrize("path", modules("mount_options"), ids=lambda p: p.name)
def test_the_option_language_imports_nothing_of_tierfs(path: Path) -> None:
    assert not {n for n in imported(path) if n.split(".")[0] == "tierfs"}


@pytest.mark.parametrize("path", modules("tierfs"), ids=rel)
def test_below_the_composition_root_nothing_reads_mount_options(path: Path) -> None:
    uses = {n for n in imported(path) if n.split(".")[0] == "mount_options"}
    if rel(path) not in READS_OPTIONS:
        assert not uses, f"{rel(path)} imports {uses}: take plain settings from tierfs/settings.py"


@pytest.mark.parametrize("path", modules("tierfs"), ids=rel)
def test_pyfuse3_and_google_stay_at_their_edges(path: Path) -> None:
    # google.protobuf is the CSI plugin's gRPC messages, not the GCS SDK
    names = {n.split(".")[0] for n in imported(path) if not n.startswith("google.protobuf")}
    if "pyfuse3" in names:
        assert rel(path) in FUSE_ADAPTER, f"{rel(path)} imports pyfuse3"
    if "google" in names:
        assert rel(path) in GOOGLE, f"{rel(path)} imports google.*"


def test_the_rules_see_the_modules_they_name() -> None:
    """A renamed module must not leave a rule that checks nothing."""
    present = {rel(p) for p in modules("tierfs")}
    assert READS_OPTIONS | FUSE_ADAPTER | GOOGLE <= present
