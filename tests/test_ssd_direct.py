"""`tierfs.cache.ssd_direct`: block payloads written past the page cache, the same
bytes as a buffered write, and buffered where the file system refuses ``O_DIRECT``."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tierfs.cache import ssd_direct
from tierfs.cache.buffers import BlockBuffers
from tierfs.cache.ssd_direct import ALIGN, CHUNK_BYTES, write_payload

BLOCK = 64 * 1024


def pattern(n: int, seed: int = 0) -> bytes:
    return bytes((i * 7 + seed) % 251 for i in range(n))


@pytest.fixture
def direct_dir(tmp_path: Path) -> Path:
    """A directory where ``O_DIRECT`` works (not tmpfs): else these tests say why."""
    probe = tmp_path / "probe"
    try:
        os.close(os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_DIRECT, 0o600))
    except OSError as exc:
        pytest.fail(f"{tmp_path} takes no O_DIRECT ({exc}); run the tests on a disk")
    probe.unlink()
    ssd_direct.REFUSED.devices.clear()
    return tmp_path


@pytest.mark.parametrize(
    "length",
    [0, 1, ALIGN - 1, ALIGN, ALIGN + 1, BLOCK, CHUNK_BYTES + 3 * ALIGN + 17, 2 * CHUNK_BYTES],
)
def test_a_payload_reads_back_whole_and_its_aligned_part_skips_the_page_cache(
    direct_dir: Path, length: int
) -> None:
    path = direct_dir / "obj.data"
    data = pattern(length)
    write_payload(path, data, BLOCK, 0o600)
    assert path.read_bytes() == (bytes(BLOCK) + data if data else b"")  # nothing: no extent
    assert os.stat(path).st_mode & 0o777 == 0o600
    fd = os.open(path, os.O_RDONLY)
    try:
        # Dropping pages is best effort (one run in ~20 here kept the page through a drop
        # and a direct write): the direct write must leave it uncached in one of 3 tries.
        cached = []
        for _ in range(3):
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)  # read_bytes cached it: drop
            write_payload(path, data, BLOCK, 0o600)  # and write it again
            if length < ALIGN:
                break
            try:  # directly: the kernel kept no page of it
                os.preadv(fd, [bytearray(ALIGN)], BLOCK, os.RWF_NOWAIT)
            except BlockingIOError:
                break
            cached.append(True)
        assert len(cached) < 3, "the directly written part stayed in the page cache"
    finally:
        os.close(fd)


def test_a_file_system_that_refuses_o_direct_gets_buffered_writes(
    direct_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_open = os.open
    refused = 0

    def no_direct(path: object, flags: int, *args: object) -> int:
        nonlocal refused
        if flags & os.O_DIRECT:
            refused += 1
            raise OSError(errno.EINVAL, "Invalid argument")
        return real_open(path, flags, *args)  # type: ignore[call-overload, no-any-return]

    monkeypatch.setattr(os, "open", no_direct)
    path = direct_dir / "obj.data"
    for index in range(3):
        write_payload(path, pattern(BLOCK, index), index * BLOCK, 0o600)
    assert path.read_bytes() == b"".join(pattern(BLOCK, index) for index in range(3))
    assert refused == 1  # tried once on that device, then not again


@settings(max_examples=40, deadline=None)
@given(
    writes=st.lists(
        st.tuples(st.integers(0, 5), st.integers(0, 3 * ALIGN + 5), st.integers(0, 250)),
        min_size=1,
        max_size=8,
    )
)
def test_payloads_land_as_a_model_file_says(writes: list[tuple[int, int, int]]) -> None:
    """Blocks (overlapping, short, empty, out of order) written into one file: its bytes
    are what writing them in order into a plain bytearray gives."""
    import tempfile

    with tempfile.TemporaryDirectory(dir=os.environ.get("TMPDIR", "/var/tmp")) as root:
        path = Path(root) / "obj.data"
        model = bytearray()
        block = 2 * ALIGN
        for index, length, seed in writes:
            data = pattern(length, seed)
            write_payload(path, data, index * block, 0o600)
            end = index * block + length
            if length and len(model) < end:  # an empty write makes no extent
                model.extend(bytes(end - len(model)))
            model[index * block : end] = data
        assert path.read_bytes() == bytes(model)


@pytest.mark.parametrize("length", [ALIGN, 3 * CHUNK_BYTES + ALIGN, 3 * CHUNK_BYTES + 17])
def test_an_aligned_payload_is_written_straight_from_its_memory(
    direct_dir: Path, monkeypatch: pytest.MonkeyPatch, length: int
) -> None:
    """A block buffer (page-aligned memory) goes to the disk with no copy through the
    aligned buffers, and past the page cache all the same."""

    def no_copy() -> None:
        raise AssertionError("an aligned payload was copied")

    monkeypatch.setattr(ssd_direct._BUFFERS, "one", no_copy)
    view = BlockBuffers(4 * CHUNK_BYTES).take(length)
    view[:] = pattern(length, 5)
    path = direct_dir / "obj.data"
    write_payload(path, view, BLOCK, 0o600)
    fd = os.open(path, os.O_RDONLY)
    try:
        with pytest.raises(BlockingIOError):  # not in the page cache: written directly
            os.preadv(fd, [bytearray(ALIGN)], BLOCK, os.RWF_NOWAIT)
    finally:
        os.close(fd)
    assert path.read_bytes() == bytes(BLOCK) + pattern(length, 5)
