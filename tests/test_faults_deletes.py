"""Deletes whose answer is lost, through a real mount on the emulator behind the fault
proxy: the retry must never delete what another client wrote after the first attempt.

The first DELETE reaches GCS (the object goes) and its answer is held past the request
timeout; before the retry arrives, another client writes the name again
(`_WrittenAgainFirst`, run by the proxy as the retry comes in: no timing involved). A
retry that deletes "whatever is there" removes that client's object; one that names the
generation the mount deleted finds a newer one and leaves it.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from typing import Any

from google.cloud import storage

from tests.conftest import MountFactory
from tests.faults import Action, FaultProxy, Rule

TIMEOUT = "--http-client-timeout=2s"  # the held answer is given up on after 2 s, then retried


class _WrittenAgainFirst(Rule):
    """The first request it matches finds the object written again by another client
    (``write``, run in the proxy's thread before the request goes on; it returns the new
    generation). From then on, a request whose precondition names another generation is
    answered 412, as GCS answers it: the emulator ignores preconditions on deletes."""

    def __init__(self, write: Callable[[], int], **match: Any) -> None:
        super().__init__(Action(status=412), **match)
        self.write = write
        self.generation = 0

    def matches(self, method: str, target: str) -> bool:
        if not super().matches(method, target):
            return False
        if not self.generation:
            self.generation = self.write()
        named = re.search(r"ifGenerationMatch=(\d+)", target)
        return named is not None and int(named.group(1)) != self.generation


def _lose_the_first_delete_then_write(
    fault_proxy: FaultProxy, blob: storage.Blob, data: bytes
) -> tuple[Rule, _WrittenAgainFirst]:
    def write() -> int:
        blob.upload_from_string(data)
        return int(blob.generation or 0)

    target = rf"/o/{blob.name}(\?|$)"
    lost = fault_proxy.faults.add(Rule(Action(stall_s=6), method="DELETE", target=target, nth=1))
    again = fault_proxy.faults.add(_WrittenAgainFirst(write, method="DELETE", target=target))
    return lost, again


def test_an_unlink_whose_answer_is_lost_leaves_what_another_client_wrote_since(
    mount_factory: MountFactory,
    fault_proxy: FaultProxy,
    gcs_client: storage.Client,
    bucket_name: str,
) -> None:
    """``rm f`` (no write-back): its DELETE went through, the answer was lost, another
    client wrote f again, then the retry came. Before, the retry was unconditional and
    deleted the other client's f: gone, though written after the rm."""
    blob = gcs_client.bucket(bucket_name).blob("f.bin")
    blob.upload_from_string(b"old")
    mount = mount_factory(fault_proxy.option, TIMEOUT)
    assert (mount.path / "f.bin").read_bytes() == b"old"
    lost, again = _lose_the_first_delete_then_write(fault_proxy, blob, b"new")
    os.unlink(mount.path / "f.bin")
    assert lost.fired == 1 and again.generation > 0, fault_proxy.faults.log
    deletes = [t for m, t in fault_proxy.faults.seen if m == "DELETE"]
    assert blob.exists() and blob.download_as_bytes() == b"new", deletes


def test_an_rmdir_whose_answer_is_lost_leaves_the_placeholder_another_client_made_since(
    mount_factory: MountFactory,
    fault_proxy: FaultProxy,
    gcs_client: storage.Client,
    bucket_name: str,
) -> None:
    """``rmdir d`` (no write-back): the delete of its placeholder ``d/`` went through, the
    answer was lost, another client made ``d/`` again; the retry leaves it."""
    mount = mount_factory(fault_proxy.option, TIMEOUT)
    os.mkdir(mount.path / "d")
    placeholder = gcs_client.bucket(bucket_name).blob("d/")
    assert placeholder.exists()
    lost, again = _lose_the_first_delete_then_write(fault_proxy, placeholder, b"")
    os.rmdir(mount.path / "d")
    assert lost.fired == 1 and again.generation > 0, fault_proxy.faults.log
    assert placeholder.exists()


def test_a_rename_whose_source_another_client_wrote_again_succeeds_and_leaves_theirs(
    mount_factory: MountFactory,
    fault_proxy: FaultProxy,
    gcs_client: storage.Client,
    bucket_name: str,
) -> None:
    """``mv a b`` (no write-back): the copy to b is made, then another client writes a
    again before the old a's delete. The rename succeeds and their a stays. Before,
    rename() said ESTALE though b was made, and the mount still showed a as before."""
    source = gcs_client.bucket(bucket_name).blob("a.bin")
    source.upload_from_string(b"mine")
    mount = mount_factory(fault_proxy.option)

    def write() -> int:
        source.upload_from_string(b"theirs")
        return int(source.generation or 0)

    again = fault_proxy.faults.add(
        _WrittenAgainFirst(write, method="DELETE", target=r"/o/a\.bin(\?|$)")
    )
    assert (mount.path / "a.bin").read_bytes() == b"mine"
    os.rename(mount.path / "a.bin", mount.path / "b.bin")
    assert again.fired == 1, fault_proxy.faults.log
    assert gcs_client.bucket(bucket_name).blob("b.bin").download_as_bytes() == b"mine"
    assert source.download_as_bytes() == b"theirs"
    assert (mount.path / "b.bin").read_bytes() == b"mine"
