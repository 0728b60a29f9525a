"""Every workload by name, in the order `make bench` runs them."""

from __future__ import annotations

from benchmarks.saves import Create, DcpSave, OrbaxSave, Remove
from benchmarks.workloads import (
    BigWrite,
    Checkpoint,
    Metadata,
    RandRead,
    SeqRead,
    SeqWrite,
    Workload,
)

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
