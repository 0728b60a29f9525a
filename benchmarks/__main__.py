"""``python -m benchmarks [--quick] [--profiles plain,shaped] [--systems ...] [--workloads ...]``.

Starts the embedded emulator and the shaping proxy, runs every cell, prints
the table and writes ``benchmarks/results/bench-{quick,full}.{json,md,png}``.
Exit status: 0 when every cell that could run did; 1 when bytes read back
were wrong or a mount hung; 2 for bad arguments.
"""

from __future__ import annotations

import argparse
import dataclasses
import shlex
import sys
import time
from collections.abc import Mapping
from pathlib import Path

from benchmarks import report
from benchmarks.catalog import DEFAULT_SYSTEMS, SYSTEMS, WORKLOADS
from benchmarks.env import FULL, PROFILES, QUICK, Env, Sizes
from benchmarks.runner import Runner

RESULTS = Path(__file__).resolve().parent / "results"


def _names(text: str, known: Mapping[str, object] | tuple[str, ...], what: str) -> list[str]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in known]
    if unknown:
        raise SystemExit(f"unknown {what}: {', '.join(unknown)} (known: {', '.join(known)})")
    return names


def _sizes_text(s: Sizes) -> str:
    MiB = 1 << 20
    return (
        f"write {s.write_files} x {s.write_file_bytes // MiB} MiB;"
        f" random reads over {s.rand_object_bytes // MiB} MiB for {s.rand_seconds:g} s each;"
        f" metadata tree {s.meta_dirs * s.meta_files_per_dir} objects in {s.meta_dirs} dirs"
        f" (stat cold time-boxed at {s.meta_stat_seconds:g} s),"
        f" create {s.create_files} x {s.create_file_bytes // 1024} KiB;"
        f" checkpoint {s.ckpt_shards} x {s.ckpt_shard_bytes // MiB} MiB + metadata.json,"
        f" {s.ckpt_writers} writer threads; one big file of {s.bigwrite_bytes // MiB} MiB;"
        f" 1 MiB application reads and writes."
    )


def _command(mode: str, args: list[str]) -> str:
    """``make bench`` / ``make bench-quick`` for a run with no other arguments; else the
    ``python -m benchmarks ...`` line (a report must not claim a run it was not)."""
    if not [a for a in args if a != "--quick"]:
        return "make bench" if mode == "full" else "make bench-quick"
    return shlex.join(["python", "-m", "benchmarks", *args])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--quick", action="store_true", help="small sizes (bench-quick)")
    parser.add_argument("--profiles", default=",".join(PROFILES), help="plain,shaped")
    parser.add_argument("--systems", default=",".join(DEFAULT_SYSTEMS), help=",".join(SYSTEMS))
    parser.add_argument("--workloads", default=",".join(WORKLOADS), help=",".join(WORKLOADS))
    parser.add_argument("--delay-ms", type=float, default=20.0, help="shaped: delay per request")
    parser.add_argument("--rate-mbs", type=float, default=200.0, help="shaped: MB/s per connection")
    parser.add_argument(
        "--rounds",
        type=int,
        default=None,
        help="measure each cell N times, medians reported (default: each workload's own)",
    )
    parser.add_argument("--out", type=Path, default=RESULTS, help="results directory")
    parser.add_argument("--stem", default=None, help="file name stem (default bench-quick/full)")
    parser.add_argument(
        "--keep-stats",
        type=Path,
        default=None,
        metavar="DIR",
        help="keep each tierfs mount's `tierfs stats --json` in DIR, named by cell",
    )
    args = parser.parse_args(argv)
    profiles = _names(args.profiles, PROFILES, "profile")
    systems = _names(args.systems, SYSTEMS, "system")
    workloads = _names(args.workloads, WORKLOADS, "workload")
    if args.rounds is not None and args.rounds < 1:
        raise SystemExit(f"--rounds must be 1 or more, not {args.rounds}")
    sizes = QUICK if args.quick else FULL
    mode = "quick" if args.quick else "full"

    def log(message: str) -> None:
        print(message, flush=True)

    started = time.monotonic()
    machine = report.machine()  # before the run: tierfs/ may change while it runs
    env = Env(
        sizes,
        delay_s=args.delay_ms / 1000,
        rate_bytes_s=args.rate_mbs * 1e6,
        log=log,
        meta_tree="meta" in workloads,
    )
    env.keep_stats = args.keep_stats
    try:
        env.open()
        assert env.proxy is not None
        runner = Runner(
            env,
            profiles=profiles,
            systems=systems,
            workloads=workloads,
            log=log,
            rounds=args.rounds,
        )
        records = runner.run()
    except KeyboardInterrupt:
        print("interrupted: cleaning up", file=sys.stderr)
        env.close()
        return 130
    finally:
        shaping = env.proxy.describe() if env.proxy is not None else ""
        env.close()
    elapsed = time.monotonic() - started
    meta = {
        "mode": mode,
        # What reproduces the run: the make target when it ran as one, else its arguments.
        "command": _command(mode, argv if argv is not None else sys.argv[1:]),
        "argv": shlex.join(["python", "-m", "benchmarks", *(argv or sys.argv[1:])]),
        "elapsed_s": elapsed,
        "sizes": dataclasses.asdict(sizes),
        "sizes_text": _sizes_text(sizes),
        "profiles": {
            "plain": "the emulator on 127.0.0.1, no shaping",
            "shaped": f"through a shaping proxy: {shaping}",
        },
        "drop_caches": env.drop_caches_note or "sync; echo 3 > /proc/sys/vm/drop_caches",
        "systems": {name: SYSTEMS[name].description for name in systems},
        "machine": machine,
    }
    text, written = report.write_all(runner, records, meta, args.out, args.stem or f"bench-{mode}")
    print()
    print(text)
    print(f"\n{mode} run: {elapsed:.0f} s; wrote " + ", ".join(str(p) for p in written))
    if runner.failures:
        print("\nFAILURES:\n  " + "\n  ".join(runner.failures), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
