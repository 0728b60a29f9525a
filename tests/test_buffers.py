"""`tierfs.cache.buffers`: block buffers are reused only once no view of them is left,
are aligned for ``O_DIRECT``, and the pool keeps no more than it is told."""

from __future__ import annotations

import threading

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tierfs.cache.buffers import BlockBuffers, address_aligned, pooled
from tierfs.cache.ssd_direct import ALIGN

BLOCK = 64 * 1024


def fill(view: memoryview, tag: int) -> None:
    view[:] = bytes([tag % 256]) * len(view)


def test_a_buffer_is_not_reused_while_a_view_of_it_lives() -> None:
    pool = BlockBuffers(BLOCK, keep=8)
    first = pool.take(BLOCK)
    fill(first, 1)
    part = first[100:200]  # a slice outlives the view it came from
    del first
    second = pool.take(BLOCK)
    fill(second, 2)
    assert bytes(part) == b"\x01" * 100
    assert pool.made == 2 and pool.reused == 0
    del part, second
    third = pool.take(10)
    assert len(third) == 10
    assert pool.made == 2 and pool.reused == 1


def test_a_copy_does_not_hold_a_buffer() -> None:
    pool = BlockBuffers(BLOCK, keep=8)
    view = pool.take(BLOCK)
    fill(view, 7)
    copy = bytes(view[:50])
    del view
    again = pool.take(BLOCK)
    fill(again, 8)
    assert copy == b"\x07" * 50
    assert pool.made == 1 and pool.reused == 1


def test_views_held_in_containers_and_other_threads_hold_their_buffer() -> None:
    pool = BlockBuffers(BLOCK, keep=8)
    kept = {"block": pool.take(BLOCK)}
    fill(kept["block"], 3)
    seen: list[bytes] = []
    done = threading.Event()
    release = threading.Event()

    def hold(view: memoryview) -> None:
        done.set()
        release.wait(10)
        seen.append(bytes(view[:4]))

    thread = threading.Thread(target=hold, args=(pool.take(BLOCK),))
    thread.start()
    done.wait(10)
    fresh = pool.take(BLOCK)
    fill(fresh, 9)
    release.set()
    thread.join(10)
    assert pool.made == 3
    assert bytes(kept["block"][:4]) == b"\x03" * 4
    assert seen == [b"\x00" * 4]  # (never filled: nobody wrote into it meanwhile)


def test_idle_buffers_beyond_keep_are_unmapped() -> None:
    pool = BlockBuffers(BLOCK, keep=2)
    views = [pool.take(BLOCK) for _ in range(5)]
    assert pool.made == 5 and len(pool) == 5
    del views
    assert pool.trim() == 2  # (kept for reuse: ``keep`` in all)
    assert pool.unmapped == 3
    pool.take(BLOCK)
    assert pool.made == 5 and pool.reused == 1


def test_buffers_in_use_are_never_unmapped() -> None:
    pool = BlockBuffers(BLOCK, keep=1)
    views = [pool.take(BLOCK) for _ in range(4)]
    for tag, view in enumerate(views):
        fill(view, tag)
    assert pool.trim() == 4
    assert [bytes(view[:1]) for view in views] == [bytes([tag]) for tag in range(4)]


def test_buffers_are_aligned_and_known_as_pooled() -> None:
    pool = BlockBuffers(BLOCK)
    view = pool.take(BLOCK)
    assert address_aligned(view, ALIGN)
    assert address_aligned(view[ALIGN:], ALIGN)
    assert not address_aligned(view[1:], ALIGN)
    assert pooled(view) and pooled(view[5:9])
    assert not pooled(b"x" * BLOCK)
    assert not pooled(memoryview(bytearray(BLOCK)))
    assert not address_aligned(memoryview(b"x" * BLOCK), ALIGN)  # read-only: not asked
    assert not address_aligned(memoryview(bytearray(0)), ALIGN)


@pytest.mark.parametrize("length", [0, -1, BLOCK + 1])
def test_a_buffer_holds_one_block_at_most(length: int) -> None:
    with pytest.raises(ValueError, match="block buffer holds"):
        BlockBuffers(BLOCK).take(length)


def test_takes_from_many_threads_never_share_a_buffer() -> None:
    pool = BlockBuffers(BLOCK, keep=4)
    failures: list[str] = []

    def worker(tag: int) -> None:
        for round_ in range(200):
            view = pool.take(BLOCK)
            fill(view, tag)
            if bytes(view[::4096]) != bytes([tag]) * (BLOCK // 4096):
                failures.append(f"thread {tag} round {round_}: overwritten")
            del view

    threads = [threading.Thread(target=worker, args=(tag,)) for tag in range(1, 7)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert failures == []
    assert pool.made <= 6 + 4  # at most one per thread at a time, and those kept


@settings(max_examples=60, deadline=None)
@given(steps=st.lists(st.tuples(st.booleans(), st.integers(0, 9)), max_size=60))
def test_a_held_view_keeps_its_bytes_whatever_is_taken_and_dropped(
    steps: list[tuple[bool, int]],
) -> None:
    """Any sequence of takes (each filled with its own tag) and drops: every view still
    held reads its own tag, and after a take the pool maps no more than the views held,
    or ``keep`` if that is more."""
    pool = BlockBuffers(BLOCK, keep=3)
    held: list[tuple[int, memoryview]] = []
    for tag, (take, which) in enumerate(steps):
        if take or not held:
            view = pool.take(BLOCK - which)
            fill(view, tag)
            held.append((tag, view))
            assert len(pool) <= max(len(held), 3)
        else:
            held.pop(which % len(held))
        for kept_tag, view in held:
            assert bytes(view[:1]) == bytes([kept_tag % 256])


def test_take_within_refuses_once_keep_buffers_are_in_use() -> None:
    """`take_within` answers None (read into bytes instead) when ``keep`` buffers are all
    held, and a buffer again once one is let go."""
    pool = BlockBuffers(BLOCK, keep=2)
    first, second = pool.take_within(BLOCK), pool.take_within(BLOCK)
    assert first is not None and second is not None
    assert pool.take_within(BLOCK) is None
    assert pool.statistics()["refused"] == 1
    del first
    again = pool.take_within(BLOCK)
    assert again is not None and len(pool) == 2
