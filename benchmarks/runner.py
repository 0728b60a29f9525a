"""Run every (profile, workload, system) cell and collect one `Record` per metric.

Each cell gets a fresh system instance (so each workload starts from a fresh
mount and a daemon's peak RSS belongs to that workload) and a scratch bucket
that is emptied afterwards. A cell never takes the run down:

- a system that cannot run here is "n/a" with its reason, for every metric;
- an exception is "error" with a one-line reason; wrong bytes are "FAIL",
  printed at once and counted, and make the run exit non-zero;
- a cell that outlives its timeout is a hang: a watchdog kills the system's
  daemons (by PID), which makes every blocked call on the mount fail, and the
  cell is reported as "hang".

Python's cyclic collector is off while a cell runs (collected before): this process
holds tens of thousands of objects, and a full collection in the middle of a timed
loop stopped the reader for 30-40 ms, as long as ~340 random reads from memory took
in all (a random-read second touch of 5,700 against 9,400-13,800 IOPS, whichever
system it hit).

Systems that never touch the network (local disk, tmpfs) run in the first
profile only; their records are copied into the others, marked as such.

A workload whose single numbers swing more than the differences it is read for
(`Workload.rounds`, or ``--rounds`` for every workload) runs that many rounds, each
system once a round, in turn first and last, and each metric is reported as the median
of its rounds, the rounds' values in its note (a peak RSS as the highest). Random reads
are such a workload: the same code measured 12,177 and 16,181 IOPS of 4 KiB second
touch in two runs of one day, rclone 19,011 and 10,571.
"""

from __future__ import annotations

import dataclasses
import gc
import statistics
import threading
import time
import traceback
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass

from benchmarks.catalog import SYSTEMS, WORKLOADS
from benchmarks.data import NotApplicable, WrongBytes
from benchmarks.env import Env
from benchmarks.systems import FuseSystem, System
from benchmarks.workloads import RSS, Cell, Metric, Workload


@dataclass
class Record:
    profile: str
    system: str
    workload: str
    metric: str
    value: float | None
    unit: str
    status: str  # "ok", "n/a", "error", "FAIL", "hang"
    note: str = ""
    seconds: float | None = None


def cell_order(systems: list[str], turn: int) -> list[str]:
    """The systems in the order the ``turn``-th workload measures them: as given, then
    reversed, in turn. The emulator and the disk drift during a run (the emulator's first
    large upload is its slowest; a daemon's SSD copy and the page cache's writeback outlive
    its cell), so no system should always be measured first, or right after another. The
    turn counts on across profiles (`Runner.run`): a workload measured in column order on
    the plain link is measured in reverse on the shaped one."""
    return list(systems) if turn % 2 == 0 else list(reversed(systems))


class Runner:
    def __init__(
        self,
        env: Env,
        *,
        profiles: Sequence[str],
        systems: Sequence[str],
        workloads: Sequence[str],
        log: Callable[[str], None] = print,
        rounds: int | None = None,
    ) -> None:
        self.env = env
        self.rounds = rounds  # None: each workload's own (`Workload.rounds`)
        self.profiles = list(profiles)
        self.systems = list(systems)
        self.workloads = list(workloads)
        self.log = log
        self.records: list[Record] = []
        self.failures: list[str] = []
        self.cell_seconds: dict[tuple[str, str, str], float] = {}

    @staticmethod
    def metrics(workload: type[Workload]) -> list[Metric]:
        if workload.own_rss:
            return list(workload.metrics)
        rss = dataclasses.replace(RSS, key=f"rss.{workload.name}")
        return [*workload.metrics, rss]

    def run(self) -> list[Record]:
        for index, profile in enumerate(self.profiles):
            if index > 0 and self._network():
                self.env.restart_emulator()
            for turn, workload_name in enumerate(self.workloads):
                workload = WORKLOADS[workload_name]
                why = self.env.emulator_needs_restart() if self._network() else None
                if why is not None:
                    self.log(f"[{profile}] before {workload_name}: restarting the emulator ({why})")
                    self.env.restart_emulator()
                rounds = self.rounds or workload.rounds
                first = len(self.records)
                for round_ in range(rounds):
                    if round_ > 0 and self._network():  # (a round may leave it as a workload)
                        why = self.env.emulator_needs_restart()
                        if why is not None:
                            self.log(
                                f"[{profile}] {workload_name}, round {round_ + 1}:"
                                f" restarting the emulator ({why})"
                            )
                            self.env.restart_emulator()
                    for system_name in cell_order(self.systems, turn + index + round_):
                        system_cls = SYSTEMS[system_name]
                        if system_cls.only and workload_name not in system_cls.only:
                            continue
                        if not system_cls.network and index > 0:
                            if round_ == 0:
                                self._copy(system_name, workload, self.profiles[0], profile)
                            continue
                        self._cell(profile, workload, system_cls)
                if rounds > 1:
                    peaks = {m.key for m in self.metrics(workload) if m.peak}
                    self.records[first:] = fold_rounds(self.records[first:], peaks)
        return self.records

    def _network(self) -> bool:
        return any(SYSTEMS[name].network for name in self.systems)

    def _copy(self, system: str, workload: type[Workload], source: str, profile: str) -> None:
        for record in [
            r
            for r in self.records
            if r.profile == source and r.system == system and r.workload == workload.name
        ]:
            note = "; ".join(x for x in (record.note, f"no network: same run as {source}") if x)
            self.records.append(dataclasses.replace(record, profile=profile, note=note))

    def _cell(self, profile: str, workload_cls: type[Workload], system_cls: type[System]) -> None:
        metrics = self.metrics(workload_cls)
        where = f"[{profile}] {system_cls.name} / {workload_cls.name}"
        reason = system_cls.unavailable()
        if reason is not None:
            self._all(profile, system_cls.name, workload_cls.name, metrics, "n/a", reason)
            self.log(f"{where}: n/a ({reason})")
            return
        system = system_cls(self.env, profile)
        self.env.cell = f"{profile}-{workload_cls.name}-{system_cls.name}"
        cell = Cell(self.env, system, profile, self.log)
        hung = threading.Event()
        finished = threading.Event()

        def watchdog() -> None:
            if not finished.wait(self.env.sizes.cell_timeout_s):
                hung.set()
                self.log(f"{where}: no progress in {self.env.sizes.cell_timeout_s:.0f}s, killing")
                system.kill()

        threading.Thread(target=watchdog, daemon=True).start()
        start = time.monotonic()
        status, reason = "ok", ""
        gc.collect()
        gc.disable()
        try:
            workload_cls().run(cell)
            system.sample_rss()
        except WrongBytes as err:
            status, reason = "FAIL", f"WRONG BYTES: {err}"
        except NotApplicable as err:
            status, reason = "n/a", str(err)
        except Exception as err:
            status = "hang" if hung.is_set() else "error"
            reason = f"{type(err).__name__}: {' '.join(str(err).split())}"[:400]
            if status == "error":
                self.log(traceback.format_exc().rstrip())
        finally:
            gc.enable()
            finished.set()
            try:
                system.close()
            except Exception as err:
                if status == "ok":
                    status, reason = "error", f"cleanup: {type(err).__name__}: {err}"
            for bucket in cell.scratch:
                try:
                    self.env.scrub(bucket)
                except Exception as err:
                    self.log(f"{where}: cannot empty {bucket}: {err}")
        elapsed = time.monotonic() - start
        key = (profile, system_cls.name, workload_cls.name)
        self.cell_seconds[key] = self.cell_seconds.get(key, 0.0) + elapsed  # (all rounds)
        if isinstance(system, FuseSystem):
            errors = system.log_errors()
            if errors:
                cell.notes.append(f"daemon logged {len(errors)} ERROR lines: {errors[0][-200:]}")
        if status != "ok":
            if status == "FAIL":
                self.failures.append(f"{where}: {reason}")
                self.log(f"\n!!! {where}: {reason}\n")
            elif status == "hang":
                self.failures.append(f"{where}: hang ({reason})")
            self.log(f"{where}: {status}: {reason}")
        for metric in metrics:
            if metric.key.startswith("rss."):
                kib = system.peak_rss_kib
                value = kib / 1024 if kib is not None else None
                if status == "ok" or value is not None:
                    rss_status = "ok" if value is not None else "n/a"
                    rss_note = "" if value is not None else "no daemon"
                    self._add(
                        profile,
                        system_cls.name,
                        workload_cls.name,
                        metric,
                        value,
                        rss_status,
                        rss_note,
                        None,
                    )
                    continue
            measured = cell.values.get(metric.key)
            if measured is not None and measured.value is not None:
                note = "; ".join(x for x in (measured.note, *cell.notes) if x)
                seconds = measured.detail.get("seconds")
                self._add(
                    profile,
                    system_cls.name,
                    workload_cls.name,
                    metric,
                    measured.value,
                    "ok",
                    note,
                    seconds,
                )
            elif not (metric.optional and status == "ok"):
                self._add(
                    profile,
                    system_cls.name,
                    workload_cls.name,
                    metric,
                    None,
                    status if status != "ok" else "error",
                    reason or "not measured",
                    None,
                )
        summary = ", ".join(
            f"{m.key.split('.', 1)[1]} {cell.values[m.key].value:,.1f} {m.unit}"
            for m in metrics
            if m.key in cell.values and cell.values[m.key].value is not None
        )
        rss = f", rss {system.peak_rss_kib / 1024:.0f} MiB" if system.peak_rss_kib else ""
        self.log(f"{where}: {summary}{rss} ({elapsed:.1f}s)")

    def _all(
        self,
        profile: str,
        system: str,
        workload: str,
        metrics: list[Metric],
        status: str,
        note: str,
    ) -> None:
        for metric in metrics:
            self._add(profile, system, workload, metric, None, status, note, None)

    def _add(
        self,
        profile: str,
        system: str,
        workload: str,
        metric: Metric,
        value: float | None,
        status: str,
        note: str,
        seconds: float | None,
    ) -> None:
        self.records.append(
            Record(profile, system, workload, metric.key, value, metric.unit, status, note, seconds)
        )


_WORST = ("FAIL", "hang", "error", "n/a")  # a round that did not measure outranks those that did


def fold_rounds(records: list[Record], peaks: Collection[str] = ()) -> list[Record]:
    """One record per (profile, system, workload, metric) out of the rounds' records, in
    the order first seen: the median of the measured values, or the highest of a peak's
    (``peaks``: metric keys). A round that failed, hung or erred while others measured is
    what the metric reports, with the round named (a median must not hide a failure); a
    metric no round measured, each for the same reason (a system without a daemon has
    no RSS), keeps that reason as it is."""
    groups: dict[tuple[str, str, str, str], list[Record]] = {}
    for record in records:
        groups.setdefault(
            (record.profile, record.system, record.workload, record.metric), []
        ).append(record)
    folded: list[Record] = []
    for (_, _, _, metric), group in groups.items():
        bad = [(i, r) for i, r in enumerate(group, 1) if r.status != "ok" or r.value is None]
        if len(group) == 1 or (
            len(bad) == len(group) and len({(r.status, r.note) for _, r in bad}) == 1
        ):
            folded.append(group[0])
            continue
        if bad:
            i, worst = min(bad, key=lambda ir: _rank(ir[1].status))
            note = f"round {i} of {len(group)}: {worst.note}"
            folded.append(dataclasses.replace(worst, note=note))
            continue
        values = [r.value for r in group if r.value is not None]
        peak = metric in peaks
        value = max(values) if peak else statistics.median(values)
        nearest = min(group, key=lambda r: abs((r.value or 0.0) - value))
        shown = " / ".join(f"{v:,.0f}" if v >= 100 else f"{v:.3g}" for v in values)
        how = "highest" if peak else "median"
        note = "; ".join(x for x in (f"{how} of {len(group)} rounds ({shown})", nearest.note) if x)
        folded.append(dataclasses.replace(nearest, value=value, note=note))
    return folded


def _rank(status: str) -> int:
    return _WORST.index(status) if status in _WORST else len(_WORST)
