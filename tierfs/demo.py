"""``tierfs demo``: a guided tour on the embedded emulator, run by ``make run``.

It starts the GCS emulator (fake-gcs-server) on 127.0.0.1, mounts a bucket
exactly as a user would (``tierfs mount --custom-endpoint ...``), writes a
file and a small checkpoint through the mount, reads them back through the
GCS client, shows an object written by "another client" appearing, then
unmounts and stops the emulator. ``--keep`` leaves both running and prints
how to stop them.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from tierfs.emulator import Emulator, EmulatorError

BUCKET = "tierfs-demo"


def say(text: str) -> None:
    print(text, flush=True)


def tierfs(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tierfs", *args], capture_output=True, text=True, check=False
    )


def run_demo(argv: list[str]) -> int:
    keep = "--keep" in argv
    unknown = [a for a in argv if a != "--keep"]
    if unknown:
        print(f"tierfs: unknown demo argument '{unknown[0]}' (only --keep)", file=sys.stderr)
        return 2
    workdir = Path(tempfile.mkdtemp(prefix="tierfs-demo-"))
    mountpoint = workdir / "mnt"
    mountpoint.mkdir()
    # The memory backend: the filesystem one conflates "x" and "x/" (seen on these machines).
    emulator = Emulator(outlive_parent=keep)
    try:
        emulator.start()
    except EmulatorError as err:
        print(f"tierfs: {err}", file=sys.stderr)
        return 1
    mounted = False
    try:
        emulator.create_bucket(BUCKET)
        say(
            f"1. GCS emulator (fake-gcs-server) running at {emulator.endpoint}, bucket gs://{BUCKET}"
        )
        result = tierfs(
            "mount", f"--custom-endpoint={emulator.endpoint}", "--anonymous-access",
            "--implicit-dirs", BUCKET, str(mountpoint),
        )  # fmt: skip
        if result.returncode != 0:
            print(result.stderr.strip(), file=sys.stderr)
            return 1
        mounted = True
        say(f"2. mounted: tierfs mount --custom-endpoint={emulator.endpoint} {BUCKET} {mountpoint}")
        tour(emulator, mountpoint)
        if keep:
            pid = emulator.detach()
            mounted = False
            say("")
            say(f"Left running. The bucket is mounted at {mountpoint}. To stop:")
            say(f"  tierfs unmount {mountpoint} && kill {pid}")
        return 0
    finally:
        if mounted:
            result = tierfs("unmount", str(mountpoint))
            mounted = result.returncode != 0
            say(
                f"6. unmounted {mountpoint}"
                if result.returncode == 0
                else f"unmount failed: {result.stderr.strip()}"
            )
        if emulator.running:
            emulator.stop()
            say("7. emulator stopped")
        if not keep and not mounted:
            shutil.rmtree(workdir, ignore_errors=True)


def tour(emulator: Emulator, mountpoint: Path) -> None:
    client = emulator.client()
    try:
        bucket = client.bucket(BUCKET)
        hello = mountpoint / "hello.txt"
        hello.write_text("Hello from tierfs!\n")
        blob = bucket.get_blob("hello.txt")
        assert blob is not None and blob.download_as_bytes() == hello.read_bytes()
        say(
            f"3. wrote {hello} with open(); the GCS client reads the same bytes from "
            f"gs://{BUCKET}/hello.txt (generation {blob.generation}, {blob.size} bytes)"
        )
        step = mountpoint / "checkpoints" / "step-100"
        step.mkdir(parents=True)
        shards = {f"shard-{i}.bin": os.urandom(256 << 10) for i in range(4)}
        for name, data in shards.items():
            (step / name).write_bytes(data)
        (step / "metadata.json").write_text('{"step": 100, "shards": 4}\n')
        same = all(
            bucket.blob(f"checkpoints/step-100/{n}").download_as_bytes() == d
            for n, d in shards.items()
        )
        say(
            f"4. saved a checkpoint: {len(shards)} shards + metadata.json in {step}; "
            f"in GCS and identical: {same}"
        )
        bucket.blob("datasets/from-another-client.txt").upload_from_string(b"uploaded elsewhere\n")
        listing = sorted(p.name for p in (mountpoint / "datasets").iterdir())
        say(
            "5. an object uploaded by another GCS client shows up in the mount: "
            f"datasets/ -> {listing}"
        )
        say("   objects in the bucket:")
        for item in client.list_blobs(BUCKET):
            say(f"     gs://{BUCKET}/{item.name}  ({item.size} bytes)")
    finally:
        client.close()
