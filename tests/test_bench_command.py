"""A benchmark report names the command that reproduces it: a run with workloads or
systems of its own is not `make bench` (one report said so of a targeted run)."""

from __future__ import annotations

from benchmarks.__main__ import _command


def test_a_report_names_the_make_target_only_for_a_run_made_by_it() -> None:
    assert _command("full", []) == "make bench"
    assert _command("quick", ["--quick"]) == "make bench-quick"
    targeted = ["--workloads", "ckpt,dcp", "--systems", "tierfs-wb,local"]
    assert _command("full", targeted) == (
        "python -m benchmarks --workloads ckpt,dcp --systems tierfs-wb,local"
    )
