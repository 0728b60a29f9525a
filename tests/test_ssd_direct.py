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


@pytest.fixture
def writes(monkeypatch: pytest.MonkeyPatch) -> list[tuple[bool, int, int]]:
    """(with ``O_DIRECT``, offset, bytes) of each pwrite: what went past the page cache.
    (Asked of the calls, not of the page cache after them: the kernel drops a page at
    its own pace, and a page-cache check failed ~1 run in 20, four at once in one CI
    run, with the write done directly all the same.)"""
    direct: dict[int, bool] = {}
    seen: list[tuple[bool, int, int]] = []
    real_open, real_pwrite = os.open, os.pwrite

    def spy_open(path: object, flags: int, *args: object) -> int:
        fd: int = real_open(path, flags, *args)  # type: ignore[call-overload]
        direct[fd] = bool(flags & os.O_DIRECT)
        return fd

    def spy_pwrite(fd: int, data: object, offset: int) -> int:
        wrote = real_pwrite(fd, data, offset)  # type: ignore[arg-type]
        seen.append((direct.get(fd, False), offset, wrote))
        return wrote

    monkeypatch.setattr(os, "open", spy_open)
    monkeypatch.setattr(os, "pwrite", spy_pwrite)
    return seen


def covered(writes: list[tuple[bool, int, int]], directly: bool) -> list[tuple[int, int]]:
    """The (start, end) ranges written with or without ``O_DIRECT``, merged in order."""
    spans: list[tuple[int, int]] = []
    for is_direct, offset, n in writes:
        if is_direct != directly or not n:
            continue
        if spans and spans[-1][1] == offset:
            spans[-1] = (spans[-1][0], offset + n)
        else:
            spans.append((offset, offset + n))
    return spans


@pytest.mark.parametrize(
    "length",
    [0, 1, ALIGN - 1, ALIGN, ALIGN + 1, BLOCK, CHUNK_BYTES + 3 * ALIGN + 17, 2 * CHUNK_BYTES],
)
def test_a_payload_reads_back_whole_and_its_aligned_part_skips_the_page_cache(
    direct_dir: Path, writes: list[tuple[bool, int, int]], length: int
) -> None:
    path = direct_dir / "obj.data"
    data = pattern(length)
    write_payload(path, data, BLOCK, 0o600)
    assert path.read_bytes() == (bytes(BLOCK) + data if data else b"")  # nothing: no extent
    assert os.stat(path).st_mode & 0o777 == 0o600
    aligned = length // ALIGN * ALIGN
    assert covered(writes, directly=True) == ([(BLOCK, BLOCK + aligned)] if aligned else [])
    tail = [(BLOCK + aligned, BLOCK + length)] if length > aligned else []
    assert covered(writes, directly=False) == tail


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
    direct_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
    writes: list[tuple[bool, int, int]],
    length: int,
) -> None:
    """A block buffer (page-aligned memory) goes to the disk with no copy through the
    aligned buffers, and with ``O_DIRECT`` all the same."""

    def no_copy() -> None:
        raise AssertionError("an aligned payload was copied")

    monkeypatch.setattr(ssd_direct._BUFFERS, "one", no_copy)
    view = BlockBuffers(4 * CHUNK_BYTES).take(length)
    view[:] = pattern(length, 5)
    path = direct_dir / "obj.data"
    write_payload(path, view, BLOCK, 0o600)
    aligned = length // ALIGN * ALIGN
    assert covered(writes, directly=True) == [(BLOCK, BLOCK + aligned)]
    assert path.read_bytes() == bytes(BLOCK) + pattern(length, 5)
