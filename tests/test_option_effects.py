"""The "effect" column of the options table is true.

An option marked as having an effect must have a consumer: the code that reads it by
its colon path. Most are read in tierfs (the composition root turns them into
settings); a few only shape other options, and are read where that happens
(mount_options.derive, the config-file loader). An option marked as accepted without
effect must not be read by tierfs (else its docs lie the other way), and a mount that
sets one is warned, naming it.
"""

from __future__ import annotations

from pathlib import Path

import pytest

import mount_options
from mount_options.schema import ACCEPTED, SCHEMA, USED, Option

ROOT = Path(__file__).resolve().parent.parent
SOURCES = {p: p.read_text(encoding="utf-8") for p in (ROOT / "tierfs").rglob("*.py")}

# Options whose effect is on other options, and the module where that happens.
SHAPES_OTHERS = {
    "config-file": "mount_options/__init__.py",  # load() reads the file
    "profile": "mount_options/derive.py",
    "machine-type": "mount_options/derive.py",
    "disable-autoconfig": "mount_options/derive.py",
    "debug:fuse": "mount_options/derive.py",
    "debug:gcs": "mount_options/derive.py",
    "metadata-cache:deprecated-stat-cache-ttl": "mount_options/derive.py",
    "metadata-cache:deprecated-type-cache-ttl": "mount_options/derive.py",
    "metadata-cache:deprecated-stat-cache-capacity": "mount_options/derive.py",
    "file-cache:experimental-parallel-downloads-default-on": "mount_options/derive.py",
    "file-system:fuse-options": "mount_options/config.py",  # Config.fuse_options
}


def consumers(option: Option) -> list[Path]:
    quoted = f'"{option.path}"'
    return [path for path, text in SOURCES.items() if quoted in text]


@pytest.mark.parametrize("option", [o for o in SCHEMA if o.effect == USED], ids=lambda o: o.path)
def test_every_option_with_an_effect_has_a_consumer(option: Option) -> None:
    where = SHAPES_OTHERS.get(option.path)
    if where is not None:
        assert f'"{option.path}"' in (ROOT / where).read_text(), (
            f"{option.path} is said to shape other options in {where}, which never reads it"
        )
        return
    assert consumers(option), (
        f"option '{option.path}' is marked as having an effect, but nothing in tierfs/ reads "
        "it: give it its effect, or mark it effect=ACCEPTED (docs and a mount warning follow)"
    )


@pytest.mark.parametrize(
    "option", [o for o in SCHEMA if o.effect == ACCEPTED], ids=lambda o: o.path
)
def test_no_option_said_to_have_no_effect_is_read(option: Option) -> None:
    assert not consumers(option), f"{option.path} is read by {consumers(option)}"


def test_a_line_that_sets_options_without_effect_warns_once_naming_them() -> None:
    line = mount_options.parse_flags(
        ["--client-protocol=http2", "--experimental-enable-dentry-cache"]
    )
    config = mount_options.load(line.parsed)
    idle = [w for w in config.warnings if "accepted without effect" in w]
    assert idle == [
        "accepted without effect in tierfs: file-system:experimental-enable-dentry-cache, "
        "gcs-connection:client-protocol"
    ]


def test_the_gke_checkpointing_line_sets_nothing_without_effect() -> None:
    line = (
        "implicit-dirs,metadata-cache:negative-ttl-secs:0,metadata-cache:ttl-secs:-1,"
        "metadata-cache:stat-cache-max-size-mb:-1,metadata-cache:type-cache-max-size-mb:-1,"
        "file-cache:max-size-mb:-1,file-cache:cache-file-for-range-read:true,"
        "file-system:kernel-list-cache-ttl-secs:0,file-cache:enable-parallel-downloads:true,"
        "read_ahead_kb=1024,write:enable-streaming-writes:true"
    )
    config = mount_options.load(mount_options.parse_flags(["-o", line]).parsed)
    assert not [w for w in config.warnings if "without effect" in w]
