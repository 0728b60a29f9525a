"""Bad input at the command line's edges: one line, the right exit status, never a hang.

Each case is one a review found giving a traceback, "internal error", a doubled prefix, a
hang or the wrong target (the letter and number name its finding). Most run in-process
through `tierfs.cli.main._guarded`; what could hang, or changes process-wide state (the
CSI plugin sets its umask and logging), runs the console script with a time bound.
Nothing here mounts: dead and foreign mounts are the mount table and `probe` patched.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, ClassVar

import pytest
import requests

from mount_options import parse_flags
from tierfs.cli import commands, control, daemon, entry, prefetch
from tierfs.cli import main as cli
from tierfs.cli.fdmount import check_fd
from tierfs.cli.mountpoint import DEAD, MountEntry, MountError
from tierfs.errors import AccessDenied
from tierfs.storage import gcs_auth
from tierfs.storage.gcs_errors import _describe
from tierfs.storage.smallfile import read_small_file

BIN = Path(sys.executable).parent
TIERFS = str(BIN / "tierfs")
MOUNT_HELPER = str(BIN / "mount.tierfs")


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    """``tierfs ARGV`` in-process: (status, stdout, stderr)."""
    status = cli._guarded(cli._main, list(argv))
    out, err = capsys.readouterr()
    return status, out, err


def run_script(
    *argv: str, timeout: float = 20, stdout: int | IO[str] = subprocess.PIPE
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        list(argv), stdout=stdout, stderr=subprocess.PIPE, text=True, timeout=timeout, check=False
    )


def one_line(err: str) -> str:
    assert err.count("\n") == 1 and err.endswith("\n"), err
    assert "Traceback" not in err and "internal error" not in err, err
    return err.rstrip("\n")


@pytest.fixture
def fifo(tmp_path: Path) -> Path:
    path = tmp_path / "fifo"
    os.mkfifo(path)
    return path


@pytest.fixture
def short_dir() -> Iterator[Path]:
    """A directory with a short name, for unix sockets (107 bytes at most)."""
    path = Path(tempfile.mkdtemp(prefix="tfs-", dir="/tmp"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def in_thread(call: Callable[[], object], timeout_s: float = 5.0) -> object:
    """``call()`` with a time bound: what it returned or raised (a hang fails the test)."""
    result: list[object] = []

    def target() -> None:
        try:
            result.append(call())
        except BaseException as err:  # (handed back to the test)
            result.append(err)

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(timeout_s)
    assert result, f"still running after {timeout_s} s"
    return result[0]


# --- A1: --foreground -----------------------------------------------------------------


@pytest.mark.parametrize("script", ["main", "mount_helper_main"])
def test_a_ctrl_c_while_the_command_loads_is_one_line(
    script: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A Ctrl-C in the 0.3 s the command line's modules take to load printed a Python
    traceback; it says "interrupted" and exits 130, as one a moment later does."""

    def interrupted(name: str) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(entry, "import_module", interrupted)
    with pytest.raises(SystemExit) as ended:
        getattr(entry, script)()
    assert ended.value.code == 130
    assert capsys.readouterr().err == "tierfs: interrupted\n"


class SpawnedUnderCtrlC:
    """``subprocess.Popen`` for `daemon.start_background`: a SIGINT comes while the child
    is being spawned (before ``Popen`` returns); the child is only recorded."""

    made: ClassVar[list[SpawnedUnderCtrlC]] = []

    def __init__(self, *args: object, **kwargs: object) -> None:
        os.kill(os.getpid(), signal.SIGINT)
        self.killed = False
        SpawnedUnderCtrlC.made.append(self)

    def kill(self) -> None:
        self.killed = True

    def wait(self, timeout: float | None = None) -> int:
        return -9


def test_a_ctrl_c_while_the_daemon_is_spawned_stops_it(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Raised inside ``Popen``, the KeyboardInterrupt left a daemon nobody stopped (the
    mount came up after "interrupted"). It is held until the PID is known, then stops
    it, and Python's handler is put back."""
    SpawnedUnderCtrlC.made.clear()
    monkeypatch.setattr(daemon.subprocess, "Popen", SpawnedUnderCtrlC)
    # (Python's own handler, as from a terminal: a suite started in the background by a
    # non-interactive shell has SIGINT ignored, and then nothing is held, rightly)
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(KeyboardInterrupt):
            daemon.start_background(["mount", "b", str(tmp_path)], str(tmp_path))
        assert [child.killed for child in SpawnedUnderCtrlC.made] == [True]
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    finally:
        signal.signal(signal.SIGINT, previous)


def test_an_ignored_ctrl_c_stays_ignored_while_the_daemon_is_spawned(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A mount a script starts in the background has SIGINT ignored: holding it must not
    turn one into an interruption."""
    monkeypatch.setattr(daemon.subprocess, "Popen", SpawnedUnderCtrlC)
    monkeypatch.setattr(daemon, "final_word", lambda fd, quiet_s: "ok")
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        daemon.start_background(["mount", "b", str(tmp_path)], str(tmp_path))
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGINT, previous)


def test_foreground_internal_error_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    """In the foreground the daemon's log is the terminal: the traceback logged there
    reached the user before the one line."""

    def broken(argv: list[str]) -> int:
        raise RuntimeError("a bug")

    log = logging.getLogger("tierfs")
    handler = logging.StreamHandler(sys.stderr)
    log.addHandler(handler)
    try:
        assert cli._guarded(broken, []) == 1
    finally:
        log.removeHandler(handler)
    err = capsys.readouterr().err
    assert err == "tierfs: internal error: RuntimeError: a bug\n"


# --- A2, A4: credentials files -----------------------------------------------------------


@pytest.mark.parametrize("kind", ["directory", "list", "bad-json", "fifo", "dev-zero"])
def test_a_bad_google_application_credentials_is_one_line(
    kind: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "creds"
    if kind == "directory":
        path.mkdir()
    elif kind == "list":
        path.write_text("[]")
    elif kind == "bad-json":
        path.write_text("{bad")
    elif kind == "fifo":
        os.mkfifo(path)
    else:
        path = Path("/dev/zero")
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(path))
    monkeypatch.setenv("NO_GCE_CHECK", "True")
    result = in_thread(lambda: gcs_auth._credentials("", False))
    assert isinstance(result, AccessDenied), result
    message = str(result)
    assert message.startswith(f"cannot use GOOGLE_APPLICATION_CREDENTIALS='{path}': ")
    assert "\n" not in message and "('" not in message


@pytest.mark.parametrize("name", ["fifo", "/dev/zero"])
def test_a_key_file_that_never_ends_is_refused(name: str, fifo: Path) -> None:
    key = str(fifo) if name == "fifo" else name
    result = in_thread(lambda: gcs_auth._key_file_credentials(key, []))
    assert isinstance(result, AccessDenied), result
    assert str(result) == f"cannot use key file {key!r}: is not a regular file"


def test_the_small_file_reader_has_a_size_limit(tmp_path: Path) -> None:
    big = tmp_path / "big"
    big.write_bytes(b"x" * 2000)
    with pytest.raises(OSError, match="larger than 1000 bytes") as caught:
        read_small_file(str(big), limit=1000)
    assert caught.value.errno == errno.EFBIG
    assert read_small_file(str(big), limit=2000) == "x" * 2000


# --- A3, A4, A10: starting the daemon ----------------------------------------------------


def fake_daemon(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, body: str) -> None:
    """What `daemon.start_background` starts (``sys.executable -m tierfs ...``) made a
    shell script."""
    script = tmp_path / "fake-python"
    script.write_text(f"#!/bin/sh\n{body}\n")
    script.chmod(0o755)
    monkeypatch.setattr(sys, "executable", str(script))


def test_a_daemon_crash_is_not_prefixed_twice(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake_daemon(tmp_path, monkeypatch, 'echo "tierfs: internal error: OSError: boom" >&2; exit 1')
    with pytest.raises(MountError) as caught:
        daemon.start_background(["mount", "b", str(tmp_path)], str(tmp_path))
    assert str(caught.value) == "internal error: OSError: boom"


def test_the_wait_for_the_daemon_is_bounded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A daemon stuck before its first line (a bucket check that never returns) held
    `tierfs mount` for ever: it is stopped after the bound, with one line."""
    fake_daemon(tmp_path, monkeypatch, "exec sleep 60")
    monkeypatch.setattr(daemon, "QUIET_S", 0.5)
    started = time.monotonic()
    with pytest.raises(MountError, match=r"said nothing for [01] s while starting"):
        daemon.start_background(["mount", "b", str(tmp_path)], str(tmp_path))
    assert time.monotonic() - started < 5


READY_FD = "for a; do case $a in --ready-fd=*) FD=${a#--ready-fd=};; esac; done"


def test_a_daemon_that_says_it_moves_on_is_waited_for_past_the_bound(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A daemon uploading a journal a killed one left (minutes for a large checkpoint)
    before it serves: a bound on its whole start killed that upload half-way at every
    attempt, and the mount never came up. Its progress lines keep the wait going."""
    progress = "; ".join(['echo "progress recovering" >"/dev/fd/$FD"; sleep 0.25'] * 8)
    fake_daemon(tmp_path, monkeypatch, f'{READY_FD}; {progress}; echo ok >"/dev/fd/$FD"')
    monkeypatch.setattr(daemon, "QUIET_S", 1.0)
    started = time.monotonic()
    daemon.start_background(["mount", "b", str(tmp_path)], str(tmp_path))
    assert time.monotonic() - started >= 2.0  # waited past the bound, as it moved on


def test_the_final_word_comes_after_progress_even_in_one_read() -> None:
    from tierfs.cli.readiness import final_word

    read_fd, write_fd = os.pipe()
    try:
        os.write(write_fd, b"progress a\nprogress b\nok\n")
        assert final_word(read_fd, 1.0) == "ok"
        os.write(write_fd, b"progress c\n")
        os.close(write_fd)
        write_fd = -1
        assert final_word(read_fd, 1.0) == ""  # exited without a word
    finally:
        os.close(read_fd)
        if write_fd >= 0:
            os.close(write_fd)


@pytest.mark.parametrize("number", ["1000", "99999999999999999999"])
def test_a_dev_fd_mountpoint_that_is_not_open_is_one_line(
    number: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake_daemon(tmp_path, monkeypatch, "exit 99")  # (never reached)
    if number == "1000":
        with pytest.raises(OSError):
            os.fstat(1000)
    mountpoint = f"/dev/fd/{number}"
    with pytest.raises(MountError) as caught:
        daemon.start_background(["mount", "b", mountpoint], mountpoint)
    assert str(caught.value).startswith(f"{mountpoint} is not an open descriptor: ")
    assert check_fd(int(number)) == str(caught.value)


# --- A4, A5, A6: files that never end, nest too deep, or explode ------------------------


@pytest.mark.parametrize("how", ["config-dev-zero", "config-fifo", "attributes-fifo"])
def test_config_file_that_never_ends(how: str, fifo: Path, tmp_path: Path) -> None:
    if how == "attributes-fifo":
        flag = ["--csi-volume-attributes", f"@{fifo}"]
    else:
        flag = [f"--config-file={'/dev/zero' if how == 'config-dev-zero' else fifo}"]
    started = time.monotonic()
    result = run_script(TIERFS, "mount", "--dry-run", *flag, "b12", str(tmp_path), timeout=10)
    assert time.monotonic() - started < 5
    assert result.returncode == 2
    assert one_line(result.stderr).endswith(": is not a regular file")


def test_deep_nesting_and_binary_input_are_option_errors(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    deep_yaml = tmp_path / "deep.yaml"
    deep_yaml.write_text("metadata-cache:\n  ttl-secs: " + "[" * 3000 + "\n")
    deep_json = tmp_path / "deep.json"
    deep_json.write_text("[" * 100_000)
    binary = tmp_path / "binary"
    binary.write_bytes(b"\x7fELF\xff\xfe\x00")
    cases = {
        (f"--config-file={deep_yaml}",): "nested too deeply",
        ("--csi-volume-attributes", f"@{deep_json}"): "nested too deeply",
        ("--csi-volume-attributes", f"@{binary}"): "not UTF-8 text",
    }
    for flags, why in cases.items():
        status, _, err = run_cli(capsys, "mount", "--dry-run", *flags, "b12", str(tmp_path))
        assert status == 2
        assert one_line(err).endswith(why)


def test_alias_bomb_is_a_short_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    levels = ["&l0 [x,x,x,x,x,x,x,x,x,x]"] + [
        f"&l{n} [{','.join([f'*l{n - 1}'] * 10)}]" for n in range(1, 8)
    ]
    bomb = tmp_path / "bomb.yaml"
    bomb.write_text(f"metadata-cache:\n  ttl-secs: [{', '.join(levels)}]\n")
    started = time.monotonic()
    status, _, err = run_cli(capsys, "mount", "--dry-run", f"--config-file={bomb}", "b12", "m")
    assert time.monotonic() - started < 1
    assert status == 2
    line = one_line(err)
    assert "for option 'metadata-cache:ttl-secs': expected an integer" in line
    assert len(line) - len(str(bomb)) < 300  # (the file is named: its path aside)


# --- A7, A8, A9, B14: commands that talk to a mount -------------------------------------


def a_dead_mount(monkeypatch: pytest.MonkeyPatch, mountpoint: Path) -> None:
    """A tierfs mount at ``mountpoint`` whose daemon was killed (ENOTCONN), as the mount
    table and the probe see it; the directory itself stays readable."""
    entry = MountEntry("b12", str(mountpoint), "fuse.tierfs")
    real = prefetch.mounts
    for module in (prefetch, commands):
        monkeypatch.setattr(module, "probe", lambda path, timeout_s=5.0: DEAD, raising=False)
    monkeypatch.setattr(prefetch, "mounts", lambda: [*real(), entry])
    monkeypatch.setattr(commands, "mounted_here", lambda path: entry)


def test_prefetch_on_a_dead_mount_names_the_gone_daemon(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "f").write_text("x")
    a_dead_mount(monkeypatch, tmp_path)
    status, _, err = run_cli(capsys, "prefetch", str(tmp_path / "sub"))
    assert status == 1
    assert one_line(err) == (
        f"tierfs: prefetch {tmp_path}/sub: the daemon of {tmp_path} is gone: "
        f"tierfs unmount {tmp_path}"
    )


def test_stats_on_a_dead_mount_names_the_gone_daemon(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(control, "socket_dir", lambda: tmp_path / "sockets")
    a_dead_mount(monkeypatch, tmp_path)
    status, _, err = run_cli(capsys, "stats", str(tmp_path))
    assert status == 1
    assert one_line(err) == f"tierfs: the daemon of {tmp_path} is gone: tierfs unmount {tmp_path}"


def test_stats_and_sync_name_what_is_not_a_tierfs_mount(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The control socket's ENOENT was shown as if the user's path were missing."""
    status, _, err = run_cli(capsys, "stats", "/proc")
    assert status == 1
    assert one_line(err) == "tierfs: /proc is not a tierfs mount (proc)"
    status, _, err = run_cli(capsys, "stats", str(tmp_path))
    assert status == 1
    assert one_line(err) == f"tierfs: {tmp_path} is not a tierfs mount (nothing is mounted there)"
    status, _, err = run_cli(capsys, "sync", "/")
    assert status == 1
    assert one_line(err).startswith("tierfs: sync /: / is not a tierfs mount (")


def serve_one_answer(path: Path, answer: bytes) -> threading.Thread:
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(path))
    server.listen(1)

    def serve() -> None:
        with server:
            client, _ = server.accept()
            with client:
                client.recv(1 << 16)
                client.sendall(answer + b"\n")

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    return thread


@pytest.mark.parametrize(
    ("answer", "as_json", "expected"),
    [
        (
            b'{"error": "the counters failed: RuntimeError"}',
            False,
            "stats {m}: the counters failed: RuntimeError",
        ),
        (
            b'{"error": "the counters failed: RuntimeError"}',
            True,
            "stats {m}: the counters failed: RuntimeError",
        ),
        (
            b'{"gcs": {}}',
            False,
            "the daemon of {m} answered in a format this tierfs does not know"
            " (remount after upgrading)",
        ),
    ],
)
def test_stats_on_an_error_answer(
    answer: bytes,
    as_json: bool,
    expected: str,
    short_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    mountpoint = str(short_dir / "mnt")
    monkeypatch.setattr(control, "socket_dir", lambda: short_dir)
    thread = serve_one_answer(control.socket_path(mountpoint), answer)
    status, out, err = run_cli(capsys, "stats", *(["--json"] if as_json else []), mountpoint)
    thread.join(5)
    assert (status, out) == (1, "")
    assert one_line(err) == "tierfs: " + expected.format(m=mountpoint)


def test_sync_on_a_symlink_loop_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "loop1").symlink_to("loop2")
    (tmp_path / "loop2").symlink_to("loop1")
    status, _, err = run_cli(capsys, "sync", str(tmp_path / "loop1"))
    assert status == 1
    assert one_line(err).endswith("it is not in a tierfs mount")


# --- A11, A12: the CSI plugin's flags and paths -----------------------------------------


def csi(short_dir: Path, *flags: str) -> subprocess.CompletedProcess[str]:
    defaults = {
        "--node-id": "n",
        "--state-dir": str(short_dir / "state"),
        "--endpoint": f"unix://{short_dir}/csi.sock",
    }
    given = {f.split("=")[0] for f in flags}
    args = [f"{k}={v}" for k, v in defaults.items() if k not in given]
    return run_script(TIERFS, "csi", *args, *flags, timeout=20)


TRY = " (try 'tierfs csi --help')"
ABOVE_0 = "expected a number of seconds above 0"
LONG = "/tmp/" + "a" * 110


@pytest.mark.parametrize(
    ("flag", "status", "expected"),
    [
        ("--state-dir={file}/state", 1, "cannot use --state-dir {file}/state: Not a directory"),
        ("--state-dir=/proc/nope", 1, "cannot use --state-dir /proc/nope: No such file or"
         " directory"),
        ("--endpoint=unix://{file}/x.sock", 1, "cannot use --endpoint {file}/x.sock: File exists"),
        ("--endpoint=unix://{file}", 1, "cannot use --endpoint {file}: it exists and is not a"
         " socket"),
        (f"--endpoint=unix://{LONG}", 2, f"--endpoint {LONG} is longer than 107 bytes, the limit"
         " for a unix socket"),
        ("--node-id=", 2, "--node-id must not be empty" + TRY),
        ("--upload-timeout-s=-5", 2, f"argument --upload-timeout-s: {ABOVE_0}, not '-5'" + TRY),
        ("--upload-timeout-s=0", 2, f"argument --upload-timeout-s: {ABOVE_0}, not '0'" + TRY),
        ("--start-timeout-s=nan", 2, f"argument --start-timeout-s: {ABOVE_0}, not 'nan'" + TRY),
    ],
)  # fmt: skip
def test_csi_flags_and_paths_are_checked(
    flag: str, status: int, expected: str, short_dir: Path
) -> None:
    file = short_dir / "file"
    file.write_text("not a socket")
    result = csi(short_dir, flag.format(file=file))
    assert result.returncode == status
    assert one_line(result.stderr) == "tierfs: csi: " + expected.format(file=file)
    assert file.read_text() == "not a socket"


# --- B13, B16, B18, B20, B21 ------------------------------------------------------------


@pytest.mark.parametrize(
    "argv",
    [
        ("mount", "--dry-run", "b12", ""),
        ("unmount", ""),
        ("stats", ""),
        ("sync", ""),
        ("prefetch", ""),
    ],
)
def test_empty_mountpoint_is_refused(
    argv: tuple[str, ...], capsys: pytest.CaptureFixture[str]
) -> None:
    """("$MNT" unset: the empty string was the working directory.)"""
    status, out, err = run_cli(capsys, *argv)
    assert (status, out) == (2, "")
    assert one_line(err).startswith("tierfs: empty ")


@pytest.mark.parametrize("name", ["a\nb", "caf\u00e9", "\u65e5\u672c"])
def test_a_bad_app_name_is_an_option_error(
    name: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    status, _, err = run_cli(
        capsys, "mount", "--dry-run", f"--app-name={name}", "b12", str(tmp_path)
    )
    assert status == 2
    assert "for option 'app-name': expected printable ASCII" in one_line(err)


@pytest.mark.parametrize(
    ("error", "expected"),
    [
        (
            requests.exceptions.InvalidSchema(
                "No connection adapters were found for 'ftp://x/storage/v1/b/b12?maxResults=1'"
            ),
            "bad endpoint: No connection adapters were found for 'ftp://x'",
        ),
        (
            requests.exceptions.InvalidSchema(
                "No connection adapters were found for '::::/storage/v1/b/b12/o?x=1'"
            ),
            "bad endpoint: No connection adapters were found for '::::'",
        ),
        (
            requests.exceptions.InvalidURL("Invalid URL 'http:///storage/v1/b': No host supplied"),
            "bad endpoint: Invalid URL 'http://': No host supplied",
        ),
    ],
)
def test_a_transport_error_says_its_cause(error: Exception, expected: str) -> None:
    assert _describe(error) == expected


@pytest.mark.parametrize("argv", [("--version",), ("mount", "--dry-run", "b12", "/tmp")])
def test_stdout_on_a_full_disk_is_one_line(argv: tuple[str, ...]) -> None:
    with open("/dev/full", "w") as full:
        result = run_script(TIERFS, *argv, stdout=full)
    assert result.returncode == 1
    assert result.stderr == "tierfs: cannot write output: No space left on device\n"


@pytest.mark.parametrize(
    "argv",
    [
        (TIERFS, cmd, flag)
        for cmd in ("stats", "sync", "unmount", "umount", "prefetch", "demo", "install-helper")
        for flag in ("-h", "--help")
    ]
    + [(TIERFS, "mount", "--help"), (TIERFS, "csi", "--help")]
    + [(MOUNT_HELPER, "-h"), (MOUNT_HELPER, "--help")],
)  # fmt: skip
def test_help_for_every_subcommand(argv: tuple[str, ...]) -> None:
    result = run_script(*argv)
    assert (result.returncode, result.stderr) == (0, "")
    assert "usage:" in result.stdout


def test_bare_tierfs_is_the_short_usage_on_stderr(capsys: pytest.CaptureFixture[str]) -> None:
    status, out, err = run_cli(capsys)
    assert (status, out) == (2, "")
    assert err == cli.USAGE


def test_o_equals_nothing_does_not_take_the_next_argument() -> None:
    assert parse_flags(["-o=", "b12", "mnt"]).positional == ["b12", "mnt"]
    assert parse_flags(["-o", "ro", "b12", "mnt"]).positional == ["b12", "mnt"]


def test_the_reader_takes_regular_files_only(tmp_path: Path, fifo: Path) -> None:
    assert stat.S_ISFIFO(fifo.stat().st_mode)
    for path, why in ((fifo, "is not a regular file"), (tmp_path, "Is a directory")):
        with pytest.raises(OSError) as caught:
            read_small_file(str(path))
        assert caught.value.strerror == why
    (tmp_path / "ok.json").write_text(json.dumps({"a": "b"}))
    assert json.loads(read_small_file(str(tmp_path / "ok.json"))) == {"a": "b"}


@pytest.mark.parametrize(
    ("fstype", "served", "ours"),
    [("fuse.sshfs", False, False), ("fuse", False, False), ("fuse", True, True)],
)
def test_unmount_takes_off_only_tierfs_mounts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fstype: str, served: bool, ours: bool
) -> None:
    """`tierfs unmount ~/sshfs` unmounted an sshfs mount: any fuse.* was taken. Only
    fuse.tierfs, or a plain fuse mount (/dev/fd/N) a tierfs daemon serves, is."""
    from tierfs.cli.mountpoint import MountEntry

    point = str(tmp_path)
    unmounted: list[str] = []
    monkeypatch.setattr(daemon, "mounted_here", lambda path: MountEntry("x", point, fstype))
    monkeypatch.setattr(daemon, "daemon_pids", lambda path: [99999999] if served else [])
    monkeypatch.setattr(daemon, "unmount", lambda path, lazy=False: unmounted.append(path))
    monkeypatch.setattr(daemon, "probe", lambda path: daemon.ALIVE)
    if ours:
        daemon.stop(point, timeout_s=1)
        assert unmounted == [point]
    else:
        with pytest.raises(MountError, match=f"is not a tierfs mount \\({fstype}\\)"):
            daemon.stop(point, timeout_s=1)
        assert unmounted == []
