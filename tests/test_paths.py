"""Path options are absolute before the daemon starts, and unusable directories fail the mount.

The daemon serves from ``/`` (it leaves the caller's directory so it does not hold it
busy), so a relative ``--cache-dir cache`` used to name ``/cache/...`` for every block
after the mount: an SSD tier that cached nothing and a write-back mount whose every
create failed, both silently. Each input form is checked through the real console
scripts' ``--dry-run`` JSON, run from a working directory of its own; the mounts start
``tierfs mount`` from a directory other than the test's.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from google.cloud import storage

from mount_options import parse_flags
from mount_options.kinds import PATH
from mount_options.schema import SCHEMA
from tests.conftest import MountFactory
from tests.mounting import BIN, require_fuse, stats
from tierfs.cli.main import MOUNT_EXTRAS, effective_config

TIERFS = str(BIN / "tierfs")
MOUNT_HELPER = str(BIN / "mount.tierfs")
MiB = 1 << 20


def dry_run(cwd: Path, *command: str) -> dict:
    result = subprocess.run(
        [*command, "--dry-run"], capture_output=True, text=True, timeout=120, cwd=cwd
    )
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    return json.loads(result.stdout)


def value(effective: dict, path: str) -> str:
    return effective["options"][path]["value"]


FORMS = [
    pytest.param(
        [TIERFS, "mount", "--cache-dir", "cache", "--temp-dir=tmp", "--log-file", "log/t.log",
         "--key-file=k.json", "bkt", "mnt"],
        {"cache-dir": "cache", "file-system:temp-dir": "tmp", "logging:file-path": "log/t.log",
         "gcs-auth:key-file": "k.json"},
        id="flags",
    ),
    pytest.param(
        [TIERFS, "mount", "-o", "cache_dir=cache,temp_dir=./tmp,log_file=../up.log", "bkt", "mnt"],
        {"cache-dir": "cache", "file-system:temp-dir": "tmp", "logging:file-path": "../up.log"},
        id="dash-o",
    ),
    pytest.param(
        [TIERFS, "mount", "-o", "file-system:temp-dir:tmp,workload-insight:output-file:wi.json",
         "bkt", "mnt"],
        {"file-system:temp-dir": "tmp", "workload-insight:output-file": "wi.json"},
        id="colon-form",
    ),
    pytest.param(
        [MOUNT_HELPER, "bkt", "mnt", "-o", "rw,_netdev,cache_dir=cache,temp_dir=tmp"],
        {"cache-dir": "cache", "file-system:temp-dir": "tmp"},
        id="fstab-helper",
    ),
    pytest.param(
        [TIERFS, "mount", "--config-file=conf.yaml", "bkt", "mnt"],
        {"config-file": "conf.yaml", "cache-dir": "cache", "file-system:temp-dir": "tmp",
         "logging:file-path": "logs/t.log"},
        id="config-file",
    ),
    pytest.param(
        [TIERFS, "mount", "--csi-volume-attributes",
         '{"mountOptions": "file-cache:shared-cache-dir:share,'
         'workload-insight:output-file:wi.json"}',
         "bkt", "mnt"],
        # (not temp-dir: the CSI driver owns it, in its colon form too)
        {"file-cache:shared-cache-dir": "share", "workload-insight:output-file": "wi.json"},
        id="csi-attributes",
    ),
]  # fmt: skip


@pytest.mark.parametrize(("command", "relative"), FORMS)
def test_every_input_form_gives_absolute_paths(
    tmp_path: Path, command: list[str], relative: dict[str, str]
) -> None:
    work = tmp_path / "work"
    work.mkdir()
    (work / "conf.yaml").write_text(
        "cache-dir: cache\nfile-system:\n  temp-dir: tmp\nlogging:\n  file-path: logs/t.log\n"
    )
    effective = dry_run(work, *command)
    for path, given in relative.items():
        assert value(effective, path) == os.path.normpath(work / given), path
    assert effective["mountpoint"] == str(work / "mnt")


def test_home_is_expanded(tmp_path: Path) -> None:
    env = {**os.environ, "HOME": str(tmp_path / "home")}
    result = subprocess.run(
        [TIERFS, "mount", "--dry-run", "--cache-dir=~/cache", "bkt", "mnt"],
        capture_output=True, text=True, timeout=120, cwd=tmp_path, env=env,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert value(json.loads(result.stdout), "cache-dir") == str(tmp_path / "home" / "cache")


@pytest.mark.parametrize("form", ["--config-file=~/c.yaml", "-o", "helper"])
def test_home_is_expanded_in_the_config_files_name(tmp_path: Path, form: str) -> None:
    """docs/semantics.md: path options, config-file among them, have ``~`` expanded in
    every form; the config file was read as the literal ``~/c.yaml`` (fstab has no shell)."""
    home = tmp_path / "home"
    home.mkdir()
    (home / "c.yaml").write_text("implicit-dirs: true\n")
    env = {**os.environ, "HOME": str(home)}
    if form == "helper":
        command = [MOUNT_HELPER, "bkt", str(tmp_path), "-o", "rw,config_file=~/c.yaml"]
    elif form == "-o":
        command = [TIERFS, "mount", "-o", "config_file=~/c.yaml", "bkt", "mnt"]
    else:
        command = [TIERFS, "mount", form, "bkt", "mnt"]
    result = subprocess.run(
        [*command, "--dry-run"], capture_output=True, text=True, timeout=120, cwd=tmp_path, env=env
    )
    assert result.returncode == 0, result.stderr
    assert value(json.loads(result.stdout), "implicit-dirs") is True


@pytest.mark.parametrize("option", [o for o in SCHEMA if o.kind is PATH], ids=lambda o: o.path)
def test_every_path_option_in_the_schema_is_made_absolute(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, option
) -> None:
    monkeypatch.chdir(tmp_path)
    if option.path == "config-file":
        Path("rel.yaml").write_text("implicit-dirs: true\n")
    line = parse_flags([f"--{option.flag}=rel.yaml", "bkt", "mnt"], MOUNT_EXTRAS)
    assert effective_config(line)[option.path] == str(tmp_path / "rel.yaml")


def test_absolute_and_empty_paths_are_kept(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    config = effective_config(parse_flags(["--cache-dir=/var/c", "bkt", "mnt"], MOUNT_EXTRAS))
    assert (config["cache-dir"], config["file-system:temp-dir"]) == ("/var/c", "")


# --- through real mounts, started from another directory -------------------------------------


def test_relative_cache_dir_fills_and_serves_after_remount(
    mount_factory: MountFactory, gcs_client: storage.Client, bucket_name: str, tmp_path: Path
) -> None:
    work = tmp_path / "work"
    work.mkdir()
    data = os.urandom(16 * MiB + 7)
    gcs_client.bucket(bucket_name).blob("d/f.bin").upload_from_string(data)
    first = mount_factory("--cache-dir=cache", "--implicit-dirs", name="first", cwd=work)
    assert (first.path / "d" / "f.bin").read_bytes() == data
    assert first.unmount().returncode == 0
    assert list((work / "cache").rglob("*.seal")), "nothing was cached under ./cache"
    again = mount_factory("--cache-dir=cache", "--implicit-dirs", name="second", cwd=work)
    assert (again.path / "d" / "f.bin").read_bytes() == data
    numbers = stats(again)
    assert numbers["gcs"]["media_reads"] == 0
    assert numbers["data"]["tiers"]["ssd"]["errors"] == 0


def test_relative_cache_dir_with_write_back(
    mount_factory: MountFactory, gcs_client: storage.Client, bucket_name: str, tmp_path: Path
) -> None:
    work = tmp_path / "work"
    work.mkdir()
    mount = mount_factory("--cache-dir=cache", "--write-back", "--implicit-dirs", cwd=work)
    nested = mount.path / "x" / "y"
    nested.mkdir(parents=True)
    (nested / "tmp.bin").write_bytes(b"checkpoint")
    os.rename(nested / "tmp.bin", nested / "final.bin")
    assert (nested / "final.bin").read_bytes() == b"checkpoint"
    assert stats(mount)["staging_errors"] == 0
    assert list((work / "cache" / "tierfs-writeback").iterdir())
    assert mount.unmount().returncode == 0
    blob = gcs_client.bucket(bucket_name).blob("x/y/final.bin")
    assert blob.download_as_bytes() == b"checkpoint"


def mount_fails(tmp_path: Path, *args: str) -> str:
    """Run a `tierfs mount` that must fail before it mounts; its one line on stderr. The
    directories are checked before GCS is asked, so no emulator is needed."""
    (tmp_path / "mnt").mkdir(exist_ok=True)
    result = subprocess.run(
        [TIERFS, "mount", "--custom-endpoint=http://127.0.0.1:9", "--anonymous-access",
         *args, "bkt-never-used", str(tmp_path / "mnt")],
        capture_output=True, text=True, timeout=120, cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode == 1, result
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    return lines[0]


def test_a_cache_dir_that_cannot_be_created_fails_the_mount(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("not a directory")
    line = mount_fails(tmp_path, "--cache-dir=file/cache")
    assert line == f"tierfs: cannot use cache-dir {tmp_path}/file/cache: Not a directory"


@pytest.fixture
def read_only_dir(tmp_path: Path):
    """A directory root cannot write in either: a read-only tmpfs, unmounted after."""
    require_fuse()  # root, as the mount tests
    target = tmp_path / "ro"
    target.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tierfs-test", target], check=True)
    try:
        yield target
    finally:
        subprocess.run(["umount", target], check=True)


@pytest.mark.parametrize(
    ("args", "option"),
    [
        (["--cache-dir={ro}"], "cache-dir"),
        (["--write-back", "--cache-dir={ro}", "--file-cache-max-size-mb=0"], "cache-dir"),
        (["--write-back", "--temp-dir={ro}"], "temp-dir"),
        (["--temp-dir={ro}"], "temp-dir"),
    ],
)
def test_an_unwritable_directory_fails_the_mount(
    tmp_path: Path, read_only_dir: Path, args: list[str], option: str
) -> None:
    line = mount_fails(tmp_path, *(a.format(ro=read_only_dir) for a in args))
    assert line == f"tierfs: cannot use {option} {read_only_dir}: Read-only file system"


def test_a_temp_dir_lost_at_run_time_is_said_once_and_counted(
    mount_factory: MountFactory, tmp_path: Path
) -> None:
    temp = tmp_path / "staging"
    mount = mount_factory(f"--temp-dir={temp}")
    temp.rmdir()  # e.g. a tmp cleaner, or a volume gone
    for name in ("a", "b"):
        with pytest.raises(FileNotFoundError):
            (mount.path / name).write_bytes(b"x")
    assert stats(mount)["staging_errors"] == 2
    warnings = [line for line in mount.log.read_text().splitlines() if " WARNING " in line]
    assert len(warnings) == 1 and "cannot make a local file for writing" in warnings[0], warnings
