"""The `Bucket` contract, run against `MemoryBucket` and `GcsBucket` on the emulator.

One suite for both is what makes the in-memory fake trustworthy: every behaviour the
core relies on is checked against an independent GCS implementation talking over real
HTTP.  Where the emulator is known to differ from real GCS, the test states the GCS
behaviour and is marked ``xfail(strict=True)`` for the emulator only: if the emulator
is ever fixed, the strict xfail fails and the mark must go.

Then tests of `GcsBucket` alone (error mapping, retries against a local fake HTTP server
that answers what we tell it, credentials) and of `MemoryBucket`'s test hooks.
"""

from __future__ import annotations

import base64
import gc
import gzip
import json
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import google_crc32c
import pytest
import trio
from google.cloud import storage

from tierfs.cache.buffers import BlockBuffers, pooled
from tierfs.cli.emulator import Emulator
from tierfs.errors import (
    AccessDenied,
    BackendError,
    InvalidName,
    NotFound,
    PreconditionFailed,
    UploadedOtherBytes,
)
from tierfs.storage import STAT_KEYS, Bucket, Listing
from tierfs.storage.gcs import NO_CREDENTIALS, POOL_MAX, GcsBucket, RetrySettings
from tierfs.storage.gcs_auth import _normalize_endpoint
from tierfs.storage.memory import MemoryBucket

KiB = 1024
MiB = 1024 * KiB
FAST_RETRY = RetrySettings(max_attempts=3, initial_sleep_s=0.001, max_sleep_s=0.002)


# --- fixtures -----------------------------------------------------------------------------


@pytest.fixture(params=["memory", "emulator"])
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def bucket(backend: str, request: pytest.FixtureRequest) -> Iterator[Bucket]:
    if backend == "memory":
        yield MemoryBucket("contract")
        return
    emulator: Emulator = request.getfixturevalue("emulator")
    name: str = request.getfixturevalue("bucket_name")
    gcs = GcsBucket.connect(name, endpoint=emulator.endpoint, anonymous=True)
    try:
        yield gcs
    finally:
        gcs.close()


@pytest.fixture
def emulator_diverges(backend: str, request: pytest.FixtureRequest) -> Callable[[str], None]:
    """Call with the reason to mark the current test xfail(strict) on the emulator only."""

    def mark(reason: str) -> None:
        if backend == "emulator":
            request.applymarker(pytest.mark.xfail(strict=True, reason=f"emulator: {reason}"))

    return mark


def names_of(listing: Listing) -> list[str]:
    return [info.name for info in listing.objects]


async def read_all(bucket: Bucket, name: str, generation: int) -> bytes:
    return await bucket.read(name, generation=generation, offset=0, length=1 << 40)


# --- the contract: stat, write, read ------------------------------------------------------


async def test_stat_of_missing_object_is_not_found(bucket: Bucket) -> None:
    with pytest.raises(NotFound):
        await bucket.stat("no/such/object")


async def test_write_bytes_then_stat_and_read(bucket: Bucket) -> None:
    data = os.urandom(10 * KiB)
    info = await bucket.write_bytes("dir/obj.bin", data, if_generation_match=0)
    assert (info.name, info.size, info.metageneration) == ("dir/obj.bin", len(data), 1)
    assert info.generation > 0
    assert info.metadata == {}
    assert info.content_type == "application/octet-stream"
    assert info.crc32c
    assert info.updated_s > 1_600_000_000

    stat = await bucket.stat("dir/obj.bin")
    assert (stat.generation, stat.size, stat.crc32c) == (info.generation, len(data), info.crc32c)

    gen = info.generation
    assert await read_all(bucket, "dir/obj.bin", gen) == data
    assert await bucket.read("dir/obj.bin", generation=gen, offset=100, length=50) == data[100:150]
    # Short at EOF, empty past it, empty for a zero length.
    tail = await bucket.read("dir/obj.bin", generation=gen, offset=len(data) - 10, length=100)
    assert tail == data[-10:]
    assert await bucket.read("dir/obj.bin", generation=gen, offset=len(data), length=10) == b""
    assert await bucket.read("dir/obj.bin", generation=gen, offset=len(data) + 5, length=1) == b""
    assert await bucket.read("dir/obj.bin", generation=gen, offset=0, length=0) == b""
    for offset, length in ((-1, 10), (0, -1)):  # a caller's bug, told alike by both
        with pytest.raises(ValueError, match="negative offset or length"):
            await bucket.read("dir/obj.bin", generation=gen, offset=offset, length=length)


async def test_write_file_round_trip(bucket: Bucket, tmp_path: Path) -> None:
    # Up to 64 MiB one request, above it a resumable upload in 64 MiB chunks: both paths.
    for name, size in (("small", 100 * KiB), ("large", 9 * MiB), ("huge", 64 * MiB + 1)):
        data = os.urandom(size)
        path = tmp_path / name
        path.write_bytes(data)
        info = await bucket.write_file(
            f"files/{name}", str(path), if_generation_match=0, content_type="text/x-test"
        )
        assert (info.size, info.content_type) == (size, "text/x-test")
        crc = base64.b64encode(google_crc32c.Checksum(data).digest()).decode()
        assert info.crc32c == crc
        assert (await bucket.stat(f"files/{name}")).generation == info.generation
        assert await read_all(bucket, f"files/{name}", info.generation) == data
        middle = await bucket.read(f"files/{name}", generation=info.generation, offset=7, length=9)
        assert middle == data[7:16]


async def test_streaming_upload_in_pieces(bucket: Bucket) -> None:
    data = os.urandom(700 * KiB + 3)  # 256 KiB chunks: two full ones, then the rest
    upload = await bucket.open_upload(
        "streamed", if_generation_match=0, chunk_bytes=256 * KiB, content_type="text/x-test"
    )
    with pytest.raises(NotFound):
        await bucket.stat("streamed")  # nothing exists before finish()
    for start in range(0, len(data), 100 * KiB):
        await upload.write(data[start : start + 100 * KiB])
    info = await upload.finish()
    assert (info.size, info.content_type) == (len(data), "text/x-test")
    assert (await bucket.stat("streamed")).generation == info.generation
    assert await read_all(bucket, "streamed", info.generation) == data


async def test_streaming_upload_aborted_makes_no_object(bucket: Bucket) -> None:
    upload = await bucket.open_upload("gone", if_generation_match=0, chunk_bytes=256 * KiB)
    await upload.write(os.urandom(300 * KiB))  # one chunk already sent
    await upload.abort()
    with pytest.raises(NotFound):
        await bucket.stat("gone")


async def test_streaming_upload_precondition(
    bucket: Bucket, emulator_diverges: Callable[[str], None]
) -> None:
    emulator_diverges("ifGenerationMatch is ignored on resumable uploads")
    await bucket.write_bytes("taken", b"first", if_generation_match=0)
    upload = await bucket.open_upload("taken", if_generation_match=0, chunk_bytes=256 * KiB)
    await upload.write(b"second")
    with pytest.raises(PreconditionFailed):
        await upload.finish()


async def test_write_file_of_a_missing_local_file(bucket: Bucket, tmp_path: Path) -> None:
    # A local failure keeps its errno (ENOENT), it is not a storage error.
    with pytest.raises(FileNotFoundError):
        await bucket.write_file("obj", str(tmp_path / "missing"), if_generation_match=0)
    with pytest.raises(NotFound):
        await bucket.stat("obj")


async def test_zero_size_objects(bucket: Bucket, tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.write_bytes(b"")
    for info in (
        await bucket.write_bytes("empty-bytes", b"", if_generation_match=0),
        await bucket.write_file("empty-file", str(empty), if_generation_match=0),
    ):
        assert info.size == 0
        assert (await bucket.stat(info.name)).size == 0
        assert await read_all(bucket, info.name, info.generation) == b""
        assert await bucket.read(info.name, generation=info.generation, offset=3, length=4) == b""


async def test_generations_increase_on_overwrite(bucket: Bucket) -> None:
    generations = []
    previous = 0
    for round_ in range(3):
        info = await bucket.write_bytes("obj", b"v%d" % round_, if_generation_match=previous)
        generations.append(info.generation)
        previous = info.generation
    assert generations == sorted(set(generations))
    stat = await bucket.stat("obj")
    assert stat.generation == generations[-1]
    assert await read_all(bucket, "obj", stat.generation) == b"v2"


async def test_must_not_exist_precondition(bucket: Bucket, tmp_path: Path) -> None:
    first = await bucket.write_bytes("obj", b"first", if_generation_match=0)
    path = tmp_path / "f"
    path.write_bytes(b"second")  # small: a single-request upload, see the next test
    with pytest.raises(PreconditionFailed):
        await bucket.write_bytes("obj", b"second", if_generation_match=0)
    with pytest.raises(PreconditionFailed):
        await bucket.write_file("obj", str(path), if_generation_match=0)
    assert (await bucket.stat("obj")).generation == first.generation


async def test_a_file_upload_failing_its_precondition_on_its_own_bytes_succeeds(
    bucket: Bucket, tmp_path: Path
) -> None:
    """The live object holds exactly the file's bytes (an earlier upload of it whose answer
    was lost, or let go at unmount and sent again from the journal): the upload is made,
    with that generation, not failed as if another writer had won."""
    made = await bucket.write_bytes("obj", b"these bytes", if_generation_match=0)
    path = tmp_path / "f"
    path.write_bytes(b"these bytes")
    info = await bucket.write_file("obj", str(path), if_generation_match=0)
    assert info.generation == made.generation
    path.write_bytes(b"other bytes")
    with pytest.raises(PreconditionFailed):
        await bucket.write_file("obj", str(path), if_generation_match=0)


async def test_stale_generation_precondition(bucket: Bucket, tmp_path: Path) -> None:
    # Single-request sizes only: the emulator ignores ifGenerationMatch on resumable
    # uploads (GCS does not), so > 8 MiB files are not checked here.
    old = await bucket.write_bytes("obj", b"one", if_generation_match=0)
    new = await bucket.write_bytes("obj", b"two", if_generation_match=old.generation)
    path = tmp_path / "f"
    path.write_bytes(b"three")
    with pytest.raises(PreconditionFailed):
        await bucket.write_bytes("obj", b"three", if_generation_match=old.generation)
    with pytest.raises(PreconditionFailed):
        await bucket.write_file("obj", str(path), if_generation_match=old.generation)
    with pytest.raises(PreconditionFailed):  # a generation of a name that does not exist
        await bucket.write_bytes("missing", b"x", if_generation_match=new.generation)
    assert (await bucket.stat("obj")).generation == new.generation
    unconditional = await bucket.write_bytes("obj", b"four", if_generation_match=None)
    assert unconditional.generation > new.generation


async def test_read_of_a_replaced_or_deleted_generation_is_not_found(bucket: Bucket) -> None:
    old = await bucket.write_bytes("obj", b"old data", if_generation_match=0)
    new = await bucket.write_bytes("obj", b"new data", if_generation_match=old.generation)
    with pytest.raises(NotFound):
        await bucket.read("obj", generation=old.generation, offset=0, length=3)
    assert await bucket.read("obj", generation=new.generation, offset=0, length=3) == b"new"
    await bucket.delete("obj")
    with pytest.raises(NotFound):
        await bucket.read("obj", generation=new.generation, offset=0, length=3)


# --- listing ------------------------------------------------------------------------------


async def test_list_with_delimiter(bucket: Bucket) -> None:
    names = [
        "a.txt",
        "top",
        "dir/",  # a directory placeholder, as gcsfuse writes them
        "dir/b",
        "dir/sub/c",
        "dir with space/ü.txt",
        "ünïcödé/x",
        "dirt",
    ]
    async with trio.open_nursery() as nursery:
        for name in names:
            nursery.start_soon(lambda n=name: bucket.write_bytes(n, b"x", if_generation_match=0))

    root = await bucket.list("")
    assert names_of(root) == ["a.txt", "dirt", "top"]
    assert root.prefixes == ("dir with space/", "dir/", "ünïcödé/")

    sub = await bucket.list("dir/")
    assert names_of(sub) == ["dir/", "dir/b"]  # the placeholder lists as an object of its own
    assert sub.prefixes == ("dir/sub/",)

    assert names_of(await bucket.list("dir with space/")) == ["dir with space/ü.txt"]
    partial = await bucket.list("dir")  # a prefix that is not a directory
    assert names_of(partial) == ["dirt"]
    assert partial.prefixes == ("dir with space/", "dir/")
    assert await bucket.list("nothing/") == Listing(objects=(), prefixes=())


async def test_a_listing_names_the_placeholders_of_its_prefixes(bucket: Bucket) -> None:
    """With a delimiter, the prefixes whose own object (``dir/``) exists come with it, so a
    listing says which directories are explicit with no lookup of each; the placeholders
    are not among the objects, and a cut listing names only those of the prefixes kept."""
    for name in ("p/", "p/f", "p/q/", "p/q/x", "p/r/y", "p/s/", "p/t"):
        await bucket.write_bytes(name, b"", if_generation_match=0)
    listing = await bucket.list("p/")
    assert names_of(listing) == ["p/", "p/f", "p/t"]
    assert listing.prefixes == ("p/q/", "p/r/", "p/s/")
    assert [info.name for info in listing.placeholders] == ["p/q/", "p/s/"]
    q = await bucket.stat("p/q/")
    assert listing.placeholders[0].generation == q.generation
    root = await bucket.list("")
    assert (root.prefixes, [i.name for i in root.placeholders]) == (("p/",), ["p/"])
    capped = await bucket.list("p/", max_results=3)
    assert capped.prefixes == ("p/q/",)
    assert [info.name for info in capped.placeholders] == ["p/q/"]
    assert (await bucket.list("p/", delimiter=None)).placeholders == ()


async def test_list_without_delimiter(bucket: Bucket) -> None:
    for name in ("d/a", "d/b/c", "d/b/d/e", "e", "d/"):
        await bucket.write_bytes(name, b"1", if_generation_match=0)
    everything = await bucket.list("", delimiter=None)
    assert names_of(everything) == ["d/", "d/a", "d/b/c", "d/b/d/e", "e"]
    assert everything.prefixes == ()
    assert names_of(await bucket.list("d/b", delimiter=None)) == ["d/b/c", "d/b/d/e"]


async def test_list_max_results_and_start_offset(bucket: Bucket) -> None:
    for name in ("m/a", "m/b/x", "m/b/y", "m/c", "m/d"):
        await bucket.write_bytes(name, b"1", if_generation_match=0)
    # max_results caps objects and prefixes together, in name order.
    capped = await bucket.list("m/", max_results=3)
    assert (names_of(capped), capped.prefixes) == (["m/a", "m/c"], ("m/b/",))
    capped = await bucket.list("m/", max_results=2)
    assert (names_of(capped), capped.prefixes) == (["m/a"], ("m/b/",))
    assert names_of(await bucket.list("m/", delimiter=None, max_results=2)) == ["m/a", "m/b/x"]
    assert names_of(await bucket.list("m/", start_offset="m/c")) == ["m/c", "m/d"]


async def test_list_follows_all_pages(bucket: Bucket, backend: str) -> None:
    # GCS pages at 1,000 entries.  The emulator slows down as a bucket grows (its
    # memory backend scans linearly), so there a small page size does the exercising.
    count = 1_100 if backend == "memory" else 240
    if isinstance(bucket, GcsBucket):
        bucket._page_size = 50
    expected = [f"many/{i:05d}" for i in range(count)]

    async def create(name: str) -> None:
        await bucket.write_bytes(name, b"", if_generation_match=0)

    async with trio.open_nursery() as nursery:
        for name in expected:
            nursery.start_soon(create, name)

    lists_before = bucket.statistics()["lists"]
    listing = await bucket.list("many/", delimiter=None)
    assert names_of(listing) == expected
    if isinstance(bucket, GcsBucket):
        assert bucket.statistics()["lists"] - lists_before == -(-count // 50)
    root = await bucket.list("")
    assert (root.objects, root.prefixes) == ((), ("many/",))


# --- delete, copy, metadata ---------------------------------------------------------------


async def test_delete(bucket: Bucket) -> None:
    info = await bucket.write_bytes("obj", b"x", if_generation_match=0)
    await bucket.delete("obj")
    with pytest.raises(NotFound):
        await bucket.stat("obj")
    with pytest.raises(NotFound):
        await bucket.delete("obj")
    again = await bucket.write_bytes("obj", b"y", if_generation_match=0)
    assert again.generation > info.generation
    await bucket.delete("obj", if_generation_match=again.generation)
    assert await bucket.list("", delimiter=None) == Listing(objects=(), prefixes=())


async def test_delete_with_a_stale_generation_fails(
    bucket: Bucket, emulator_diverges: Callable[[str], None]
) -> None:
    emulator_diverges("delete ignores ifGenerationMatch")
    old = await bucket.write_bytes("obj", b"x", if_generation_match=0)
    new = await bucket.write_bytes("obj", b"y", if_generation_match=old.generation)
    with pytest.raises(PreconditionFailed):
        await bucket.delete("obj", if_generation_match=old.generation)
    assert (await bucket.stat("obj")).generation == new.generation


async def test_copy_of_a_generation(bucket: Bucket) -> None:
    metadata = {"gcsfuse_mtime": "2024-05-06T07:08:09.123456789Z", "k": "v"}
    src = await bucket.write_bytes(
        "src", b"payload", if_generation_match=0, metadata=metadata, content_type="text/plain"
    )
    dst = await bucket.copy("src", "dst", source_generation=src.generation, if_generation_match=0)
    assert (dst.name, dst.size, dst.metageneration) == ("dst", 7, 1)
    assert dict(dst.metadata) == metadata
    assert dst.content_type == "text/plain"
    assert dst.generation != src.generation
    assert await read_all(bucket, "dst", dst.generation) == b"payload"
    assert (await bucket.stat("dst")).generation == dst.generation

    await bucket.write_bytes("src", b"newer", if_generation_match=src.generation)
    with pytest.raises(NotFound):  # that source generation is gone
        await bucket.copy("src", "dst2", source_generation=src.generation, if_generation_match=0)


async def test_copy_destination_precondition(
    bucket: Bucket, emulator_diverges: Callable[[str], None]
) -> None:
    emulator_diverges("copy/rewrite ignore ifGenerationMatch on the destination")
    src = await bucket.write_bytes("src", b"payload", if_generation_match=0)
    dst = await bucket.copy("src", "dst", source_generation=src.generation, if_generation_match=0)
    with pytest.raises(PreconditionFailed):  # the destination exists now
        await bucket.copy("src", "dst", source_generation=src.generation, if_generation_match=0)
    replaced = await bucket.copy(
        "src", "dst", source_generation=src.generation, if_generation_match=dst.generation
    )
    assert replaced.generation > dst.generation


async def test_custom_metadata_round_trip(bucket: Bucket, tmp_path: Path) -> None:
    metadata = {"gcsfuse_mtime": "2024-01-02T03:04:05.123456789Z", "goog-reserved-x": "ü ✓"}
    path = tmp_path / "f"
    path.write_bytes(b"file body")
    written = [
        await bucket.write_bytes("m/bytes", b"b", if_generation_match=0, metadata=metadata),
        await bucket.write_file("m/file", str(path), if_generation_match=0, metadata=metadata),
    ]
    for info in written:
        assert dict(info.metadata) == metadata
        assert dict((await bucket.stat(info.name)).metadata) == metadata
    listed = await bucket.list("m/")
    assert [dict(info.metadata) for info in listed.objects] == [metadata, metadata]


async def test_update_metadata_sets_keys(bucket: Bucket) -> None:
    info = await bucket.write_bytes("obj", b"x", if_generation_match=0, metadata={"a": "1"})
    updated = await bucket.update_metadata(
        "obj", {"b": "2", "gcsfuse_mtime": "2025-01-01T00:00:00Z"}, generation=info.generation
    )
    expected = {"a": "1", "b": "2", "gcsfuse_mtime": "2025-01-01T00:00:00Z"}
    assert dict(updated.metadata) == expected
    assert updated.generation == info.generation  # metadata changes keep the generation
    stat = await bucket.stat("obj")
    assert (dict(stat.metadata), stat.generation) == (expected, info.generation)
    assert await read_all(bucket, "obj", info.generation) == b"x"


async def test_update_metadata_bumps_metageneration(
    bucket: Bucket, emulator_diverges: Callable[[str], None]
) -> None:
    emulator_diverges("patch does not bump metageneration")
    info = await bucket.write_bytes("obj", b"x", if_generation_match=0)
    updated = await bucket.update_metadata("obj", {"a": "1"}, generation=info.generation)
    assert updated.metageneration == info.metageneration + 1
    assert (await bucket.stat("obj")).metageneration == info.metageneration + 1


async def test_update_metadata_removes_a_key(
    bucket: Bucket, emulator_diverges: Callable[[str], None]
) -> None:
    emulator_diverges('patching a key to null leaves it as ""')
    info = await bucket.write_bytes(
        "obj", b"x", if_generation_match=0, metadata={"a": "1", "b": "2"}
    )
    updated = await bucket.update_metadata("obj", {"a": None}, generation=info.generation)
    assert dict(updated.metadata) == {"b": "2"}
    assert dict((await bucket.stat("obj")).metadata) == {"b": "2"}


async def test_update_metadata_of_a_replaced_generation_is_not_found(
    bucket: Bucket, emulator_diverges: Callable[[str], None]
) -> None:
    emulator_diverges("patch ignores the generation and patches the live object")
    old = await bucket.write_bytes("obj", b"x", if_generation_match=0)
    await bucket.write_bytes("obj", b"y", if_generation_match=old.generation)
    with pytest.raises(NotFound):
        await bucket.update_metadata("obj", {"a": "1"}, generation=old.generation)
    assert dict((await bucket.stat("obj")).metadata) == {}


# --- names --------------------------------------------------------------------------------

ODD_NAMES = [
    "a//b",
    "./x",
    "../x",
    "x" * 1024,  # the longest name GCS allows, in bytes
    "é" * 512,  # ... counted in UTF-8 bytes, not characters
    "sp ace/tab\there",
    "#?[]*%+&=;:,@!$'()",
    "trailing/",
    "/leading",
]


@pytest.mark.parametrize("name", ODD_NAMES, ids=lambda n: repr(n[:20]))
async def test_odd_names_round_trip(bucket: Bucket, name: str) -> None:
    info = await bucket.write_bytes(name, b"odd", if_generation_match=0)
    assert info.name == name
    assert (await bucket.stat(name)).generation == info.generation
    assert await read_all(bucket, name, info.generation) == b"odd"
    assert names_of(await bucket.list("", delimiter=None)) == [name]
    copy_name = name[:-1] + "~"  # same length: still valid at 1,024 bytes
    copy = await bucket.copy(
        name, copy_name, source_generation=info.generation, if_generation_match=0
    )
    assert await read_all(bucket, copy.name, copy.generation) == b"odd"
    await bucket.delete(name)
    with pytest.raises(NotFound):
        await bucket.stat(name)
    assert names_of(await bucket.list("", delimiter=None)) == [copy_name]


INVALID_NAMES = [
    "",
    "line\nfeed",
    "carriage\rreturn",
    ".",
    "..",
    "x" * 1025,
    "é" * 513,
    ".well-known/acme-challenge/token",
]


@pytest.mark.parametrize("name", INVALID_NAMES, ids=lambda n: repr(n[:20]))
async def test_names_gcs_rejects(bucket: Bucket, name: str, tmp_path: Path) -> None:
    # GCS refuses these names (the emulator does not): both implementations check
    # them before sending anything, so the answer is the same everywhere.
    path = tmp_path / "f"
    path.write_bytes(b"x")
    src = await bucket.write_bytes("src", b"x", if_generation_match=0)
    with pytest.raises(InvalidName):
        await bucket.write_bytes(name, b"x", if_generation_match=0)
    with pytest.raises(InvalidName):
        await bucket.write_file(name, str(path), if_generation_match=None)
    with pytest.raises(InvalidName):
        await bucket.copy("src", name, source_generation=src.generation, if_generation_match=0)
    assert names_of(await bucket.list("", delimiter=None)) == ["src"]


# --- concurrency and statistics -----------------------------------------------------------


async def test_only_one_of_racing_creators_wins(bucket: Bucket) -> None:
    outcomes: list[str] = []

    async def create(index: int) -> None:
        try:
            await bucket.write_bytes("race", b"%d" % index, if_generation_match=0)
            outcomes.append("won")
        except PreconditionFailed:
            outcomes.append("lost")

    async with trio.open_nursery() as nursery:
        for index in range(8):
            nursery.start_soon(create, index)
    assert sorted(outcomes) == ["lost"] * 7 + ["won"]


async def test_statistics(bucket: Bucket) -> None:
    assert set(bucket.statistics()) == set(STAT_KEYS)
    assert all(value == 0 for value in bucket.statistics().values())
    info = await bucket.write_bytes("obj", b"12345", if_generation_match=0)
    await bucket.stat("obj")
    await bucket.read("obj", generation=info.generation, offset=1, length=3)
    await bucket.list("")
    await bucket.copy("obj", "obj2", source_generation=info.generation, if_generation_match=0)
    await bucket.delete("obj2")
    with pytest.raises(NotFound):
        await bucket.stat("missing")
    stats = bucket.statistics()
    assert stats["uploads"] == 1 and stats["bytes_written"] == 5
    assert stats["stats"] == 2 and stats["errors"] == 0  # "not found" is an answer, not a fault
    assert stats["media_reads"] == 1 and stats["bytes_read"] == 3
    assert stats["lists"] == 1 and stats["copies"] == 1 and stats["deletes"] == 1
    assert stats["requests"] >= 7 and stats["retries"] == 0


async def test_a_streamed_upload_names_its_own_generation_not_the_one_live_after_it(
    emulator: Emulator,
    gcs_client: storage.Client,
    bucket_name: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """BlobWriter drops the answer to the last chunk; finish() read the object back, and
    took whatever generation was live by then: another client's, written in between, was
    reported as ours (its size and CRC32C), and the next upload, conditional on that
    generation, replaced the other client's object. The answer names ours."""
    ours = os.urandom(300 * KiB)
    theirs = b"theirs"
    reload = storage.Blob.reload

    def another_client_first(blob: storage.Blob, *args: object, **kwargs: object) -> None:
        gcs_client.bucket(bucket_name).blob("streamed").upload_from_string(theirs)
        reload(blob, *args, **kwargs)

    monkeypatch.setattr(storage.Blob, "reload", another_client_first)
    gcs = GcsBucket.connect(bucket_name, endpoint=emulator.endpoint, anonymous=True)
    try:
        upload = await gcs.open_upload("streamed", if_generation_match=0, chunk_bytes=256 * KiB)
        await upload.write(ours)
        info = await upload.finish()
    finally:
        gcs.close()
    monkeypatch.undo()
    crc = base64.b64encode(google_crc32c.Checksum(ours).digest()).decode()
    assert (info.size, info.crc32c) == (len(ours), crc)  # before: 6 bytes, theirs
    blob = gcs_client.bucket(bucket_name).get_blob("streamed")
    assert blob is not None and blob.generation == info.generation


async def test_bytes_written_counts_what_reached_the_bucket_once(bucket: Bucket) -> None:
    aborted = await bucket.open_upload("gone", if_generation_match=0, chunk_bytes=256 * 1024)
    await aborted.write(b"x" * 1000)
    await aborted.abort()  # buffered, never sent
    assert bucket.statistics()["bytes_written"] == 0
    upload = await bucket.open_upload("kept", if_generation_match=0, chunk_bytes=256 * 1024)
    for _ in range(3):
        await upload.write(b"y" * 100_000)  # one chunk goes out during the third write
    await upload.finish()
    assert bucket.statistics()["bytes_written"] == 300_000


# --- GcsBucket only: a fake HTTP server answering what each test asks for -----------------


class FakeGcs:
    """A tiny threaded HTTP server on 127.0.0.1 that answers from a script.

    ``answers`` is consumed in order, the last one repeating forever; each is
    ``(status, json_body)``.  ``delay_s`` slows every answer (to observe concurrency).
    """

    def __init__(self, answers: list[tuple[int, dict[str, object]]], delay_s: float = 0.0):
        self.answers = list(answers)
        self.delay_s = delay_s
        self.paths: list[str] = []
        self.in_flight = 0
        self.max_in_flight = 0
        self._lock = threading.Lock()
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def answer(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                if length:
                    self.rfile.read(length)
                status, body = fake.next(self.path)
                payload = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)
                with fake._lock:
                    fake.in_flight -= 1

            do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = answer

            def log_message(self, format: str, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.server.handle_error = lambda request, address: None  # type: ignore[method-assign]
        self.thread = threading.Thread(
            target=self.server.serve_forever, kwargs={"poll_interval": 0.01}, daemon=True
        )

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    @property
    def requests(self) -> int:
        with self._lock:
            return len(self.paths)

    def next(self, path: str) -> tuple[int, dict[str, object]]:
        with self._lock:
            self.paths.append(path)
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
            answer = self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]
        if self.delay_s:
            time.sleep(self.delay_s)
        return answer

    def __enter__(self) -> FakeGcs:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join()


def error(code: int, message: str = "injected") -> tuple[int, dict[str, object]]:
    return code, {"error": {"code": code, "message": message, "errors": [{"message": message}]}}


OBJECT = (
    200,
    {
        "kind": "storage#object",
        "name": "obj",
        "bucket": "b",
        "generation": "1234",
        "metageneration": "1",
        "size": "3",
        "updated": "2024-01-01T00:00:00.000Z",
        "metadata": {"gcsfuse_mtime": "x"},
    },
)


@pytest.fixture
def fake_gcs() -> Iterator[Callable[..., FakeGcs]]:
    servers: list[FakeGcs] = []
    buckets: list[GcsBucket] = []

    def start(answers: list[tuple[int, dict[str, object]]], delay_s: float = 0.0) -> FakeGcs:
        server = FakeGcs(answers, delay_s).__enter__()
        servers.append(server)
        return server

    start.buckets = buckets  # type: ignore[attr-defined]
    try:
        yield start
    finally:
        for gcs in buckets:
            gcs.close()
        for server in servers:
            server.__exit__()
        gc.collect()  # a leaked connection warns here, in the test that leaked it


def connect_fake(fake_gcs: Callable[..., FakeGcs], server: FakeGcs, **kwargs: object) -> GcsBucket:
    kwargs.setdefault("retry", FAST_RETRY)
    gcs = GcsBucket.connect("b", endpoint=server.endpoint, anonymous=True, **kwargs)  # type: ignore[arg-type]
    fake_gcs.buckets.append(gcs)  # type: ignore[attr-defined]
    return gcs


async def test_5xx_is_a_backend_error_after_max_attempts(fake_gcs: Callable[..., FakeGcs]) -> None:
    server = fake_gcs([error(503, "try later")])
    gcs = connect_fake(fake_gcs, server)
    with pytest.raises(BackendError) as caught:
        await gcs.stat("obj")
    message = str(caught.value)
    assert "\n" not in message
    assert message == "gs://b/obj: HTTP 503 try later (gave up after 3 attempts)"
    assert server.requests == 3
    stats = gcs.statistics()
    assert (stats["retries"], stats["errors"], stats["requests"]) == (2, 1, 3)


async def test_a_ranged_read_answered_whole_is_an_error_not_the_wrong_bytes(
    fake_gcs: Callable[..., FakeGcs],
) -> None:
    """An endpoint (a proxy in the way) that ignores Range answers 200 with the object from
    byte 0: those bytes were returned as the bytes at the offset asked for."""
    server = fake_gcs([(200, {"whole": "object from byte 0"})])
    gcs = connect_fake(fake_gcs, server)
    with pytest.raises(BackendError, match="the range was ignored"):
        await gcs.read("obj", generation=1, offset=5, length=8)
    assert len(await gcs.read("obj", generation=1, offset=0, length=8)) == 8  # from 0: fine


async def test_5xx_on_media_reads_and_uploads(fake_gcs: Callable[..., FakeGcs]) -> None:
    server = fake_gcs([error(500)])
    gcs = connect_fake(fake_gcs, server)
    with pytest.raises(BackendError, match="HTTP 500"):
        await gcs.read("obj", generation=5, offset=0, length=10)
    assert server.requests == 3
    with pytest.raises(BackendError, match="gave up after 3 attempts"):
        await gcs.write_bytes("obj", b"x", if_generation_match=0)
    assert server.requests == 6
    with pytest.raises(BackendError):  # unconditional: not safe to retry, one attempt
        await gcs.write_bytes("obj", b"x", if_generation_match=None)
    assert server.requests == 7


async def test_transient_errors_are_retried_until_success(
    fake_gcs: Callable[..., FakeGcs],
) -> None:
    server = fake_gcs([error(503), error(429), OBJECT])
    gcs = connect_fake(fake_gcs, server)
    info = await gcs.stat("obj")
    assert (info.name, info.generation, info.size) == ("obj", 1234, 3)
    assert dict(info.metadata) == {"gcsfuse_mtime": "x"}
    assert server.requests == 3
    assert gcs.statistics()["retries"] == 2


async def test_max_attempts_one_means_no_retry(fake_gcs: Callable[..., FakeGcs]) -> None:
    server = fake_gcs([error(502)])
    gcs = connect_fake(fake_gcs, server, retry=RetrySettings(max_attempts=1))
    with pytest.raises(BackendError, match="HTTP 502"):
        await gcs.stat("obj")
    assert server.requests == 1


async def test_unlimited_attempts_end_at_the_deadline(fake_gcs: Callable[..., FakeGcs]) -> None:
    server = fake_gcs([error(503)])
    settings = RetrySettings(
        max_attempts=0, initial_sleep_s=0.005, max_sleep_s=0.01, deadline_s=0.3
    )
    gcs = connect_fake(fake_gcs, server, retry=settings)
    started = time.monotonic()
    with pytest.raises(BackendError, match=r"HTTP 503 .*\(gave up after 0.3 s, \d+ attempts\)"):
        await gcs.stat("obj")
    assert time.monotonic() - started >= 0.3  # tried until the deadline, not short of it
    assert server.requests > 3  # more than a default cap would allow


async def test_client_errors_are_not_retried(fake_gcs: Callable[..., FakeGcs]) -> None:
    server = fake_gcs([error(403, "caller lacks storage.objects.get")])
    gcs = connect_fake(fake_gcs, server)
    with pytest.raises(AccessDenied, match=r"caller lacks storage\.objects\.get"):
        await gcs.stat("obj")
    server.answers = [error(401)]
    with pytest.raises(AccessDenied):
        await gcs.read("obj", generation=1, offset=0, length=1)
    server.answers = [error(412)]
    with pytest.raises(PreconditionFailed):
        await gcs.delete("obj", if_generation_match=3)
    server.answers = [error(400, "bad request")]
    with pytest.raises(BackendError, match="HTTP 400 bad request"):
        await gcs.update_metadata("obj", {"a": "1"}, generation=3)
    assert server.requests == 4
    assert gcs.statistics()["retries"] == 0


async def test_check_maps_errors_to_one_line_messages(fake_gcs: Callable[..., FakeGcs]) -> None:
    server = fake_gcs([error(403, "no storage.objects.list permission")])
    gcs = connect_fake(fake_gcs, server)
    with pytest.raises(AccessDenied) as denied:
        await gcs.check()
    assert str(denied.value) == (
        "access to bucket 'b' denied: HTTP 403 no storage.objects.list permission"
    )
    server.answers = [error(503)]
    with pytest.raises(BackendError) as unreachable:
        await gcs.check()
    assert str(unreachable.value).startswith("cannot reach bucket 'b': HTTP 503")


async def test_connection_refused_is_a_backend_error() -> None:
    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    settings = RetrySettings(max_attempts=2, initial_sleep_s=0.001, max_sleep_s=0.001)
    gcs = GcsBucket.connect(
        "b", endpoint=f"http://127.0.0.1:{port}", anonymous=True, retry=settings
    )
    try:
        with pytest.raises(BackendError) as caught:
            await gcs.check()
        assert "gave up after 2 attempts" in str(caught.value)
        assert f"connection failed (127.0.0.1:{port})" in str(caught.value)
        assert "\n" not in str(caught.value)
        assert gcs.statistics()["retries"] == 1
    finally:
        gcs.close()


async def test_http_timeout_is_a_retried_backend_error(fake_gcs: Callable[..., FakeGcs]) -> None:
    server = fake_gcs([OBJECT], delay_s=0.3)
    settings = RetrySettings(max_attempts=2, initial_sleep_s=0.001, max_sleep_s=0.001)
    gcs = connect_fake(fake_gcs, server, retry=settings, http_timeout_s=0.05)
    with pytest.raises(BackendError, match=r"timed out .*\(gave up after 2 attempts\)"):
        await gcs.stat("obj")
    assert server.requests == 2


async def test_one_limiter_bounds_concurrent_requests(fake_gcs: Callable[..., FakeGcs]) -> None:
    server = fake_gcs([OBJECT], delay_s=0.05)
    limiter = trio.CapacityLimiter(2)
    gcs = connect_fake(fake_gcs, server, limiter=limiter)
    async with trio.open_nursery() as nursery:
        for _ in range(6):
            nursery.start_soon(gcs.stat, "obj")
    assert server.requests == 6
    assert server.max_in_flight == 2


def test_missing_credentials_is_a_one_line_access_denied(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(tmp_path / "missing.json"))
    monkeypatch.setenv("CLOUDSDK_CONFIG", str(tmp_path / "gcloud"))
    monkeypatch.setenv("NO_GCE_CHECK", "True")
    monkeypatch.delenv("STORAGE_EMULATOR_HOST", raising=False)

    def no_network(*args: object, **kwargs: object) -> None:
        raise AssertionError("credentials lookup must not reach the network")

    monkeypatch.setattr(socket, "create_connection", no_network)
    monkeypatch.setattr(socket.socket, "connect", no_network)
    with pytest.raises(AccessDenied) as caught:
        GcsBucket.connect("b")
    message = str(caught.value)
    assert message.startswith(NO_CREDENTIALS)
    assert "\n" not in message


def test_unusable_key_file_is_access_denied(tmp_path: Path) -> None:
    with pytest.raises(AccessDenied, match="cannot use key file"):
        GcsBucket.connect("b", key_file=str(tmp_path / "nope.json"))
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(AccessDenied, match="cannot use key file"):
        GcsBucket.connect("b", key_file=str(bad))


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ("http://127.0.0.1:4443", "http://127.0.0.1:4443"),
        ("http://127.0.0.1:4443/storage/v1/", "http://127.0.0.1:4443"),
        ("storage.googleapis.com:443", "https://storage.googleapis.com:443"),
    ],
)
def test_endpoint_forms(given: str, expected: str) -> None:
    assert _normalize_endpoint(given) == expected


def test_retry_settings_are_validated() -> None:
    with pytest.raises(ValueError, match="max_attempts"):
        RetrySettings(max_attempts=-1)
    with pytest.raises(ValueError, match="multiplier"):
        RetrySettings(multiplier=0.5)


# --- GcsBucket only: against the emulator -------------------------------------------------


def test_a_custom_endpoint_without_credentials_names_the_flag_to_add(
    emulator: Emulator, bucket_name: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """No silent switch to anonymous access: without ADC, one line says what to add."""
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(tmp_path / "none.json"))
    with pytest.raises(AccessDenied) as caught:
        GcsBucket.connect(bucket_name, endpoint=emulator.endpoint)
    assert str(caught.value) == (
        f"no credentials for {emulator.endpoint}: add --anonymous-access (an emulator) or "
        "--key-file=KEY.json"
    )


async def test_check_on_the_emulator(emulator: Emulator, bucket_name: str) -> None:
    gcs = GcsBucket.connect(bucket_name, endpoint=emulator.endpoint, anonymous=True)
    missing = GcsBucket.connect("tierfs-no-such-bucket", endpoint=emulator.endpoint, anonymous=True)
    try:
        await gcs.check()
        with pytest.raises(NotFound) as caught:
            await missing.check()
        assert str(caught.value) == "bucket 'tierfs-no-such-bucket' does not exist"
    finally:
        gcs.close()
        missing.close()


async def test_objects_made_by_other_clients_are_listed(
    emulator: Emulator, bucket_name: str, gcs_client: storage.Client
) -> None:
    # The emulator accepts a name with a newline (GCS would not): still listed intact.
    raw = gcs_client.bucket(bucket_name)
    for name in ("new\nline", "dir/x"):
        raw.blob(name).upload_from_string(b"1")
    gcs = GcsBucket.connect(bucket_name, endpoint=emulator.endpoint, anonymous=True)
    try:
        listing = await gcs.list("")
        assert (names_of(listing), listing.prefixes) == (["new\nline"], ("dir/",))
        info = listing.objects[0]
        assert await gcs.read("new\nline", generation=info.generation, offset=0, length=9) == b"1"
    finally:
        gcs.close()


async def test_a_gzip_encoded_object_reads_as_its_stored_bytes(
    emulator: Emulator, bucket_name: str, gcs_client: storage.Client
) -> None:
    """An object stored with ``Content-Encoding: gzip`` (``gcloud storage cp -Z``, web
    assets): GCS unzips it for a request that does not accept gzip, and then sends the
    whole object, ignoring the range. Reads ask for the stored bytes, as gcsfuse does, so
    every range is the range of what ``size`` counts."""
    body = gzip.compress(os.urandom(64 * KiB) + b"text " * 20_000)
    blob = gcs_client.bucket(bucket_name).blob("site/app.js")
    blob.content_encoding = "gzip"
    blob.upload_from_string(body, content_type="application/javascript")
    gcs = GcsBucket.connect(bucket_name, endpoint=emulator.endpoint, anonymous=True)
    try:
        info = await gcs.stat("site/app.js")
        assert info.size == len(body)
        whole = await gcs.read(
            "site/app.js", generation=info.generation, offset=0, length=info.size
        )
        assert bytes(whole) == body
        part = await gcs.read("site/app.js", generation=info.generation, offset=1000, length=5000)
        assert bytes(part) == body[1000:6000]
    finally:
        gcs.close()


async def test_a_file_changed_while_it_is_sent_names_the_generation_it_made(
    emulator: Emulator, bucket_name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The checksum is taken, then the body read as it is sent: a file written meanwhile
    sends other bytes. The emulator stores them (GCS would refuse the body): the error
    names the generation made, which is the writer's to replace (`Staged.upload`)."""
    from tierfs.storage import gcs_upload

    path = tmp_path / "f"
    path.write_bytes(b"a" * 1000)

    class Rewritten(gcs_upload._FileBody):
        def __init__(self, head: bytes, fd: int, size: int, tail: bytes) -> None:
            path.write_bytes(b"b" * size)  # a write between the checksum and the send
            super().__init__(head, fd, size, tail)

    monkeypatch.setattr(gcs_upload, "_FileBody", Rewritten)
    gcs = GcsBucket.connect(bucket_name, endpoint=emulator.endpoint, anonymous=True)
    try:
        with pytest.raises(UploadedOtherBytes) as caught:
            await gcs.write_file("f", str(path), if_generation_match=0)
        assert (await gcs.stat("f")).generation == caught.value.generation
        info = await gcs.write_file(
            "f", str(path), if_generation_match=caught.value.generation
        )  # replaced, the precondition being that generation
        assert await gcs.read("f", generation=info.generation, offset=0, length=2000) == (
            b"b" * 1000
        )
    finally:
        gcs.close()


# --- MemoryBucket only: test hooks --------------------------------------------------------


async def test_memory_fault_injection() -> None:
    bucket = MemoryBucket()
    info = await bucket.write_bytes("obj", b"data", if_generation_match=0)
    bucket.fail_next("read", BackendError("injected"), count=2)
    for _ in range(2):
        with pytest.raises(BackendError, match="injected"):
            await bucket.read("obj", generation=info.generation, offset=0, length=4)
    assert await bucket.read("obj", generation=info.generation, offset=0, length=4) == b"data"
    assert bucket.statistics()["errors"] == 2

    bucket.fail_next("write_bytes", PreconditionFailed("lost a race"))
    with pytest.raises(PreconditionFailed):
        await bucket.write_bytes("other", b"x", if_generation_match=None)
    with pytest.raises(NotFound):  # a failed call has no effect
        await bucket.stat("other")

    bucket.fail_next("*", AccessDenied("nope"))
    with pytest.raises(AccessDenied):
        await bucket.list("")
    await bucket.list("")
    with pytest.raises(ValueError, match="unknown operation"):
        bucket.fail_next("open", BackendError("x"))


async def test_memory_latency_uses_trio_time(autojump_clock: trio.testing.MockClock) -> None:
    bucket = MemoryBucket(latency_s=2.5)
    start = trio.current_time()
    info = await bucket.write_bytes("obj", b"x", if_generation_match=0)
    await bucket.read("obj", generation=info.generation, offset=0, length=1)
    assert trio.current_time() - start == pytest.approx(5.0)


def test_memory_other_client_helpers() -> None:
    bucket = MemoryBucket()
    first = bucket.put("a", b"one", metadata={"k": "v"})
    second = bucket.put("a", b"two")
    assert second.generation > first.generation
    assert bucket.get("a") == b"two"
    assert bucket.names() == ["a"]
    bucket.remove("a")
    with pytest.raises(NotFound):
        bucket.get("a")
    with pytest.raises(NotFound):
        bucket.remove("a")
    with pytest.raises(InvalidName):
        bucket.put("bad\nname", b"")
    assert all(value == 0 for value in bucket.statistics().values())


async def test_memory_sees_other_client_changes() -> None:
    bucket = MemoryBucket()
    mine = await bucket.write_bytes("obj", b"mine", if_generation_match=0)
    theirs = bucket.put("obj", b"theirs")
    with pytest.raises(PreconditionFailed):
        await bucket.write_bytes("obj", b"again", if_generation_match=mine.generation)
    with pytest.raises(NotFound):
        await bucket.read("obj", generation=mine.generation, offset=0, length=4)
    assert (await bucket.stat("obj")).generation == theirs.generation


async def test_a_listed_object_is_described_as_its_stat_describes_it(bucket: Bucket) -> None:
    """Listings build their entries from the raw items (no Blob each): every field the
    filesystem reads must come out as a stat of the same object gives it."""
    metadata = {"gcsfuse_mtime": "2024-01-02T03:04:05.123456789Z", "k": "v"}
    await bucket.write_bytes(
        "l/obj", b"12345", if_generation_match=0, metadata=metadata, content_type="text/plain"
    )
    listed = (await bucket.list("l/")).objects
    assert [info.name for info in listed] == ["l/obj"]
    assert listed[0] == await bucket.stat("l/obj")
    assert listed[0].metadata == metadata and listed[0].content_type == "text/plain"


def test_object_resources_parse_rfc3339_times_and_refuse_a_missing_generation() -> None:
    from tierfs.errors import BackendError
    from tierfs.storage.gcs_resource import info_of

    item = {"name": "a", "generation": "7", "size": "3", "updated": "2024-01-02T03:04:05.5Z"}
    info = info_of(item)
    assert (info.generation, info.size, info.metageneration) == (7, 3, 1)
    assert info.updated_s == 1704164645.5
    nanos = info_of({**item, "updated": "2024-01-02T03:04:05.123456789Z"})
    assert abs(nanos.updated_s - 1704164645.123456) < 1e-5
    assert info_of({**item, "updated": "not a time"}).updated_s == 0.0
    with pytest.raises(BackendError, match="without a generation"):
        info_of({"name": "a", "size": "3"})


async def test_a_read_into_a_block_buffer(bucket: Bucket) -> None:
    """``into``: the bytes land in the buffer it gives (asked for with their length, short
    at EOF), which is returned; nothing is asked for past EOF."""
    data = os.urandom(300 * KiB)
    info = await bucket.write_bytes("obj", data, if_generation_match=0)
    pool = BlockBuffers(256 * KiB)
    asked: list[int] = []

    def into(length: int) -> memoryview:
        asked.append(length)
        return pool.take(length)

    for offset, length in ((0, 256 * KiB), (256 * KiB, 256 * KiB), (5, 7)):
        got = await bucket.read("obj", generation=info.generation, offset=offset, length=length)
        again = await bucket.read(
            "obj", generation=info.generation, offset=offset, length=length, into=into
        )
        assert pooled(again)
        assert again == got == data[offset : offset + length]
    assert asked == [256 * KiB, len(data) - 256 * KiB, 7]
    past = await bucket.read(
        "obj", generation=info.generation, offset=len(data), length=9, into=into
    )
    assert past == b""
    assert len(asked) == 3


async def test_a_read_into_a_buffer_tells_its_progress_as_it_fills(bucket: Bucket) -> None:
    """``progress`` hears of the buffer the bytes land in, filled further each time (on
    GCS a MiB at a time: `PROGRESS_BYTES`), and last of all of it; a reader of the start
    of a block waits for no more (`Blocks.get_part`)."""
    data = os.urandom(3 * MiB + 5)
    info = await bucket.write_bytes("obj", data, if_generation_match=0)
    pool = BlockBuffers(4 * MiB)
    told: list[tuple[memoryview, int, bytes]] = []

    def progress(buffer: memoryview, filled: int) -> None:
        told.append((buffer, filled, bytes(buffer[:filled])))

    got = await bucket.read(
        "obj",
        generation=info.generation,
        offset=0,
        length=len(data),
        into=pool.take,
        progress=progress,
    )
    assert got == data and told
    assert all(buffer is got for buffer, _, _ in told)
    fills = [filled for _, filled, _ in told]
    assert fills == sorted(set(fills)) and fills[-1] == len(data)
    assert all(seen == data[:filled] for _, filled, seen in told)  # filled means filled
    if isinstance(bucket, GcsBucket):
        assert fills == [MiB, 2 * MiB, 3 * MiB, len(data)]


async def test_a_read_whose_buffer_is_refused_makes_bytes(bucket: Bucket) -> None:
    """``into`` answering None: the read makes a new bytes object, the same bytes."""
    data = os.urandom(300 * KiB)
    info = await bucket.write_bytes("obj", data, if_generation_match=0)
    got = await bucket.read(
        "obj", generation=info.generation, offset=3, length=100 * KiB, into=lambda n: None
    )
    assert isinstance(got, bytes) and got == data[3 : 3 + 100 * KiB]


async def test_a_huge_max_conns_per_host_still_connects_at_once_and_works(
    emulator: Emulator, bucket_name: str
) -> None:
    """``max-conns-per-host=1000000000``: the HTTP pool was sized to it, and urllib3 makes a
    slot per connection up front (the daemon passed 7 GB and never mounted). The pool
    keeps at most `POOL_MAX` connections; the cap on requests in flight is the option's."""
    gcs = GcsBucket.connect(
        bucket_name, endpoint=emulator.endpoint, anonymous=True, max_connections=10**9
    )
    try:
        adapter = gcs._client._http.get_adapter(emulator.endpoint)
        assert adapter._pool_maxsize <= POOL_MAX + 2
        info = await gcs.write_bytes("x", b"works", if_generation_match=0)
        got = await gcs.read("x", generation=info.generation, offset=0, length=5)
        assert bytes(got) == b"works"
    finally:
        gcs.close()


def test_a_retried_call_holds_no_failed_attempts_locals() -> None:
    """The retry helper keeps each failed attempt's error until the call ends, and each
    error its attempt's frames: a read's 8 MiB block buffer per failed attempt stayed alive
    (outside the RAM tier's budget) until the retries ended and a collection ran."""
    import weakref

    import requests

    from tierfs.storage.retry import _BoundedRetry, _is_transient

    class Buffer:
        pass

    made: list[weakref.ref[Buffer]] = []
    alive_at_attempt: list[int] = []

    def attempt() -> str:
        alive_at_attempt.append(sum(ref() is not None for ref in made))
        buffer = Buffer()  # a local of the failing frame, as a read's block buffer is
        made.append(weakref.ref(buffer))
        if len(made) < 5:
            raise requests.ConnectionError("connection reset")
        return "read"

    retry = _BoundedRetry(
        predicate=_is_transient, initial=0.001, maximum=0.001, multiplier=1, max_attempts=10
    )
    gc.disable()
    try:
        assert retry(attempt)() == "read"
    finally:
        gc.enable()
    assert alive_at_attempt == [0, 0, 0, 0, 0]
