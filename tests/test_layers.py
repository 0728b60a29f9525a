"""The import rules of docs/architecture.md, checked on the source (no import is run)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# The layers, lowest first (tierfs/errors.py, the errors every layer raises and the one
# errno table, is below them all): a module may import tierfs modules of its own layer and the
# ones below it, never above. The command line and the composition root (tierfs/*.py at
# the top: mount, settings, metrics) are one layer: the root runs what the command asks;
# tierfs/csi (the Kubernetes node plugin, a command of its own) is part of it.
LAYERS = ["errors", "storage", "cache", "core", "fuse", "top"]
# The only tierfs modules that may read the option language: everything below them takes
# plain settings from tierfs/settings.py.
READS_OPTIONS = {
    "cli/main.py",
    "mount.py",
    "settings.py",
    "cli/logs.py",
    "cli/emulator.py",
    "csi/volume.py",
}
FUSE_ADAPTER = {"fuse/operations.py", "fuse/interrupts.py", "fuse/kernel.py", "mount.py"}
GOOGLE = {  # GcsBucket and its parts, and the emulator helper
    "storage/gcs.py",
    "storage/gcs_auth.py",
    "storage/gcs_body.py",
    "storage/gcs_errors.py",
    "storage/gcs_read.py",
    "storage/gcs_resource.py",
    "storage/gcs_upload.py",
    "storage/retry.py",
    "cli/emulator.py",
}


def layer_of(module: str) -> str:
    """The layer of a module named as imported (``tierfs.core.blocks``) or as a path
    below tierfs/ (``core/blocks.py``)."""
    parts = module.removeprefix("tierfs.").replace("/", ".").split(".")
    return parts[0] if parts[0] in LAYERS else "top"


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


@pytest.mark.parametrize("path", modules("tierfs"), ids=rel)
def test_each_layer_imports_only_itself_and_the_layers_below(path: Path) -> None:
    own = LAYERS.index(layer_of(rel(path)))
    above = sorted(
        name
        for name in imported(path)
        if name.split(".")[0] == "tierfs"
        and name != "tierfs"
        and LAYERS.index(layer_of(name)) > own
    )
    assert not above, f"{rel(path)} ({LAYERS[own]}) imports {above}, a layer above it"


def test_the_layers_are_folders() -> None:
    """Every module of the adapter, the core, the tiers and storage is in its folder, and
    nothing but the composition root is left at the top."""
    top = sorted(p.name for p in (ROOT / "tierfs").glob("*.py"))
    assert top == [
        "__init__.py",
        "__main__.py",
        "errors.py",
        "metrics.py",
        "mount.py",
        "settings.py",
    ]
    assert {
        p.name for p in (ROOT / "tierfs").iterdir() if p.is_dir() and p.name != "__pycache__"
    } == {"cache", "cli", "core", "csi", "fuse", "storage"}


def test_the_rules_see_the_modules_they_name() -> None:
    """A renamed module must not leave a rule that checks nothing."""
    present = {rel(p) for p in modules("tierfs")}
    assert READS_OPTIONS | FUSE_ADAPTER | GOOGLE <= present
