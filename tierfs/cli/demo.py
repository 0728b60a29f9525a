"""``tierfs demo``: a guided tour on the embedded emulator, run by ``make run``.

It starts the GCS emulator (fake-gcs-server) on 127.0.0.1 and mounts a bucket
exactly as a user would, with an SSD tier (``--cache-dir``) and write-back, and
shows what the product is for: a file written through the mount read by the GCS
client; a dataset object read cold from GCS, warm from the RAM tier, and again
after a remount from the SSD tier; a checkpoint saved with write-back, timed until
close() and until durable in GCS (``tierfs sync``); an object from another client
appearing; and the ``tierfs stats`` table. Every command it prints is the command
it ran. Then it unmounts and stops the emulator; ``--keep`` leaves both running
and prints how to stop them.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tierfs.cli.emulator import Emulator, EmulatorError

BUCKET = "tierfs-demo"


def say(text: str) -> None:
    print(text, flush=True)


def tierfs(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tierfs", *args], capture_output=True, text=True, check=False
    )


def shown(args: list[str]) -> str:
    """The command line of ``tierfs(*args)``, as a user would type it."""
    return shlex.join(["tierfs", *args])


def mib_s(size: int, seconds: float) -> str:
    return f"{seconds:.2f} s, {size / (1 << 20) / max(seconds, 1e-6):.0f} MiB/s"


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
    mount_args = [
        "mount", f"--custom-endpoint={emulator.endpoint}", "--anonymous-access",
        "--implicit-dirs", f"--cache-dir={workdir / 'ssd'}", "--write-back",
        BUCKET, str(mountpoint),
    ]  # fmt: skip
    try:
        emulator.create_bucket(BUCKET)
        say(
            f"1. GCS emulator (fake-gcs-server) running at {emulator.endpoint}, bucket gs://{BUCKET}"
        )
        result = tierfs(*mount_args)
        if result.returncode != 0:
            print(result.stderr.strip(), file=sys.stderr)
            return 1
        mounted = True
        say(f"2. mounted: {shown(mount_args)}")
        mounted = tour(emulator, mountpoint, mount_args)
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


def tour(emulator: Emulator, mountpoint: Path, mount_args: list[str]) -> bool:
    """Steps 3-5; True while the bucket is mounted."""
    client = emulator.client()
    mounted = True
    try:
        bucket = client.bucket(BUCKET)
        hello = mountpoint / "hello.txt"
        hello.write_text("Hello from tierfs!\n")
        result = tierfs("sync", str(mountpoint))
        blob = bucket.get_blob("hello.txt")
        assert blob is not None and blob.download_as_bytes() == hello.read_bytes(), result.stderr
        say(
            f"3. wrote {hello} with open(); after `{shown(['sync', str(mountpoint)])}` the GCS "
            f"client reads the same bytes from gs://{BUCKET}/hello.txt "
            f"(generation {blob.generation}, {blob.size} bytes)"
        )

        dataset = os.urandom(64 << 20)
        bucket.blob("datasets/train-000.bin").upload_from_string(dataset)
        path = mountpoint / "datasets" / "train-000.bin"
        say(f"4. reads of gs://{BUCKET}/datasets/train-000.bin (64 MiB, from the GCS client):")
        started = time.monotonic()
        assert path.read_bytes() == dataset
        say(f"   cold, from GCS:            {mib_s(len(dataset), time.monotonic() - started)}")
        started = time.monotonic()
        assert path.read_bytes() == dataset
        say(f"   warm, from the RAM tier:   {mib_s(len(dataset), time.monotonic() - started)}")

        step = mountpoint / "checkpoints" / "step-100"
        shards = {f"shard-{i}.bin": os.urandom(8 << 20) for i in range(8)}
        total = sum(len(d) for d in shards.values())
        started = time.monotonic()
        step.mkdir(parents=True)
        for name, data in shards.items():
            (step / name).write_bytes(data)
        (step / "metadata.json").write_text('{"step": 100, "shards": 8}\n')
        closed = time.monotonic() - started
        result = tierfs("sync", str(mountpoint))
        durable = time.monotonic() - started
        same = result.returncode == 0 and all(
            bucket.blob(f"checkpoints/step-100/{n}").download_as_bytes() == d
            for n, d in shards.items()
        )
        say(f"5. saved a checkpoint with write-back: 8 shards of 8 MiB + metadata.json in {step}")
        say(f"   until every close():       {mib_s(total, closed)}")
        say(f"   until durable in GCS:      {mib_s(total, durable)} "
            f"(`{shown(['sync', str(mountpoint)])}`); in GCS and identical: {same}")  # fmt: skip

        bucket.blob("datasets/from-another-client.txt").upload_from_string(b"uploaded elsewhere\n")
        listing = sorted(p.name for p in (mountpoint / "datasets").iterdir())
        say(f"   an object uploaded by another GCS client shows up: datasets/ -> {listing}")

        result = tierfs("unmount", str(mountpoint))
        mounted = result.returncode != 0
        remount = tierfs(*mount_args)
        mounted = remount.returncode == 0
        if not mounted:
            say(f"remount failed: {remount.stderr.strip()}")
            return False
        before = gcs_media_reads(mountpoint)
        started = time.monotonic()
        assert path.read_bytes() == dataset
        took = time.monotonic() - started
        reads = gcs_media_reads(mountpoint) - before
        say(f"   `{shown(['unmount', str(mountpoint)])}`, then the same mount command again;")
        say(f"   after the remount, from the SSD tier: {mib_s(len(dataset), took)}, "
            f"{reads} GCS media reads")  # fmt: skip
        stats_args = ["stats", str(mountpoint)]
        table = tierfs(*stats_args)
        say(f"   `{shown(stats_args)}`:")
        for line in table.stdout.rstrip().splitlines():
            say(f"     {line}")
        say("   objects in the bucket:")
        for item in client.list_blobs(BUCKET):
            say(f"     gs://{BUCKET}/{item.name}  ({item.size} bytes)")
        return mounted
    finally:
        client.close()


def gcs_media_reads(mountpoint: Path) -> int:
    result = tierfs("stats", "--json", str(mountpoint))
    return int(json.loads(result.stdout)["gcs"]["media_reads"]) if result.returncode == 0 else 0
