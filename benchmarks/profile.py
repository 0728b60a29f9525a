"""``python -m benchmarks.profile WORKLOAD SYSTEM [--profile shaped] [--quick]``.

Runs one benchmark cell with py-spy attached to every daemon the system
starts (each mount and remount is a new daemon), then writes, under
``benchmarks/results/profiles/``:

- ``WORKLOAD-SYSTEM-PROFILE-N.txt``: py-spy's collapsed stacks ("raw" format:
  one ``frame;frame;frame count`` line per stack), which speedscope and
  flamegraph.pl open directly;
- ``WORKLOAD-SYSTEM-PROFILE.top.txt``: the functions with the most samples,
  by self time and by inclusive time, over all daemons of the cell, and the
  cell's own numbers, so a note can say where the time goes.

py-spy reads the daemon's memory with ptrace: it needs root (or
CAP_SYS_PTRACE). Idle threads are not sampled (py-spy's default), so the
shares are of time spent working, across all threads (trio's thread plus the
worker threads that run blocking GCS calls).
"""

from __future__ import annotations

import argparse
import collections
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

from benchmarks import report
from benchmarks.catalog import SYSTEMS, WORKLOADS
from benchmarks.env import FULL, PROFILES, QUICK, Env
from benchmarks.runner import Runner

OUT = Path(__file__).resolve().parent / "results" / "profiles"
_LINE = re.compile(r":\d+\)$")  # "f (file.py:12)" -> "f (file.py)": one entry per function


def summarize(raw_files: list[Path], top: int = 25) -> str:
    """Top functions by self and inclusive samples from collapsed-stack files."""
    own: collections.Counter[str] = collections.Counter()
    inclusive: collections.Counter[str] = collections.Counter()
    total = 0
    for path in raw_files:
        for line in path.read_text(errors="replace").splitlines():
            stack, _, count_text = line.rpartition(" ")
            if not stack or not count_text.isdigit():
                continue
            count = int(count_text)
            frames = [_LINE.sub(")", frame) for frame in stack.split(";")]
            total += count
            own[frames[-1]] += count
            for frame in set(frames):
                inclusive[frame] += count
    if total == 0:
        return "no samples (was the daemon busy? is ptrace allowed?)\n"
    lines = [f"{total} samples over {len(raw_files)} daemon(s)", "", "self time:"]
    for frame, count in own.most_common(top):
        lines.append(f"  {100 * count / total:5.1f}%  {frame}")
    lines += ["", "inclusive time:"]
    for frame, count in inclusive.most_common(top):
        lines.append(f"  {100 * count / total:5.1f}%  {frame}")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.profile", description=__doc__)
    parser.add_argument("workload", choices=list(WORKLOADS))
    parser.add_argument("system", choices=[s for s, c in SYSTEMS.items() if c.kind == "fuse"])
    parser.add_argument("--profile", choices=PROFILES, default="shaped")
    parser.add_argument("--quick", action="store_true", help="small sizes")
    parser.add_argument("--rate", type=int, default=200, help="samples per second")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args(argv)
    py_spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    if not Path(py_spy).exists():
        print("py-spy is not installed: pip install -e '.[bench]'", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    stem = f"{args.workload}-{args.system}-{args.profile}"
    for old in args.out.glob(f"{stem}-*.txt"):
        old.unlink()
    env = Env(QUICK if args.quick else FULL, meta_tree=args.workload == "meta")
    samplers: list[tuple[subprocess.Popen[bytes], Path]] = []

    def attach(pid: int, label: str) -> None:
        raw = args.out / f"{stem}-{len(samplers) + 1}.txt"
        proc = env.spawn(
            [
                py_spy,
                "record",
                "--pid",
                str(pid),
                "--rate",
                str(args.rate),
                "--format",
                "raw",
                "--nonblocking",
                "-o",
                str(raw),
            ],
            env.root / f"py-spy-{len(samplers) + 1}.log",
        )
        samplers.append((proc, raw))

    env.on_daemon = attach
    try:
        env.open()
        runner = Runner(
            env, profiles=[args.profile], systems=[args.system], workloads=[args.workload]
        )
        records = runner.run()
        deadline = time.monotonic() + 60
        for proc, _ in samplers:  # each exits once its daemon has, after writing its file
            try:
                proc.wait(timeout=max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.terminate()
                proc.wait(timeout=10)
    finally:
        logs = [
            (env.root / f"py-spy-{i}.log").read_text(errors="replace")
            for i in range(1, len(samplers) + 1)
            if (env.root / f"py-spy-{i}.log").exists()
        ]
        env.close()
    raws = [raw for _, raw in samplers if raw.exists()]
    numbers = "\n".join(
        f"{r.metric}: {r.value:,.1f} {r.unit}" if r.value is not None else f"{r.metric}: {r.status}"
        for r in records
    )
    text = f"{stem} ({'quick' if args.quick else 'full'} sizes)\n{numbers}\n\n" + summarize(raws)
    if not raws:
        text += "py-spy wrote nothing; its output:\n" + "\n".join(log[-500:] for log in logs)
    top = args.out / f"{stem}.top.txt"
    top.write_text(text)
    print(text)
    print(
        f"wrote {top} and {len(raws)} collapsed-stack file(s); machine: {report.machine()['cpu']}"
    )
    return 0 if raws else 1


if __name__ == "__main__":
    sys.exit(main())
