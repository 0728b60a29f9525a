"""Faults at the HTTP level through real mounts: the mount stays up, no request waits
past its bound, bytes are never wrong.

The fault proxy (tests/faults.py) stands between the daemon and the emulator; the daemon
reaches it through ``--custom-endpoint`` exactly as it would reach GCS. Bounds are set
low here (a few seconds) so that a test waits for them in seconds; their defaults are
checked where the options are read (test_bounds_default_to_gcsfuse_and_two_minutes).
"""

from __future__ import annotations

import errno
import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import requests
from google.cloud import storage

import mount_options
from tests.conftest import MountFactory
from tests.faults import MEDIA, UPLOADS, Action, FaultProxy, Faults, Rule
from tests.mounting import stats
from tierfs.cli.control import request, socket_path
from tierfs.cli.emulator import Emulator
from tierfs.errors import UploadedOtherBytes
from tierfs.settings import retry as retry_settings
from tierfs.storage import ObjectInfo, gcs_body, gcs_upload
from tierfs.storage.gcs import GcsBucket

pytestmark = pytest.mark.mount


def elapsed(fn, *args) -> tuple[float, object]:
    """(seconds fn(*args) took, what it returned or the OSError it raised)."""
    start = time.monotonic()
    try:
        result: object = fn(*args)
    except OSError as err:
        result = err
    return time.monotonic() - start, result


def log_text(mount) -> str:
    return mount.log.read_text(encoding="utf-8", errors="replace")


# --- the proxy itself ------------------------------------------------------------------------


def test_the_fault_proxy_applies_its_rules(fault_proxy: FaultProxy, bucket_name: str) -> None:
    """Each action does what it says, to the requests its rule names, and only those."""
    url = f"{fault_proxy.endpoint}/storage/v1/b/{bucket_name}/o"
    faults = fault_proxy.faults
    faults.add(Rule(Action(status=503), method="GET", target=r"/o$", nth=1))
    assert requests.get(url, timeout=10).status_code == 503
    assert requests.get(url, timeout=10).status_code == 200  # only the first
    faults.add(Rule(Action(reset=True), target=r"/o\?reset", times=1))
    with pytest.raises(requests.ConnectionError):
        requests.get(url + "?reset=1", timeout=10)
    faults.add(Rule(Action(truncate=True), target=r"/o\?cut", times=1))
    with pytest.raises(requests.RequestException):
        requests.get(url + "?cut=1", timeout=10).json()
    faults.add(Rule(Action(stall_s=1.0), target=r"/o\?slow", times=1))
    took, answer = elapsed(requests.get, url + "?slow=1")
    assert took >= 1.0 and answer.status_code == 200  # type: ignore[union-attr]
    release = threading.Event()
    faults.add(Rule(Action(hold_after=20, release=release), target=r"/o\?held", times=1))
    answers: list[requests.Response] = []
    asking = threading.Thread(target=lambda: answers.append(requests.get(url + "?held=1")))
    asking.start()
    asking.join(0.5)
    assert asking.is_alive() and not answers  # 20 bytes of its head came: no answer yet
    release.set()
    asking.join(10)
    assert answers and answers[0].status_code == 200 and "storage#objects" in answers[0].text
    # A hold the response did not reach (it was shorter) is not the next one's on the link.
    never = threading.Event()
    before = fault_proxy.proxy.bytes_down
    requests.get(url + "?short=0", timeout=10)
    mark = (fault_proxy.proxy.bytes_down - before) * 3 // 2  # within the next answer
    faults.add(Rule(Action(hold_after=mark, release=never), target=r"/o\?short", times=1))
    with requests.Session() as session:
        assert session.get(url + "?short=1", timeout=10).status_code == 200
        assert session.get(url, timeout=10).status_code == 200
    faults.add(Rule(Action(status=500), method="POST"))  # a rule for others: no effect here
    assert requests.get(url, timeout=10).status_code == 200
    assert faults.fired == 6


def test_bounds_default_to_gcsfuse_and_two_minutes() -> None:
    """What a user gets without options: requests give up after 120 s (gcsfuse retries for
    ever), uploads after gcsfuse's chunk deadline (120 s), an upload that sends or hears
    nothing for 10 s is cut, reads follow gcsfuse's read-stall timeout (20 s at first)."""
    line = mount_options.parse_flags([]).parsed
    settings = retry_settings(mount_options.load(line, bucket="b", mountpoint="/mnt"))
    assert settings.deadline_s == 120
    assert settings.upload_deadline_s == 120
    assert settings.upload_stall_s == 10
    assert settings.read_stall is not None and settings.read_stall.enabled
    assert settings.read_stall.initial_s == 20
    line = mount_options.parse_flags(["--request-deadline-secs=0"]).parsed
    settings = retry_settings(mount_options.load(line, bucket="b", mountpoint="/mnt"))
    assert settings.deadline_s is None and settings.upload_deadline_s == 120


# --- requests that keep failing end, and say so while they wait ----------------------------


def test_mkdir_against_a_run_of_500s_fails_within_its_deadline_and_warns(
    mount_factory: MountFactory, fault_proxy: FaultProxy
) -> None:
    """Every request about the new directory is answered 500, for ever: mkdir fails with
    EIO once its deadline (3 s) has passed, a WARNING names the operation and the path
    while it waits, and the mount keeps serving. Once GCS answers again, mkdir works."""
    mount = mount_factory(fault_proxy.option, "--request-deadline-secs=3", "--slow-request-secs=1")
    mount.expect_errors = True
    rule = fault_proxy.faults.add(Rule(Action(status=500), target="stuck"))
    took, result = elapsed(os.mkdir, mount.path / "stuck")
    assert isinstance(result, OSError) and result.errno == errno.EIO
    assert 3 <= took < 20, took
    text = log_text(mount)
    assert "/stuck: still waiting after" in text
    assert "GCS last failed with: HTTP 500" in text
    assert rule.fired >= 2  # it was retried
    assert os.listdir(mount.path) == []  # the mount is up
    assert stats(mount)["requests"]["slow_warnings"] >= 1
    fault_proxy.faults.stop()
    os.mkdir(mount.path / "stuck")
    assert (mount.path / "stuck").is_dir()


def test_close_with_gcs_unreachable_fails_within_the_upload_deadline(
    mount_factory: MountFactory,
    fault_proxy: FaultProxy,
    gcs_client: storage.Client,
    bucket_name: str,
) -> None:
    """Every upload's connection is reset (the endpoint is gone): close() of a new file
    fails with EIO after the upload deadline (3 s), and nothing partial is in the bucket.
    The mount stays up, and the next save goes through once GCS is back."""
    mount = mount_factory(fault_proxy.option, "--chunk-retry-deadline-secs=3")
    mount.expect_errors = True
    fault_proxy.faults.add(Rule(Action(reset=True), target=UPLOADS))
    stream = open(mount.path / "lost.bin", "wb")
    stream.write(b"x" * 100_000)
    took, result = elapsed(stream.close)
    assert isinstance(result, OSError) and result.errno == errno.EIO, result
    assert took < 30, took
    assert [b.name for b in gcs_client.list_blobs(bucket_name)] == []
    fault_proxy.faults.stop()
    (mount.path / "kept.bin").write_bytes(b"y" * 1000)
    assert gcs_client.bucket(bucket_name).blob("kept.bin").download_as_bytes() == b"y" * 1000


# --- stalls are cut, not waited out ----------------------------------------------------------


def test_a_stalled_read_is_cut_and_retried(
    mount_factory: MountFactory,
    fault_proxy: FaultProxy,
    gcs_client: storage.Client,
    bucket_name: str,
) -> None:
    """The first download of an object stalls for 60 s. With a read-stall timeout of 1 s
    the read is cut, retried, and returns the right bytes in seconds; stats count it."""
    data = os.urandom(3 << 20)
    gcs_client.bucket(bucket_name).blob("model.bin").upload_from_string(data)
    mount = mount_factory(fault_proxy.option, "--read-stall-initial-req-timeout=1s")
    rule = fault_proxy.faults.add(Rule(Action(stall_s=60), method="GET", target=MEDIA, times=1))
    took, result = elapsed((mount.path / "model.bin").read_bytes)
    assert result == data
    assert rule.fired == 1 and took < 30, took
    assert stats(mount)["gcs"]["read_stalls"] >= 1


@pytest.mark.parametrize("cut", ["truncate", "reset"])
def test_a_block_download_cut_short_is_fetched_again_never_served_short(
    mount_factory: MountFactory,
    fault_proxy: FaultProxy,
    gcs_client: storage.Client,
    bucket_name: str,
    cut: str,
) -> None:
    """The first media GET of a 20 MiB object loses its connection part way (its head and
    some bytes come, then a reset; or a reset at once): the block is fetched again, and
    the reader gets every byte, never a short or zero-filled block."""
    data = os.urandom(20 << 20)
    gcs_client.bucket(bucket_name).blob("cut.bin").upload_from_string(data)
    mount = mount_factory(fault_proxy.option)
    action = Action(truncate=True) if cut == "truncate" else Action(reset=True)
    rule = fault_proxy.faults.add(Rule(action, method="GET", target=MEDIA, times=1))
    assert (mount.path / "cut.bin").read_bytes() == data
    assert rule.fired == 1


def test_a_stalled_upload_is_cut_and_retried(
    mount_factory: MountFactory,
    fault_proxy: FaultProxy,
    gcs_client: storage.Client,
    bucket_name: str,
) -> None:
    """The answer to the first upload is held back for 60 s (GCS has the object; the
    client does not know). With chunk-transfer-timeout 1 s the upload is cut and sent again;
    the retry's precondition fails because the first attempt made the object, and tierfs
    recognises its own bytes: close() succeeds, the bucket holds the file once, whole."""
    mount = mount_factory(fault_proxy.option, "--chunk-transfer-timeout-secs=1")
    rule = fault_proxy.faults.add(Rule(Action(stall_s=60), method="POST", target=UPLOADS, times=1))
    data = os.urandom(200_000)
    took, result = elapsed((mount.path / "ckpt.bin").write_bytes, data)
    assert result == len(data), result
    assert rule.fired == 1 and took < 30, took
    assert gcs_client.bucket(bucket_name).blob("ckpt.bin").download_as_bytes() == data
    assert (mount.path / "ckpt.bin").read_bytes() == data


# A file over 64 MiB (one chunk) goes up in one request first; a failure of that attempt
# carries on as a resumable upload (gcs_upload.ONE_ATTEMPT_BYTES).
BIG_FILE_BYTES = (64 << 20) + (1 << 20)


@pytest.mark.parametrize("fault", ["503", "reset"])
def test_a_large_upload_whose_one_request_fails_goes_on_resumable(
    mount_factory: MountFactory,
    fault_proxy: FaultProxy,
    gcs_client: storage.Client,
    bucket_name: str,
    fault: str,
) -> None:
    """The first upload request of a 65 MiB staged file fails (an HTTP 503, or the
    connection reset): the upload goes on as a resumable session, close() succeeds, and
    the bucket holds the file whole. Without the fallback the 503 would be retried as
    one request, and the resumable session's own requests would not be there."""
    action = Action(status=503) if fault == "503" else Action(reset=True)
    mount = mount_factory(fault_proxy.option, "--enable-streaming-writes=false")
    rule = fault_proxy.faults.add(
        Rule(action, method="POST", target=r"uploadType=multipart", times=1)
    )
    data = os.urandom(BIG_FILE_BYTES)
    (mount.path / "big.bin").write_bytes(data)
    assert rule.fired == 1
    seen = fault_proxy.faults.seen
    assert any(m == "POST" and "uploadType=resumable" in t for m, t in seen), seen
    assert gcs_client.bucket(bucket_name).blob("big.bin").download_as_bytes() == data


def test_a_large_upload_whose_one_request_answer_is_lost_is_recognised(
    mount_factory: MountFactory,
    fault_proxy: FaultProxy,
    gcs_client: storage.Client,
    bucket_name: str,
) -> None:
    """The answer to a 65 MiB file's one-request upload is held back (GCS has the object):
    the attempt is cut, the resumable upload that follows fails its precondition on our
    own object, and tierfs recognises its bytes: close() succeeds, the object is whole,
    one generation."""
    mount = mount_factory(
        fault_proxy.option, "--enable-streaming-writes=false", "--chunk-transfer-timeout-secs=2"
    )
    rule = fault_proxy.faults.add(
        Rule(Action(stall_s=60), method="POST", target=r"uploadType=multipart", times=1)
    )
    data = os.urandom(BIG_FILE_BYTES)
    took, result = elapsed((mount.path / "big.bin").write_bytes, data)
    assert result == len(data) and rule.fired == 1 and took < 45, (result, took)
    blob = gcs_client.bucket(bucket_name).get_blob("big.bin")
    assert blob is not None and blob.size == len(data)
    assert blob.download_as_bytes() == data
    assert (mount.path / "big.bin").read_bytes() == data


# --- a killed caller is let go ----------------------------------------------------------------


def test_a_process_killed_while_its_lookup_stalls_is_let_go(
    mount_factory: MountFactory,
    fault_proxy: FaultProxy,
    gcs_client: storage.Client,
    bucket_name: str,
) -> None:
    """A stat whose GCS requests stall (15 s) holds its caller in the kernel, where even
    SIGKILL waits for the daemon's answer. The kernel sends FUSE INTERRUPT, and the
    daemon answers EINTR for a request that changes nothing: the killed process is gone
    within seconds, at default options. The mount goes on serving the name.

    (Reads through the page cache are not the case: the kernel sends them in the
    background and lets a killed reader go by itself.)"""
    gcs_client.bucket(bucket_name).blob("stuck.bin").upload_from_string(b"s")
    mount = mount_factory(fault_proxy.option)
    # Every metadata request stalls: the name's stat, and the listing a first lookup
    # starts (its answer would serve the stat).
    rule = fault_proxy.faults.add(Rule(Action(stall_s=15), method="GET", target=r"^/storage/"))
    caller = subprocess.Popen(
        [sys.executable, "-c", f"import os; os.stat({str(mount.path / 'stuck.bin')!r})"]
    )
    try:
        deadline = time.monotonic() + 30
        while rule.fired == 0:  # its lookup's request is now held by the proxy
            assert caller.poll() is None and time.monotonic() < deadline
            time.sleep(0.02)
        started = time.monotonic()
        caller.kill()
        caller.wait(timeout=90)
        took = time.monotonic() - started
        fault_proxy.faults.stop()  # (the requests held already stay held)
    finally:
        if caller.poll() is None:
            caller.kill()
            caller.wait()
    assert took < 5, f"the killed process took {took:.1f} s to go"
    assert stats(mount)["requests"]["interrupted"] == 1
    assert (mount.path / "stuck.bin").read_bytes() == b"s"


# --- a failed fill never ends the daemon -----------------------------------------------------


def test_a_fill_whose_downloads_fail_leaves_the_mount_up(
    mount_factory: MountFactory,
    emulator: Emulator,
    gcs_client: storage.Client,
    bucket_name: str,
    tmp_path: Path,
) -> None:
    """With an SSD tier, a first read starts a fill of the whole object in the background
    (two downloads at a time over a link of 4 MB/s each, so it is still running). Then
    every download fails (503, one attempt allowed): the daemon stays up, ls works, the
    fill's failure is counted, and once GCS answers again the whole object reads back."""
    data = os.urandom(64 << 20)
    gcs_client.bucket(bucket_name).blob("big.bin").upload_from_string(data)
    proxy = FaultProxy(emulator, Faults(), rate_bytes_s=4e6).start()
    try:
        mount = mount_factory(
            proxy.option,
            f"--cache-dir={tmp_path / 'cache'}",
            "--max-retry-attempts=1",
            "--file-cache-parallel-downloads-per-file=2",
        )
        mount.expect_errors = True
        with open(mount.path / "big.bin", "rb") as stream:
            assert stream.read(4096) == data[:4096]
            proxy.faults.add(Rule(Action(status=503), method="GET", target=MEDIA))
            stream.seek(60 << 20)
            with pytest.raises(OSError) as failed:
                stream.read(1 << 20)
            assert failed.value.errno == errno.EIO
        assert proxy.faults.fired >= 1
        assert os.listdir(mount.path) == ["big.bin"]
        assert mount.pids(), "the daemon is gone"
        deadline = time.monotonic() + 60  # the fill's downloads in flight finish first
        while stats(mount)["data"]["fill_errors"] < 1:
            assert time.monotonic() < deadline, "the failed fill was never counted"
            time.sleep(0.1)
        proxy.faults.stop()
        assert (mount.path / "big.bin").read_bytes() == data
    finally:
        proxy.stop()


def test_an_unmount_with_gcs_gone_leaves_write_back_files_to_the_next_mount(
    mount_factory: MountFactory,
    fault_proxy: FaultProxy,
    gcs_client: storage.Client,
    bucket_name: str,
    tmp_path: Path,
) -> None:
    """100 write-back files wait (a long delay) when every upload's connection starts to
    be reset, and so does the delete of an unlinked object. The unmount gives up after
    the first upload that fails its retries (2 s), not after each of them in turn (100 x
    2 s / 16 at a time), nor waits for the delete (it took 300 s more), and says how many
    stay in the journal; the next mount, with GCS back, uploads every one and deletes."""
    gcs_client.bucket(bucket_name).blob("old").upload_from_string(b"gone soon")
    cache = f"--cache-dir={tmp_path / 'cache'}"
    options = ("--write-back", "--write-back-delay-secs=3600", cache)
    mount = mount_factory(fault_proxy.option, "--chunk-retry-deadline-secs=2", *options)
    mount.expect_errors = True
    files = {f"f{i:03d}": os.urandom(1000) for i in range(100)}
    for name, data in files.items():
        (mount.path / name).write_bytes(data)
    fault_proxy.faults.add(Rule(Action(reset=True), target=UPLOADS))
    fault_proxy.faults.add(Rule(Action(reset=True), method="DELETE"))
    os.unlink(mount.path / "old")
    took, result = elapsed(mount.unmount)
    assert result.returncode == 0, result  # type: ignore[union-attr]
    assert took < 10, f"unmount took {took:.1f} s"
    assert "stay in the write-back journal" in log_text(mount)
    assert [blob.name for blob in gcs_client.list_blobs(bucket_name)] == ["old"]
    mount_factory(*options, name="again")  # straight to the emulator
    deadline = time.monotonic() + 60
    while sorted(b.name for b in gcs_client.list_blobs(bucket_name)) != sorted(files):
        assert time.monotonic() < deadline, "the next mount did not upload them, or delete"
        time.sleep(0.1)
    bucket = gcs_client.bucket(bucket_name)
    assert {n: bucket.blob(n).download_as_bytes() for n in files} == files


def test_a_create_behind_a_delete_gcs_refuses_fails_in_seconds_then_works(
    mount_factory: MountFactory,
    gcs_client: storage.Client,
    bucket_name: str,
    tmp_path: Path,
    fault_proxy: FaultProxy,
) -> None:
    """``rm f; touch f`` with write-back where GCS refuses the delete (403: a role without
    storage.objects.delete): the create waited for the delete, retried for ever, and hung
    in D state. It fails with EIO once two attempts failed, and works once one succeeds."""
    gcs_client.bucket(bucket_name).blob("f").upload_from_string(b"old")
    mount = mount_factory(fault_proxy.option, "--write-back", f"--cache-dir={tmp_path / 'c'}")
    mount.expect_errors = True
    refused = fault_proxy.faults.add(Rule(Action(status=403), method="DELETE", times=2))
    os.unlink(mount.path / "f")

    def create() -> None:
        (mount.path / "f").write_bytes(b"new")

    start = time.monotonic()
    with pytest.raises(OSError) as failed:
        create()
    took = time.monotonic() - start
    assert failed.value.errno == errno.EIO
    assert took < 30, f"the create took {took:.1f} s"
    assert refused.fired == 2
    deadline = time.monotonic() + 60
    while True:  # the third attempt, 10 s later, goes through
        try:
            create()
            break
        except OSError as err:
            assert err.errno == errno.EIO and time.monotonic() < deadline
            time.sleep(0.5)
    assert "error" not in request(str(mount.path), "sync", 60, {"path": ""})
    assert gcs_client.bucket(bucket_name).blob("f").download_as_bytes() == b"new"


def test_a_file_opened_by_a_thread_since_exited_reports_its_upload_error_at_close(
    fault_proxy: FaultProxy,  # (first: it outlives the mount, whose unmount uploads the file)
    mount_factory: MountFactory,
    gcs_client: storage.Client,
    bucket_name: str,
) -> None:
    """A worker thread opens and writes a file, then exits; the main thread closes it and
    GCS refuses the upload (403). close() reports EACCES: it waited for the upload. Before,
    the gone opener read as another process, close() returned 0 at once, and the upload
    failed at RELEASE, where no one saw it."""
    mount = mount_factory(fault_proxy.option)
    mount.expect_errors = True
    fds: list[int] = []

    def writer() -> None:
        fds.append(os.open(mount.path / "f.bin", os.O_CREAT | os.O_WRONLY))
        os.write(fds[0], b"from a worker thread")

    worker = threading.Thread(target=writer)
    worker.start()
    worker.join()
    refused = fault_proxy.faults.add(Rule(Action(status=403), method="POST", target=UPLOADS))
    with pytest.raises(OSError) as closed:
        os.close(fds[0])
    assert closed.value.errno == errno.EACCES and refused.fired >= 1
    assert gcs_client.bucket(bucket_name).get_blob("f.bin") is None
    fault_proxy.faults.stop()
    assert mount.unmount().returncode == 0  # the write still pending goes up now
    uploaded = gcs_client.bucket(bucket_name).blob("f.bin").download_as_bytes()
    assert uploaded == b"from a worker thread"


# --- a control client that leaves early -------------------------------------------------------


def test_a_sync_client_that_leaves_before_the_answer_does_not_end_the_mount(
    mount_factory: MountFactory,
    fault_proxy: FaultProxy,
    gcs_client: storage.Client,
    bucket_name: str,
) -> None:
    """`tierfs sync` with a timeout (the CSI plugin's unpublish) or Ctrl-C leaves while the
    daemon still waits on an upload (held 3 s here). The answer then finds no reader: the
    daemon drops it and goes on; it used to end the whole mount with a broken pipe."""
    mount = mount_factory(fault_proxy.option, "--write-back")
    rule = fault_proxy.faults.add(Rule(Action(stall_s=3), method="POST", target=UPLOADS, times=1))
    (mount.path / "slow.bin").write_bytes(b"z" * 50_000)
    with pytest.raises(TimeoutError):
        request(str(mount.path), "sync", 0.5, {"path": ""})
    assert request(str(mount.path), "sync", 60, {"path": ""}) == {
        "mountpoint": str(mount.path),
        "synced": True,
    }
    assert rule.fired == 1
    assert gcs_client.bucket(bucket_name).blob("slow.bin").download_as_bytes() == b"z" * 50_000
    assert (mount.path / "slow.bin").stat().st_size == 50_000


def test_a_malformed_control_request_is_answered_and_the_mount_lives_on(
    mount_factory: MountFactory,
) -> None:
    """A request whose JSON nests past Python's recursion limit raised RecursionError in
    the control server (only ValueError was caught), which ended the daemon's nursery: the
    mount died. It is one error answer now; a client that sends nothing holds nobody up."""
    mount = mount_factory()
    (mount.path / "f").write_bytes(b"still here")
    idle = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    idle.connect(str(socket_path(str(mount.path))))  # connects, never sends a line
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as client:
            client.settimeout(30)
            client.connect(str(socket_path(str(mount.path))))
            client.sendall(b"sync " + b"[" * 100_000 + b"\n")
            answer = client.makefile("rb").readline()
        assert json.loads(answer) == {"error": "unknown request"}
        assert request(str(mount.path), "stats", 30)["mountpoint"] == str(mount.path)
        assert (mount.path / "f").read_bytes() == b"still here"
    finally:
        idle.close()


@pytest.mark.parametrize("cut", ["middle", "last"])
def test_a_streamed_file_whose_chunk_answer_is_lost_closes_without_estale(
    mount_factory: MountFactory,
    fault_proxy: FaultProxy,
    gcs_client: storage.Client,
    bucket_name: str,
    cut: str,
) -> None:
    """At the defaults a large file streams as it is written, in 32 MiB chunks. The answer
    to one chunk is cut after GCS took it:
    * the last: the object is made; the session then says 404, and the whole upload that
      follows fails its precondition on that object, which holds our bytes;
    * one in the middle: the emulator takes the chunk again when it is re-sent, and the
      session makes an object of other bytes (CRC32C mismatch), our own generation.
    Either way close() succeeds and the object holds the file. Before, close() said ESTALE
    (every streaming 1 GiB cell of the full bench failed so)."""
    mount = mount_factory(fault_proxy.option)
    data = os.urandom(BIG_FILE_BYTES)
    chunks = -(-len(data) // (32 << 20))  # (write:block-size-mb 32: the chunk, by default)
    rule = fault_proxy.faults.add(
        Rule(
            Action(truncate=True),
            method="PUT",
            target=UPLOADS,
            nth=chunks if cut == "last" else 2,
            times=1,
        )
    )
    took, result = elapsed((mount.path / "streamed.bin").write_bytes, data)
    assert result == len(data) and rule.fired == 1 and took < 60, (result, took)
    blob = gcs_client.bucket(bucket_name).get_blob("streamed.bin")
    assert blob is not None and blob.download_as_bytes() == data
    assert (mount.path / "streamed.bin").read_bytes() == data


@pytest.mark.parametrize("cut", ["middle", "last"])
def test_a_staged_upload_whose_chunk_answer_is_lost_closes(
    mount_factory: MountFactory,
    fault_proxy: FaultProxy,
    gcs_client: storage.Client,
    bucket_name: str,
    cut: str,
) -> None:
    """A staged file over 64 MiB goes on as a resumable session (its one request fails),
    and the answer to the session's 2nd chunk is cut after GCS took it:
    * the last (65 MiB): the object is made and the session then says 404. GCS's answer
      to a 404 is to start again; the new session fails its precondition on the object,
      which holds our bytes;
    * one in the middle (130 MiB): the emulator appends the re-sent chunk twice and the
      session makes an object of other bytes, our own generation; one more session
      replaces it.
    close() succeeds and the bucket holds the file. Before, close() said ENOENT and EIO
    (the full bench's 1 GiB staged write failed so). No DELETE is sent: the library's own
    delete of "the corrupted object" named no generation (another client's object, written
    meanwhile, would have gone), and on GCS it left the next session's precondition, on
    the deleted generation, failing."""
    mount = mount_factory(fault_proxy.option, "--enable-streaming-writes=false")
    first = fault_proxy.faults.add(
        Rule(Action(status=503), method="POST", target=r"uploadType=multipart", times=1)
    )
    lost = fault_proxy.faults.add(  # the 2nd of 2 chunks (65 MiB), or of 3 (130 MiB)
        Rule(Action(truncate=True), method="PUT", target=UPLOADS, nth=2, times=1)
    )
    data = os.urandom(BIG_FILE_BYTES if cut == "last" else 2 * BIG_FILE_BYTES)
    took, result = elapsed((mount.path / "big.bin").write_bytes, data)
    assert result == len(data) and first.fired == 1 and lost.fired == 1, (result, took)
    assert [t for m, t in fault_proxy.faults.seen if m == "DELETE"] == []
    blob = gcs_client.bucket(bucket_name).get_blob("big.bin")
    assert blob is not None and blob.download_as_bytes() == data
    assert (mount.path / "big.bin").read_bytes() == data


async def upload_with_its_answer_lost(
    fault_proxy: FaultProxy,
    bucket_name: str,
    path: Path,
    monkeypatch: pytest.MonkeyPatch,
    before_body: Callable[[int], None],
) -> ObjectInfo:
    """`GcsBucket.write_file` of ``path`` as object "a" (one request), the answer to its
    first attempt cut (GCS made the object); ``before_body(n)`` runs as the n-th attempt's
    body is made (the file's crc32c already taken)."""
    made, bodies = gcs_upload._FileBody, [0]

    def body(head: bytes, fd: int, size: int, tail: bytes) -> gcs_upload._FileBody:
        bodies[0] += 1
        before_body(bodies[0])
        return made(head, fd, size, tail)

    monkeypatch.setattr(gcs_upload, "_FileBody", body)
    lost = fault_proxy.faults.add(
        Rule(Action(truncate=True), method="POST", target=r"uploadType=multipart", times=1)
    )
    bucket = GcsBucket.connect(bucket_name, endpoint=fault_proxy.endpoint, anonymous=True)
    try:
        return await bucket.write_file("a", str(path), if_generation_match=0)
    finally:
        bucket.close()
        assert lost.fired == 1 and bodies[0] == 2


async def test_an_upload_made_whose_answer_was_lost_is_ours_though_the_file_then_shrank(
    fault_proxy: FaultProxy,
    gcs_client: storage.Client,
    bucket_name: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A one-request upload whose answer is cut (GCS made the object), and whose file is
    truncated before the retry (a write-back upload while the file is written again):
    the retry finds the file short. The live object holds exactly what the first attempt
    sent, so the upload succeeded, with that generation. Before, it failed (ValueError),
    and the object was there unknown to the file: a rename left it behind (the fault-model
    run listed a file renamed away), and the next upload failed its precondition on it."""
    path = tmp_path / "staged"
    data = os.urandom(113_406)
    path.write_bytes(data)

    def shrink(attempt: int) -> None:
        if attempt == 2:  # the retry: the file was written again meanwhile, shorter
            os.truncate(path, 15_439)

    info = await upload_with_its_answer_lost(fault_proxy, bucket_name, path, monkeypatch, shrink)
    blob = gcs_client.bucket(bucket_name).get_blob("a")
    assert blob is not None and info.generation == blob.generation
    assert blob.download_as_bytes() == data


async def test_an_upload_whose_file_changed_as_it_went_and_whose_answer_was_lost_is_ours(
    fault_proxy: FaultProxy,
    gcs_client: storage.Client,
    bucket_name: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The file is written again while its one-request upload is sent (write-back does
    not hold writes for an upload): the body goes out other than its declared crc32c.
    GCS refuses such a body; the emulator stores it, and here its answer is cut. The
    retry fails its precondition on that object. It holds the bytes that attempt sent,
    so it is ours, of other bytes: `UploadedOtherBytes` with its generation (the next
    upload replaces it), not a precondition failure (a conflict: the file set aside and
    ESTALE at close, as the fault-model run with seed 303 found)."""
    path = tmp_path / "staged"
    path.write_bytes(os.urandom(100_000))

    def write(attempt: int) -> None:
        if attempt == 1:
            with open(path, "r+b") as again:
                again.write(os.urandom(1000))

    with pytest.raises(UploadedOtherBytes) as raised:
        await upload_with_its_answer_lost(fault_proxy, bucket_name, path, monkeypatch, write)
    blob = gcs_client.bucket(bucket_name).get_blob("a")
    assert blob is not None and raised.value.generation == blob.generation


def test_a_create_gcs_refuses_leaves_no_file_behind(
    fault_proxy: FaultProxy,
    mount_factory: MountFactory,
    gcs_client: storage.Client,
    bucket_name: str,
) -> None:
    """With ``create-empty-file`` (which streaming writes turn off, as in gcsfuse), GCS
    answers 403 to the empty object a create makes:
    open() fails with EACCES, and no file is left in the mount or the bucket. (A 0-byte
    file was listed and looked up, and the unmount's sync uploaded it.)"""
    mount = mount_factory(
        fault_proxy.option, "--enable-streaming-writes=false", "--create-empty-file"
    )
    mount.expect_errors = True
    fault_proxy.faults.add(Rule(Action(status=403), method="POST", target=UPLOADS))
    with pytest.raises(PermissionError):
        (mount.path / "refused.bin").open("wb")
    assert not (mount.path / "refused.bin").exists()
    assert "refused.bin" not in os.listdir(mount.path)
    fault_proxy.faults.stop()
    assert mount.unmount().returncode == 0
    assert [b.name for b in gcs_client.list_blobs(bucket_name)] == []


def test_a_one_request_uploads_answer_is_waited_for_by_size_within_a_ceiling() -> None:
    """One stall bound per 64 MiB of body, as resumable chunks would each have, but never
    more than two minutes: a 4 GiB file's lost answer held close() 640 s at the default,
    and an hour with the chunk timeout off (its bound then the 60 s client timeout)."""
    answer_timeout = gcs_body.answer_timeout
    assert answer_timeout(10, 1) == (10, 10)
    assert answer_timeout(10, 65 << 20) == (10, 20)
    assert answer_timeout(10, 4 << 30) == (10, gcs_body.ANSWER_WAIT_MAX_S) == (10, 120)
    assert answer_timeout(60, 4 << 30) == (60, 120)
    assert answer_timeout(300, 4 << 30) == (300, 300)  # never below one stall bound
    assert answer_timeout(0, 4 << 30) is None


def test_a_slow_answer_to_a_big_one_request_upload_is_waited_for(
    mount_factory: MountFactory,
    fault_proxy: FaultProxy,
    gcs_client: storage.Client,
    bucket_name: str,
) -> None:
    """A staged file of two chunks' worth (65 MiB) goes up as one request, whose answer the
    proxy holds 13 s: more than the 10 s stall bound, less than one per 64 MiB of body.
    The upload waits for it: the bytes go up once, close() succeeds. (Cut at 10 s, the
    upload went on in resumable chunks, sending everything again; on the emulator, whose
    answers take O(size), a staged 1 GiB write then lost its session: ENOENT.)"""
    mount = mount_factory(fault_proxy.option, "--enable-streaming-writes=false")
    data = os.urandom(65 << 20)
    rule = fault_proxy.faults.add(
        Rule(Action(stall_s=13), method="POST", target=r"uploadType=multipart", times=1)
    )
    before = fault_proxy.proxy.bytes_up
    (mount.path / "big.bin").write_bytes(data)
    assert rule.fired == 1
    assert fault_proxy.proxy.bytes_up - before < 1.5 * len(data)
    assert gcs_client.bucket(bucket_name).blob("big.bin").download_as_bytes() == data
