"""The benchmark's CPU meter (`benchmarks.cpu`) counts what the reader, a daemon and the
emulator spent while counting, and says "unknown" when a process it watched is gone."""

from __future__ import annotations

import subprocess
import sys
import time

from benchmarks.cpu import CpuMeter, own_cpu_s, process_cpu_s

_SPIN = "import time\nt = time.process_time()\nwhile time.process_time() - t < {s}: pass\n"


def _spin_here(seconds: float) -> None:
    start = time.process_time()
    while time.process_time() - start < seconds:
        pass


def test_the_meter_adds_the_cpu_of_a_daemon_and_of_the_reader_over_each_block() -> None:
    idle = "import sys; print('ready', flush=True); sys.stdin.read()"
    daemon = subprocess.Popen([sys.executable, "-c", idle],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE)  # fmt: skip
    # It spins, then stays (killed below): gone before the second block, as on a loaded
    # machine, its CPU would be unknown there.
    # It starts spinning when told (inside the block): spinning from its start, the part
    # of its 0.3 s spent while this waited for the daemon was not counted.
    go = "import sys; print('ready', flush=True); sys.stdin.readline()\n"
    stay = go + _SPIN.format(s=0.3) + "import sys; sys.stdin.read()\n"
    busy = subprocess.Popen([sys.executable, "-c", stay],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE)  # fmt: skip
    try:
        assert daemon.stdout is not None and daemon.stdout.readline() == b"ready\n"
        assert busy.stdout is not None and busy.stdout.readline() == b"ready\n"
        # (their start-ups are over: from here on they spend nothing until told)
        meter = CpuMeter([busy.pid, daemon.pid], emulator=daemon.pid)
        with meter.counting():
            assert busy.stdin is not None
            busy.stdin.write(b"go\n")
            busy.stdin.flush()
            _spin_here(0.2)
            while busy.poll() is None and (process_cpu_s(busy.pid) or 0) < 0.25:
                time.sleep(0.01)
        _spin_here(0.2)  # outside any block: not counted
        with meter.counting():
            _spin_here(0.1)
        assert meter.reader_s >= 0.28 and meter.reader_s < 0.45, meter.reader_s
        assert meter.daemon_s is not None and meter.daemon_s >= 0.2, meter.daemon_s
        assert meter.emulator_s is not None and meter.emulator_s < 0.1
        total = meter.total_s()
        assert total is not None
        assert abs(total - (meter.reader_s + meter.daemon_s + meter.emulator_s)) < 1e-9
    finally:
        for process in (busy, daemon):
            process.kill()
            process.communicate()  # reaps it and closes its pipes


def test_a_daemon_gone_while_counting_makes_the_cpu_unknown_not_smaller() -> None:
    gone = subprocess.Popen([sys.executable, "-c", _SPIN.format(s=0.05)])
    meter = CpuMeter([gone.pid])
    with meter.counting():
        gone.wait()
    assert process_cpu_s(gone.pid) is None
    assert meter.daemon_s is None and meter.total_s() is None


def test_without_a_daemon_or_emulator_only_the_reader_counts() -> None:
    meter = CpuMeter([])
    before = own_cpu_s()
    with meter.counting():
        _spin_here(0.05)
    assert meter.daemon_s is None and meter.emulator_s is None
    assert meter.total_s() == meter.reader_s and meter.reader_s <= own_cpu_s() - before
