"""Every workload and every system by name, in the order `make bench` runs them."""

from __future__ import annotations

from benchmarks.metadata import Metadata
from benchmarks.multiread import MultiRead
from benchmarks.reads import RandRead, SeqRead
from benchmarks.saves import Create, DcpSave, OrbaxSave, Remove
from benchmarks.systems import GcsDirect, LocalDir, NullFuse, Rclone, System, Tmpfs
from benchmarks.tierfs_systems import (
    Tierfs,
    TierfsCheckpoint,
    TierfsCheckpointSerial,
    TierfsListCache,
    TierfsStaged,
    TierfsStream64,
    TierfsWriteBack,
    TierfsWriteBackDaemon,
    TierfsWriteBackHeld,
    TierfsWriteBackTmpfs,
)
from benchmarks.workloads import Workload
from benchmarks.writes import BigWrite, Checkpoint, SeqWrite

WORKLOADS: dict[str, type[Workload]] = {
    cls.name: cls
    for cls in (
        SeqWrite,
        SeqRead,
        MultiRead,
        RandRead,
        Metadata,
        Create,
        Checkpoint,
        BigWrite,
        OrbaxSave,
        DcpSave,
        Remove,
    )
}

SYSTEMS: dict[str, type[System]] = {
    cls.name: cls
    for cls in (
        Tierfs,
        TierfsCheckpoint,
        TierfsCheckpointSerial,
        TierfsListCache,
        TierfsStaged,
        TierfsStream64,
        TierfsWriteBack,
        TierfsWriteBackDaemon,
        TierfsWriteBackTmpfs,
        TierfsWriteBackHeld,
        Rclone,
        NullFuse,
        GcsDirect,
        LocalDir,
        Tmpfs,
    )
}
# Run by `make bench` (and --quick); any other on request (--systems).
DEFAULT_SYSTEMS = (
    "tierfs",
    "tierfs-ckpt",
    "tierfs-ckpt-serial",
    "tierfs-lists",
    "tierfs-staged",
    "tierfs-stream64",
    "tierfs-wb",
    "tierfs-wb-daemon",
    "tierfs-wb-tmpfs",
    "tierfs-wb-held",
    "rclone",
    "pyfuse3-null",
    "gcs-direct",
    "local",
    "tmpfs",
)
