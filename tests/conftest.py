"""Shared pytest fixtures.

GCS: one fake-gcs-server (see ``tierfs.emulator``) serves the whole session; every test
that asks for ``bucket_name`` gets a fresh, uniquely named bucket on it, so tests never see
each other's objects.  Clients use the explicit endpoint, not ``STORAGE_EMULATOR_HOST``.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
from google.cloud import storage

from tierfs.emulator import Emulator

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
