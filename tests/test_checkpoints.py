"""Real checkpoint workloads through a real mount, in each write mode, each read back through
a fresh mount and through the GCS client and compared.

- torch.save / torch.load of a state dict;
- torch.distributed.checkpoint save and load in one process (``.metadata`` is written
  under a temporary name and renamed);
- an Orbax-like step directory: many small files and a few large ones, written under a
  tmp name, renamed when complete, then a commit marker;
- a Determined-style checkpoint: a uuid directory with metadata.json and shard files.

torch comes from the optional ``torch`` extra (``make test`` installs the CPU wheel that
lies on these machines); where it cannot be installed, the torch tests skip saying so.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import uuid
from pathlib import Path
from typing import Any

import pytest
from google.cloud import storage

from tests.conftest import MountFactory
from tests.mounting import TIERFS, Mount

MiB = 1 << 20
MODES = {
    "streaming": [],  # the default: new files are uploaded while written
    "staged": ["--enable-streaming-writes=false"],
    "write-back": ["--write-back"],
}


@pytest.fixture(params=list(MODES))
def writer(request: pytest.FixtureRequest, mount_factory: MountFactory, tmp_path: Path) -> Mount:
    """The mount a checkpoint is written through, in one write mode."""
    # Orbax renames whole step directories: gcsfuse users raise rename-dir-limit for that
    # (its default 0 refuses a directory rename on a flat bucket). Write-back needs no such
    # option: it runs at the defaults a user gets.
    raised = [] if request.param == "write-back" else ["--rename-dir-limit=100000"]
    return mount_factory(*MODES[request.param], f"--cache-dir={tmp_path / 'cache'}", *raised)


def durable(mount: Mount) -> None:
    """What a training job does before it reports a checkpoint: everything in GCS."""
    result = subprocess.run(
        [TIERFS, "sync", str(mount.path)], capture_output=True, text=True, timeout=300
    )
    assert (result.returncode, result.stderr) == (0, "")


def gcs_tree(client: storage.Client, bucket: str, prefix: str = "") -> dict[str, bytes]:
    return {
        b.name: b.download_as_bytes()
        for b in client.list_blobs(bucket, prefix=prefix)
        if not b.name.endswith("/")
    }


def mount_tree(root: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()
    }


def read_back(
    writer: Mount,
    mount_factory: MountFactory,
    client: storage.Client,
    expected: dict[str, bytes],
) -> Mount:
    """The same bytes through GCS and through a fresh mount (no cache shared with the
    writer); returns the fresh mount."""
    durable(writer)
    assert gcs_tree(client, writer.bucket) == expected
    fresh = mount_factory(name="fresh")
    assert mount_tree(fresh.path) == expected
    return fresh


def test_orbax_like_step_directory(
    writer: Mount, mount_factory: MountFactory, gcs_client: storage.Client
) -> None:
    step = {f"state/array_{i:03d}/0.0": os.urandom(1000 + i * 37) for i in range(120)}
    step.update({f"state/big_{i}": os.urandom(9 * MiB + i) for i in range(3)})
    step["state/_METADATA"] = json.dumps({"tree": sorted(step)}).encode()
    tmp = writer.path / "checkpoints" / "step_100.orbax-checkpoint-tmp-1732"
    for name, data in step.items():
        (tmp / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp / name).write_bytes(data)
    os.rename(tmp, writer.path / "checkpoints" / "step_100")
    (writer.path / "checkpoints" / "step_100" / "_CHECKPOINT_METADATA").write_bytes(b"{}")
    expected = {f"checkpoints/step_100/{k}": v for k, v in step.items()}
    expected["checkpoints/step_100/_CHECKPOINT_METADATA"] = b"{}"
    read_back(writer, mount_factory, gcs_client, expected)


def test_determined_style_checkpoint(
    writer: Mount, mount_factory: MountFactory, gcs_client: storage.Client
) -> None:
    storage_id = str(uuid.uuid4())
    shards = {f"shard-{i}-of-4.bin": os.urandom(2 * MiB + i) for i in range(4)}
    directory = writer.path / "checkpoints" / storage_id
    directory.mkdir(parents=True)
    for name, data in shards.items():
        (directory / name).write_bytes(data)
    metadata = json.dumps({"steps_completed": 1000, "framework": "torch"}).encode()
    (directory / "metadata.json").write_bytes(metadata)
    expected = {f"checkpoints/{storage_id}/{k}": v for k, v in shards.items()}
    expected[f"checkpoints/{storage_id}/metadata.json"] = metadata
    read_back(writer, mount_factory, gcs_client, expected)


# --- torch ---------------------------------------------------------------------------------


def torch_or_skip() -> Any:
    return pytest.importorskip(
        "torch", reason="torch is not installed (make test installs the CPU wheel: torch==2.13.0)"
    )


def state_dict(torch: Any) -> dict[str, Any]:
    generator = torch.Generator().manual_seed(7)
    return {
        "layer1.weight": torch.randn(512, 1024, generator=generator),  # 2 MiB
        "layer1.bias": torch.randn(512, generator=generator),
        "layer2.weight": torch.randn(1024, 512, generator=generator, dtype=torch.float64),
        "step": torch.tensor(1000),
    }


def assert_same(torch: Any, got: dict[str, Any], want: dict[str, Any]) -> None:
    assert sorted(got) == sorted(want)
    for key in want:
        assert torch.equal(got[key], want[key]), key


def test_torch_save_and_load(
    writer: Mount, mount_factory: MountFactory, gcs_client: storage.Client
) -> None:
    torch = torch_or_skip()
    state = state_dict(torch)
    torch.save(state, writer.path / "model.pt")
    durable(writer)
    raw = gcs_client.bucket(writer.bucket).blob("model.pt").download_as_bytes()
    assert_same(torch, torch.load(io.BytesIO(raw), weights_only=True), state)
    fresh = mount_factory(name="fresh")
    assert_same(torch, torch.load(fresh.path / "model.pt", weights_only=True), state)


def test_torch_distributed_checkpoint(
    writer: Mount, mount_factory: MountFactory, gcs_client: storage.Client
) -> None:
    torch = torch_or_skip()
    dcp = pytest.importorskip("torch.distributed.checkpoint")
    state = state_dict(torch)
    dcp.save(state, checkpoint_id=str(writer.path / "dcp" / "step_1000"))
    durable(writer)
    names = set(gcs_tree(gcs_client, writer.bucket, "dcp/step_1000/"))
    assert "dcp/step_1000/.metadata" in names
    assert not any(n.endswith(".tmp") for n in names)  # committed by rename, tmp gone
    fresh = mount_factory(name="fresh")
    loaded = {k: torch.zeros_like(v) for k, v in state.items()}
    dcp.load(loaded, checkpoint_id=str(fresh.path / "dcp" / "step_1000"))
    assert_same(torch, loaded, state)
