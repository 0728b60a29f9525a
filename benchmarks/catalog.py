"""Every workload by name, in the order `make bench` runs them."""

from __future__ import annotations

from benchmarks.metadata import Metadata
from benchmarks.reads import RandRead, SeqRead
from benchmarks.saves import Create, DcpSave, OrbaxSave, Remove
from benchmarks.workloads import Workload
from benchmarks.writes import BigWrite, Checkpoint, SeqWrite

WORKLOADS: dict[str, type[Workload]] = {
    cls.name: cls
    for cls in (
        SeqWrite,
        SeqRead,
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
