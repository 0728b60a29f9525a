"""Shared pytest fixtures.

GCS: one fake-gcs-server (see ``tierfs.cli.emulator``) serves the whole session; every test
that asks for ``bucket_name`` gets a fresh, uniquely named bucket on it, so tests never see
each other's objects.  Clients use the explicit endpoint, not ``STORAGE_EMULATOR_HOST``.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import pytest
import trio
from google.cloud import storage
from hypothesis import settings

from tests.faults import fault_proxy  # noqa: F401  (a fixture, for the fault tests)
from tests.mounting import Mount
from tierfs.cli.emulator import Emulator

MountFactory = Callable[..., Mount]

# CI explores the same examples every run (a red CI should mean a regression, not a new
# random draw); developers' runs keep exploring new ones.
settings.register_profile("ci", derandomize=True, deadline=None)
if os.environ.get("CI"):
    settings.load_profile("ci")

# --- GCS emulator -----------------------------------------------------------------------


@pytest.fixture(scope="session")
def emulator() -> Iterator[Emulator]:
    """A running emulator, started once per session and always stopped at the end."""
    with Emulator() as emu:
        yield emu


@pytest.fixture
def bucket_name(emulator: Emulator) -> str:
    """Name of a new, empty bucket on the session emulator."""
    name = f"tierfs-test-{uuid.uuid4().hex[:16]}"
    emulator.create_bucket(name)
    return name


@pytest.fixture
def gcs_client(emulator: Emulator) -> Iterator[storage.Client]:
    """A google-cloud-storage client pointed at the session emulator (closed afterwards)."""
    client = emulator.client()
    try:
        yield client
    finally:
        client.close()


# --- real mounts ------------------------------------------------------------------------


@pytest.fixture
def mount_factory(emulator: Emulator, bucket_name: str, tmp_path: Path) -> Iterator[MountFactory]:
    """Mount the test's bucket (or another) with extra options; everything cleaned up after."""
    made: list[Mount] = []

    def make(
        *args: str, bucket: str | None = None, name: str = "mnt", cwd: Path | None = None
    ) -> Mount:
        mount = Mount(
            emulator, bucket or bucket_name, tmp_path / name, tmp_path / f"{name}.log", list(args)
        )
        mount.cwd = cwd
        made.append(mount)
        return mount.start()

    try:
        yield make
    finally:
        for mount in made:
            mount.cleanup()
    for mount in made:
        errors = mount.errors()
        if errors and not mount.expect_errors:
            pytest.fail(f"unexpected errors in the daemon log of {mount.path}: {errors[:3]}")


@pytest.fixture
def mount(mount_factory: MountFactory) -> Mount:
    """The test's bucket, mounted with default options."""
    return mount_factory()


# --- test levels ---------------------------------------------------------------------------
# Every test gets one level marker, so a level runs alone: ``pytest -m unit`` (no emulator,
# no mount), ``-m core`` (the filesystem core over MemoryBucket), ``-m emulator`` (the real
# fake-gcs-server, no mount), ``-m mount`` (real FUSE mounts). `make test` runs them all.
MOUNT_FIXTURES = {"mount", "mount_factory", "mountpoint_dir"}
EMULATOR_FIXTURES = {"emulator", "gcs_client", "bucket_name", "fault_proxy"}
CORE_MODULES = ("tierfs.core.filesystem", "tierfs.storage.memory")
MOUNTING_MODULES = {"test_fstab.py"}  # its emulator tests mount through mount(8)


def _level(item: pytest.Item) -> str:
    names = set(getattr(item, "fixturenames", ()))
    if item.get_closest_marker("mount") or names & MOUNT_FIXTURES:
        return "mount"
    if item.path.name in MOUNTING_MODULES and names & EMULATOR_FIXTURES:
        return "mount"
    if names & EMULATOR_FIXTURES:
        return "emulator"
    module = getattr(item, "module", None)
    source = getattr(module, "__dict__", {})
    if any(getattr(value, "__module__", "") in CORE_MODULES for value in source.values()):
        return "core"
    return "unit"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        level = _level(item)
        if level != "mount" or not item.get_closest_marker("mount"):
            item.add_marker(getattr(pytest.mark, level))


@pytest.fixture
async def nursery() -> AsyncIterator[trio.Nursery]:
    """A nursery for a core test's background tasks, cancelled when the test ends."""
    async with trio.open_nursery() as nursery:
        yield nursery
        nursery.cancel_scope.cancel()
