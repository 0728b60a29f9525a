"""The daemon's allocator settings (tierfs.cli.memory): they must take on glibc."""

from __future__ import annotations

import platform

import pytest

from tierfs.cli.memory import MMAP_THRESHOLD_MAX, mmap_threshold, tune_allocator


def test_threshold_sits_just_above_a_block_and_below_glibcs_limit() -> None:
    assert mmap_threshold(8 << 20) == 9 << 20  # 8 MiB blocks from the heap, 1 MiB callocs not
    assert mmap_threshold(1 << 20) == 2 << 20
    assert mmap_threshold(64 << 20) == MMAP_THRESHOLD_MAX


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="mallopt is glibc's")
def test_tuning_takes_on_glibc() -> None:
    assert tune_allocator(8 << 20) is True
