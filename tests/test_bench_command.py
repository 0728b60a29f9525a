"""A benchmark report names the command that reproduces it: a run with workloads or
systems of its own is not `make bench` (one report said so of a targeted run); the order
cells run in; a save whose directory rename the options refuse is n/a, not an error; and
the shared-tier benchmark runs; the README's section intro is the one the readme command
writes; no collection of the bench's own objects pauses a cell; ``--keep-stats`` keeps
each tierfs mount's statistics."""

from __future__ import annotations

import errno
import gc
import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from benchmarks import shared_restore
from benchmarks.__main__ import _command
from benchmarks.catalog import WORKLOADS
from benchmarks.data import NotApplicable, WrongBytes, check_small, equal
from benchmarks.env import Pids, mounts_below
from benchmarks.reads import SeqRead
from benchmarks.runner import Record, Runner, cell_order, fold_rounds
from benchmarks.saves import commit
from benchmarks.systems import System
from benchmarks.tierfs_systems import Tierfs
from benchmarks.workloads import Cell, Metric, Workload
from tierfs.cli.emulator import Emulator


def test_a_report_names_the_make_target_only_for_a_run_made_by_it() -> None:
    assert _command("full", []) == "make bench"
    assert _command("quick", ["--quick"]) == "make bench-quick"
    targeted = ["--workloads", "ckpt,dcp", "--systems", "tierfs-wb,local"]
    assert _command("full", targeted) == (
        "python -m benchmarks --workloads ckpt,dcp --systems tierfs-wb,local"
    )


def test_the_systems_are_measured_in_turn_first_and_last() -> None:
    """The emulator and the disk drift during a run: each workload takes the systems in
    the other order from the one before, so none is always measured first."""
    systems = ["tierfs-wb", "gcs-direct", "local"]
    assert cell_order(systems, 0) == systems
    assert cell_order(systems, 1) == ["local", "gcs-direct", "tierfs-wb"]
    assert cell_order(systems, 2) == systems
    assert systems == ["tierfs-wb", "gcs-direct", "local"]  # not reordered in place


def test_each_profile_measures_a_workload_in_the_other_order() -> None:
    """With an even number of workloads, the turn restarting at each profile measured
    every workload in the same order on both links (tierfs first for seq reads, right
    after the emulator's start, on both): the order flips with the profile too."""
    env: Any = SimpleNamespace(restart_emulator=lambda: None, emulator_needs_restart=lambda: None)
    systems = ["tierfs", "rclone", "gcs-direct"]
    runner = Runner(
        env,
        profiles=["plain", "shaped"],
        systems=systems,
        workloads=["read", "rand"],
        log=print,
        rounds=1,
    )
    order: dict[tuple[str, str], list[str]] = {}
    runner._cell = lambda profile, workload, system: order.setdefault(  # type: ignore[method-assign]
        (profile, workload.name), []
    ).append(system.name)
    runner.run()
    for workload in ("read", "rand"):
        assert order[("shaped", workload)] == order[("plain", workload)][::-1], order
    assert order[("plain", "read")] == order[("plain", "rand")][::-1]


def test_a_noisy_workload_is_measured_in_rounds_and_reported_as_medians() -> None:
    """Random reads' single numbers swung 2x between runs of the same code: each system is
    measured once a round, in turn first and last, and the table shows each metric's
    median (a peak RSS its highest), the rounds' values in the note."""
    env: Any = SimpleNamespace(restart_emulator=lambda: None, emulator_needs_restart=lambda: None)
    runner = Runner(env, profiles=["plain"], systems=["tierfs", "rclone"], workloads=["rand"])
    order: list[str] = []
    values = {"tierfs": iter([9.0, 30.0, 10.0]), "rclone": iter([20.0, 5.0, 21.0])}

    def cell(profile: str, workload: type[Workload], system: type[System]) -> None:
        order.append(system.name)
        value = next(values[system.name])
        for key in ("rand.4k", "rss.rand"):
            runner.records.append(
                Record(profile, system.name, workload.name, key, value, "x", "ok", f"v{value:g}")
            )

    runner._cell = cell  # type: ignore[method-assign]
    records = runner.run()
    assert order == ["tierfs", "rclone", "rclone", "tierfs", "tierfs", "rclone"]
    got = {(r.system, r.metric): r for r in records}
    assert len(records) == 4
    assert got[("tierfs", "rand.4k")].value == 10.0
    assert got[("rclone", "rand.4k")].value == 20.0
    assert got[("tierfs", "rss.rand")].value == 30.0  # a peak is the highest round's
    assert got[("tierfs", "rand.4k")].note == "median of 3 rounds (9 / 30 / 10); v10"
    once = Runner(env, profiles=["plain"], systems=["tierfs"], workloads=["rand"], rounds=1)
    once._cell = lambda profile, workload, system: order.append("once")  # type: ignore[method-assign]
    once.run()
    assert order.count("once") == 1  # --rounds overrides the workload's own


def test_a_round_that_failed_is_reported_not_hidden_by_the_median() -> None:
    def record(status: str, value: float | None, note: str = "") -> Record:
        return Record("plain", "tierfs", "rand", "rand.4k", value, "IOPS", status, note)

    folded = fold_rounds([record("ok", 5.0), record("error", None, "Boom"), record("ok", 6.0)])
    assert [(r.status, r.value, r.note) for r in folded] == [("error", None, "round 2 of 3: Boom")]
    hang_and_error = [record("error", None, "e"), record("hang", None, "h"), record("ok", 1.0)]
    assert fold_rounds(hang_and_error)[0].status == "hang"
    # Never measurable, for one reason in every round (no daemon, no rclone): said as it is.
    never = [Record("plain", "gcs-direct", "rand", "rss.rand", None, "MiB", "n/a", "no daemon")]
    assert fold_rounds(never * 3) == never


def test_every_peak_metric_reports_its_highest_round() -> None:
    """The big file's and the saves' own peak RSS rows are peaks too, not only the generic
    one: a median of 300 / 100 / 200 MiB would say 200."""
    peaks = {m.key for m in Runner.metrics(WORKLOADS["bigwrite"]) if m.peak}
    peaks |= {m.key for m in Runner.metrics(WORKLOADS["ckpt"]) if m.peak}
    assert {"bigwrite.rss", "ckpt.save_rss", "rss.ckpt"} <= peaks
    rounds = [
        Record("plain", "tierfs", "bigwrite", "bigwrite.rss", v, "MiB", "ok")
        for v in (300, 100, 200)
    ]
    assert fold_rounds(rounds, peaks)[0].value == 300


def test_the_emulator_is_restarted_between_rounds_when_it_needs_it() -> None:
    """A save workload alone drove the emulator to 20 GB once: rounds of one are checked
    between them as workloads are, not only before the first."""
    asked: list[str] = []
    restarts: list[int] = []

    def needs_restart() -> str | None:
        asked.append("?")
        return "too big" if len(asked) == 2 else None

    env: Any = SimpleNamespace(
        restart_emulator=lambda: restarts.append(len(asked)), emulator_needs_restart=needs_restart
    )
    runner = Runner(
        env, profiles=["plain"], systems=["tierfs"], workloads=["rand"], log=lambda line: None
    )
    runner._cell = lambda profile, workload, system: None  # type: ignore[method-assign]
    runner.run()
    assert len(asked) == 3  # before the workload, then before rounds 2 and 3
    assert restarts == [2]


@pytest.mark.parametrize("fails", [False, True])
def test_python_collections_are_off_while_a_cell_runs_and_on_again_after(fails: bool) -> None:
    """A full collection of the bench's own objects stopped a timed loop for 30-93 ms
    (as long as a whole random-read second touch took): none runs during a cell."""
    seen: list[bool] = []

    class Quiet(Workload):
        name = "quiet"
        metrics = (Metric("quiet.n", "n", "n"),)

        def run(self, cell: Cell) -> None:
            seen.append(gc.isenabled())
            cell.record("quiet.n", 1.0)
            if fails:
                raise RuntimeError("the workload broke")

    class Fake(System):
        name = "fake"
        network = False

    env: Any = SimpleNamespace(
        sizes=SimpleNamespace(cell_timeout_s=60), defer=lambda undo: None, scrub=print
    )
    runner = Runner(env, profiles=["plain"], systems=[], workloads=[], log=lambda line: None)
    assert gc.isenabled()
    runner._cell("plain", Quiet, Fake)
    assert seen == [False] and gc.isenabled()
    assert any(record.status == ("error" if fails else "ok") for record in runner.records)


def test_a_directory_rename_refused_by_the_options_makes_the_cell_not_applicable() -> None:
    def refused(root: Path) -> None:
        raise OSError(errno.EMFILE, "Too many open files")

    def broken(root: Path) -> None:
        raise OSError(errno.EIO, "Input/output error")

    with pytest.raises(NotApplicable, match="rename-dir-limit"):
        commit(refused, Path("/mnt"))
    with pytest.raises(OSError) as other:  # any other failure stays the system's error
        commit(broken, Path("/mnt"))
    assert other.value.errno == errno.EIO
    done: list[Path] = []
    commit(done.append, Path("/mnt"))
    assert done == [Path("/mnt")]


@pytest.mark.mount
def test_the_shared_restore_benchmark_runs_and_reports_every_phase(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`make bench-shared` at a small size: every phase reports, bytes are checked on the
    way (a wrong byte raises), the late mount reads nothing from GCS, and the mounts
    restoring at once with the shared tier read the checkpoint from GCS about once."""
    assert shared_restore.main(["--mib", "16", "--mounts", "2"]) == 0
    out = capsys.readouterr().out
    assert "a mount joining later" in out and ", 0 GCS media reads" in out, out
    shared_line = next(line for line in out.splitlines() if "shared tier:" in line)
    ratio = float(shared_line.split("GCS read ")[1].split("x")[0])
    assert ratio <= 1.1, shared_line
    assert "no shared tier (apart)" in out and "s/GiB a mount" in out, out


def test_the_readme_benchmarks_intro_is_the_one_the_readme_command_writes() -> None:
    """`python -m benchmarks.readme` rewrites the section from its own INTRO: an intro
    edited in README.md only would be lost at the next full run."""
    from benchmarks import readme

    text = readme.README.read_text(encoding="utf-8")
    section = text.split(readme.BEGIN, 1)[1].split(readme.END, 1)[0]
    assert section.startswith("\n" + readme.INTRO), "README.md and benchmarks/readme.py differ"


@pytest.mark.parametrize("got_type", [bytes, bytearray, memoryview])
@pytest.mark.parametrize("want_type", [bytes, memoryview])
def test_read_checks_compare_every_kind_of_buffer_exactly(got_type: type, want_type: type) -> None:
    """`equal` takes the memcmp path for each pair of buffer kinds (bytes against a view
    once went element by element, inside a timed loop): it must still answer right."""
    data = bytes(range(256)) * 16
    other = data[:-1] + b"\x00"

    def make(kind: type, raw: bytes) -> bytes | bytearray | memoryview:
        return memoryview(bytearray(raw)) if kind is memoryview else kind(raw)

    want = make(want_type, data)
    assert equal(make(got_type, data), want)
    assert not equal(make(got_type, other), want)
    assert not equal(make(got_type, data[:-1]), want)
    check_small("read", 0, make(got_type, data), want)
    with pytest.raises(WrongBytes, match=r"first difference at \+4095"):
        check_small("read", 0, make(got_type, other), want)


@pytest.mark.mount
def test_keep_stats_keeps_each_mounts_statistics_as_it_was_before_unmount(
    emulator: Emulator, bucket_name: str, tmp_path: Path
) -> None:
    """``--keep-stats DIR``: a mount's `tierfs stats --json` is in DIR once the cell
    unmounts it, named after the cell, one file per mount (a cell may mount twice), with
    what the mount did (here: one file read, its bytes from GCS)."""
    emulator.client().bucket(bucket_name).blob("obj").upload_from_string(b"x" * 5000)
    env: Any = SimpleNamespace(
        root=tmp_path / "env",
        endpoint=lambda profile: emulator.endpoint,
        pids=Pids(),
        on_daemon=None,
        defer=lambda undo: None,
        keep_stats=tmp_path / "kept",
        cell="plain-rand-tierfs",
    )
    system = Tierfs(env, "plain")
    try:
        for _ in range(2):
            root = system.mount(bucket_name)
            assert (root / "obj").read_bytes() == b"x" * 5000
    finally:
        system.close()
    kept = sorted(p.name for p in (tmp_path / "kept").iterdir())
    assert kept == ["plain-rand-tierfs-1.json", "plain-rand-tierfs-2.json"]
    for name in kept:
        stats = json.loads((tmp_path / "kept" / name).read_text())
        assert stats["gcs"]["bytes_read"] >= 5000, stats["gcs"]


def test_a_pid_is_killed_only_while_it_is_the_process_that_was_started(tmp_path: Path) -> None:
    """A run mounts dozens of times; killing every PID it ever saw at its end could kill an
    unrelated process that got a freed PID since. Only a process still the one recorded
    (PID and start time) is killed."""
    import subprocess

    pids = Pids()
    alive = subprocess.Popen(["sleep", "60"])
    gone = subprocess.Popen(["true"])
    try:
        pids.update([alive.pid, gone.pid])
        gone.wait()
        pids._started[gone.pid] = 1  # as if that PID now named a process started at another time
        reused = subprocess.Popen(["sleep", "60"])
        pids._started[reused.pid] = 1  # recorded with a start time that is not its own
        pids.kill()
        assert alive.wait(timeout=10) == -9
        assert reused.poll() is None  # not the process recorded: left alone
    finally:
        for proc in (alive, reused):
            proc.kill()
            proc.wait()
    assert alive.pid not in pids and reused.pid not in pids


def test_what_a_run_left_mounted_below_its_root_is_found_deepest_first(tmp_path: Path) -> None:
    """`Env.close` takes off whatever a close interrupted half-way left mounted: found by
    its name in /proc/self/mounts, where a space is written ``\\040``."""
    from tests.test_mount_writeback import tmpfs

    assert mounts_below(tmp_path) == []
    with tmpfs(tmp_path / "mnt a", "1m") as outer, tmpfs(outer / "inner", "1m") as inner:
        assert mounts_below(tmp_path) == [str(inner), str(outer)]
    assert mounts_below(tmp_path) == []


@pytest.mark.parametrize("persistent", [False, True])
def test_a_read_after_remount_without_a_persistent_tier_says_it_is_a_cold_read(
    tmp_path: Path, persistent: bool
) -> None:
    """tierfs without a cache dir keeps nothing across a remount: its "read after
    remount" row is a second cold read, and the report says so beside the number (the
    table showed it unexplained beside the checkpoint mount's SSD-tier reads)."""
    data = {"seq/a": bytes(range(256)) * 64}
    (tmp_path / "seq").mkdir()
    (tmp_path / "seq" / "a").write_bytes(data["seq/a"])

    class Dir(System):
        name = "dir"
        network = False

        def mount(self, bucket: str, *, fresh: bool = True) -> Path:
            self.bucket, self.root = bucket, tmp_path
            return tmp_path

    Dir.persistent = persistent
    env: Any = SimpleNamespace(
        data_objects=data,
        drop_caches=lambda: None,
        defer=lambda undo: None,
        emulator=None,
        sizes=SimpleNamespace(io_block_bytes=4096),
    )
    cell = Cell(env, Dir(env, "plain"), "plain", print)
    SeqRead().run(cell)
    notes = {key: cell.values[key].note for key in ("read.remount", "read.remount_best")}
    said = "no persistent tier (no cache dir): a cold read again"
    assert notes == dict.fromkeys(notes, "" if persistent else said)
    assert cell.values["read.cold"].note == ""
