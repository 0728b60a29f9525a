"""Results out: a terminal table, JSON, a Markdown table and a PNG bar chart.

One table per link profile; rows are metrics (grouped by workload), columns
the systems, then two ratio columns for tierfs (default / checkpoint line):

- ``tierfs/limit``: tierfs's value over the limit named for that metric
  ("gcs": the direct client; "local": the local disk), so 1.00 means tierfs
  reaches the limit and 0.25 means it gets a quarter of it;
- ``tierfs/rclone``: over rclone's value (for RSS and CPU, lower is better, so 2.0
  means twice rclone's memory or CPU).

Cells that did not produce a number show their status (n/a, error, FAIL,
hang) and a footnote with the reason. The JSON holds every record with its
note, the sizes, the shaping and the machine, so later issues can diff runs.
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks.catalog import WORKLOADS
from benchmarks.runner import Record, Runner
from benchmarks.systems import rclone_binary
from benchmarks.workloads import Metric

TIERFS_VARIANTS = ("tierfs", "tierfs-ckpt")
LIMITS = {"gcs": "gcs-direct", "local": "local"}


def _run(args: list[str]) -> str:
    try:
        result = subprocess.run(args, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return result.stdout.strip()


def _commit() -> str:
    """The checked-out commit, "+dirty" when tierfs/ has uncommitted changes (read-only git)."""
    repo = str(Path(__file__).resolve().parent.parent)
    commit = _run(["git", "-C", repo, "rev-parse", "--short", "HEAD"])
    dirty = _run(["git", "-C", repo, "status", "--porcelain", "--", "tierfs", "mount_options"])
    return commit + ("+dirty" if dirty else "")


def machine() -> dict[str, str]:
    """What the numbers were measured on."""
    mem_kib = 0
    cpu = ""
    with open("/proc/meminfo", encoding="ascii") as info:
        for line in info:
            if line.startswith("MemTotal:"):
                mem_kib = int(line.split()[1])
    with open("/proc/cpuinfo", encoding="ascii", errors="replace") as info:
        for line in info:
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    root_dev = _run(["findmnt", "-n", "-o", "SOURCE", "-T", "/var/tmp"]) or "?"
    fields = (_run(["lsblk", "-dno", "SIZE,ROTA,MODEL", root_dev]) or "").split(None, 2)
    disk = ", ".join(
        [f"{fields[0]}" if fields else "size unknown"]
        + ([f"rotational={fields[1]}"] if len(fields) > 1 else [])
        + ([fields[2]] if len(fields) > 2 else [])
    )
    rclone = rclone_binary()
    versions = {
        "rclone": (_run([rclone, "version"]).splitlines() or [""])[0] if rclone else "",
        "fio": _run(["fio", "--version"]) if shutil.which("fio") else "",
    }
    return {
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "nproc": str(os.cpu_count()),
        "cpu": cpu,
        "memory": f"{mem_kib / 1024 / 1024:.1f} GiB",
        "kernel": platform.release(),
        "disk": f"{root_dev} ({disk}) under /var/tmp",
        "python": platform.python_version(),
        "commit": _commit(),
        **{k: v for k, v in versions.items() if v},
    }


def _fmt(value: float) -> str:
    if value >= 100:
        return f"{value:,.0f}"
    if value >= 10:
        return f"{value:.1f}"
    return f"{value:.2f}"


class Table:
    """The numbers of one profile, laid out for printing."""

    def __init__(self, runner: Runner, records: Sequence[Record], profile: str) -> None:
        self.profile = profile
        self.systems = runner.systems
        self.by_key = {(r.system, r.metric): r for r in records if r.profile == profile}
        self.metrics: list[tuple[str, Metric]] = []
        for name in runner.workloads:
            for metric in runner.metrics(WORKLOADS[name]):
                self.metrics.append((name, metric))
        self.variants = [s for s in TIERFS_VARIANTS if s in self.systems]
        self.footnotes: list[str] = []

    def value(self, system: str, metric: str) -> float | None:
        record = self.by_key.get((system, metric))
        return record.value if record is not None and record.status == "ok" else None

    def cell(self, system: str, metric: str) -> str:
        record = self.by_key.get((system, metric))
        if record is None:
            return "-"
        if record.status == "ok" and record.value is not None:
            return _fmt(record.value)
        note = record.note or record.status
        if note not in self.footnotes:
            self.footnotes.append(note)
        return f"{record.status} [{self.footnotes.index(note) + 1}]"

    def ratio(self, metric: Metric, against: str | None) -> str:
        if against is None:
            return "-"
        parts = []
        for variant in self.variants:
            mine, theirs = self.value(variant, metric.key), self.value(against, metric.key)
            parts.append(f"{mine / theirs:.2f}" if mine is not None and theirs else "-")
        return " / ".join(parts) if any(p != "-" for p in parts) else "-"

    def rows(self) -> tuple[list[str], list[list[str]]]:
        header = ["metric", "unit", *self.systems]
        if self.variants:
            header += ["tierfs/limit", "tierfs/rclone"]
        rows = []
        for workload, metric in self.metrics:
            label = (
                metric.label if not metric.key.startswith("rss.") else f"{metric.label}, {workload}"
            )
            row = [label, metric.unit, *(self.cell(s, metric.key) for s in self.systems)]
            if self.variants:
                limit = LIMITS.get(metric.limit or "")
                limit_ratio = self.ratio(metric, limit) if limit in self.systems else "-"
                if limit_ratio != "-" and metric.limit:
                    limit_ratio += f" ({metric.limit})"
                rclone = self.ratio(metric, "rclone") if "rclone" in self.systems else "-"
                row += [limit_ratio, rclone]
            rows.append(row)
        return header, rows


# Ratios between two cells that a goal is stated in (issue 5), printed under the tables:
# (label, profile, (system, metric), (system, metric)).
COMPARISONS: tuple[tuple[str, str, tuple[str, str], tuple[str, str]], ...] = (
    ("warm re-read, tierfs / local disk", "plain", ("tierfs", "read.warm"), ("local", "read.warm")),
    (
        "warm re-read, best of 3, tierfs / local disk",
        "plain",
        ("tierfs", "read.warm_best"),
        ("local", "read.warm_best"),
    ),
    (
        "read after remount (SSD tier), tierfs-ckpt / local disk",
        "plain",
        ("tierfs-ckpt", "read.remount"),
        ("local", "read.remount"),
    ),
    (
        "read after remount (SSD tier), best of 3, tierfs-ckpt / local disk",
        "plain",
        ("tierfs-ckpt", "read.remount_best"),
        ("local", "read.remount_best"),
    ),
    (
        "cold read, parallel / serial downloads (shaped link)",
        "shaped",
        ("tierfs-ckpt", "read.cold"),
        ("tierfs-ckpt-serial", "read.cold"),
    ),
    (
        "big file until close(), gcs-direct upload / tierfs streaming",
        "plain",
        ("gcs-direct", "bigwrite.close"),
        ("tierfs", "bigwrite.close"),
    ),
    (
        "big file until close(), gcs-direct upload / tierfs write-back",
        "plain",
        ("gcs-direct", "bigwrite.close"),
        ("tierfs-wb", "bigwrite.close"),
    ),
    (
        "creates until close(), tierfs write-back / the pyfuse3 + trio ceiling",
        "plain",
        ("tierfs-wb", "meta.create"),
        ("pyfuse3-null", "meta.create"),
    ),
    (
        "Orbax step until the rename returns, tierfs write-back / the pyfuse3 + trio ceiling",
        "plain",
        ("tierfs-wb", "orbax.save"),
        ("pyfuse3-null", "orbax.save"),
    ),
    (
        "Orbax step until the rename returns, the pyfuse3 + trio ceiling / local disk",
        "plain",
        ("pyfuse3-null", "orbax.save"),
        ("local", "orbax.save"),
    ),
    (
        "ls -lR warm, tierfs-lists / rclone",
        "plain",
        ("tierfs-lists", "meta.ls_warm"),
        ("rclone", "meta.ls_warm"),
    ),
    (
        "ls -lR warm, tierfs-lists / rclone (shaped link)",
        "shaped",
        ("tierfs-lists", "meta.ls_warm"),
        ("rclone", "meta.ls_warm"),
    ),
)


def comparisons(tables: Sequence[Table]) -> list[str]:
    """One line per comparison whose two cells were both measured in this run."""
    by_profile = {t.profile: t for t in tables}
    lines = []
    for label, profile, (sys_a, key_a), (sys_b, key_b) in COMPARISONS:
        table = by_profile.get(profile)
        if table is None:
            continue
        mine, theirs = table.value(sys_a, key_a), table.value(sys_b, key_b)
        if mine is None or not theirs:
            continue
        lines.append(f"{label}: {_fmt(mine)} / {_fmt(theirs)} = {mine / theirs:.2f}")
    return lines


def terminal(tables: Sequence[Table], meta: dict[str, Any]) -> str:
    out = []
    for table in tables:
        header, rows = table.rows()
        widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
        title = f"== {table.profile}: {meta['profiles'][table.profile]} =="
        out.append(title)
        line = "  ".join(
            h.ljust(w) if i < 2 else h.rjust(w)
            for i, (h, w) in enumerate(zip(header, widths, strict=True))
        )
        out.append(line)
        out.append("-" * len(line))
        for row in rows:
            out.append(
                "  ".join(
                    c.ljust(w) if i < 2 else c.rjust(w)
                    for i, (c, w) in enumerate(zip(row, widths, strict=True))
                )
            )
        for i, note in enumerate(table.footnotes, 1):
            out.append(f"  [{i}] {note}")
        out.append("")
    if tables and tables[0].variants:
        out.append(
            "ratios: "
            + " / ".join(tables[0].variants)
            + "; limit = gcs-direct (gcs) or local disk (local);"
            + " RSS and CPU ratios: lower is better"
        )
    for line in comparisons(tables):
        out.append("  " + line)
    return "\n".join(out)


def markdown(tables: Sequence[Table], meta: dict[str, Any]) -> str:
    m = meta["machine"]
    out = [
        f"Measured {m['date']} on {m['nproc']} CPUs ({m['cpu']}), {m['memory']} RAM,"
        f" Linux {m['kernel']}, disk {m['disk']}; tierfs {m.get('commit', '?')},"
        f" {m.get('rclone', 'no rclone')}, {m.get('fio', 'no fio')}.",
        f"Command: `{meta['command']}` ({meta['mode']} sizes, {meta['elapsed_s']:.0f} s).",
        "",
    ]
    for table in tables:
        header, rows = table.rows()
        out.append(f"**{table.profile}**: {meta['profiles'][table.profile]}")
        out.append("")
        out.append("| " + " | ".join(header) + " |")
        out.append("|" + "|".join("---" if i < 2 else "---:" for i in range(len(header))) + "|")
        for row in rows:
            out.append("| " + " | ".join(c.replace("|", "/") for c in row) + " |")
        out.append("")
        for i, note in enumerate(table.footnotes, 1):
            out.append(f"{i}. {note}")
        if table.footnotes:
            out.append("")
    if tables and tables[0].variants:
        out.append(
            "Ratios are " + " / ".join(tables[0].variants) + " over the limit (gcs = gcs-direct,"
            " local = local disk) and over rclone; for RSS and CPU lower is better."
        )
    lines = comparisons(tables)
    if lines:
        out += ["", "Comparisons:", ""] + [f"- {line}" for line in lines]
    out.append("")
    out.append("Sizes: " + meta["sizes_text"])
    out.append("")
    out.append(
        "Order: each workload measures the systems in the order of the columns, the next one"
        " in the reverse order, and each profile flips the order of the one before, so that"
        " no system is always measured first."
    )
    return "\n".join(out) + "\n"


def chart(tables: Sequence[Table], path: Path) -> str | None:
    """Grouped bars per profile, each metric relative to its limit; None or why not drawn."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib is not installed (pip install -e '.[bench]'): no PNG"
    fig, axes = plt.subplots(len(tables), 1, figsize=(15, 5.5 * len(tables)), squeeze=False)
    for ax, table in zip(axes[:, 0], tables, strict=True):
        metrics = [m for _, m in table.metrics if m.limit]
        width = 0.8 / max(1, len(table.systems))
        for j, system in enumerate(table.systems):
            heights = []
            for metric in metrics:
                value = table.value(system, metric.key)
                limit = table.value(LIMITS[metric.limit or "gcs"], metric.key)
                heights.append(value / limit if value is not None and limit else 0.0)
            xs = [i + (j - (len(table.systems) - 1) / 2) * width for i in range(len(metrics))]
            ax.bar(xs, heights, width, label=system)
        ax.set_yscale("log")
        ax.axhline(1.0, color="black", linewidth=0.8)
        ax.set_xticks(range(len(metrics)))
        ax.set_xticklabels([m.key for m in metrics], rotation=35, ha="right", fontsize=8)
        ax.set_ylabel("relative to the limit (log)")
        ax.set_title(f"{table.profile}: each metric over its limit (gcs-direct or local disk)")
        ax.legend(fontsize=8, ncol=len(table.systems))
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return None


def write_all(
    runner: Runner, records: Sequence[Record], meta: dict[str, Any], out_dir: Path, stem: str
) -> tuple[str, list[Path]]:
    out_dir.mkdir(parents=True, exist_ok=True)
    tables = [Table(runner, records, p) for p in runner.profiles]
    text = terminal(tables, meta)
    json_path = out_dir / f"{stem}.json"
    md_path = out_dir / f"{stem}.md"
    png_path = out_dir / f"{stem}.png"
    document = {
        **meta,
        "metrics": {
            m.key: {
                "label": m.label,
                "unit": m.unit,
                "higher_is_better": m.higher_is_better,
                "limit": m.limit,
                "workload": w,
            }
            for t in tables[:1]
            for w, m in t.metrics
        },
        "records": [r.__dict__ for r in records],
        "cell_seconds": [
            {"profile": p, "system": s, "workload": w, "seconds": round(v, 2)}
            for (p, s, w), v in runner.cell_seconds.items()
        ],
        "failures": runner.failures,
    }
    json_path.write_text(json.dumps(document, indent=1) + "\n")
    md_path.write_text(markdown(tables, meta))
    written = [json_path, md_path]
    why_not = chart(tables, png_path)
    if why_not is None:
        written.append(png_path)
    else:
        text += f"\n{why_not}"
    return text, written
