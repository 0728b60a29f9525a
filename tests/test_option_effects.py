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
from mount_options import Config
from mount_options.schema import ACCEPTED, SCHEMA, USED, Option
from tierfs import settings
from tierfs.storage.gcs import GcsBucket

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
    "debug:log-mutex": "mount_options/derive.py",
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


def flags(*argv: str) -> Config:
    return mount_options.load(mount_options.parse_flags(list(argv)).parsed)


def idle_warnings(*argv: str) -> list[str]:
    return [w for w in flags(*argv).warnings if "no effect" in w]


def test_debug_mutex_sets_trace_logging_and_is_not_called_idle() -> None:
    config = flags("--debug_mutex")
    assert config["logging:severity"] == "trace"
    assert not [w for w in config.warnings if "without effect" in w]


def test_create_empty_file_under_streaming_writes_is_said_to_do_nothing() -> None:
    config = flags("--create-empty-file")
    assert config["write:create-empty-file"] is False
    assert idle_warnings("--create-empty-file") == [
        "write:create-empty-file has no effect while write:enable-streaming-writes is on"
    ]
    assert idle_warnings("--create-empty-file", "--enable-streaming-writes=false") == []
    assert idle_warnings() == []


def test_write_back_options_without_write_back_are_named_in_one_warning() -> None:
    given = ("--write-back-delay-secs=5", "--fsync-to-gcs", "--write-passthrough=false")
    assert idle_warnings(*given) == [
        "write:write-back-delay-secs, write:fsync-to-gcs, write:passthrough have no effect "
        "without write:write-back"
    ]
    assert idle_warnings("--fsync-to-gcs") == [
        "write:fsync-to-gcs has no effect without write:write-back"
    ]
    assert idle_warnings("--write-back", *given) == []


def test_shared_cache_options_without_the_shared_cache_are_named_in_one_warning() -> None:
    given = (
        "--cache-dir=/ssd",
        "--file-cache-shared-cache-dir=/nfs",
        "--file-cache-shared-cache-max-size-mb=100",
        "--file-cache-shared-cache-chunk-size-mb=16",
    )
    assert idle_warnings(*given) == [
        "file-cache:shared-cache-dir, file-cache:shared-cache-max-size-mb, "
        "file-cache:shared-cache-chunk-size-mb have no effect without "
        "file-cache:enable-experimental-shared-chunk-cache"
    ]
    assert idle_warnings("--enable-experimental-shared-chunk-cache", *given) == []


def test_the_nonexistent_type_cache_is_said_to_do_nothing() -> None:
    assert idle_warnings("--enable-nonexistent-type-cache") == [
        "option 'metadata-cache:enable-nonexistent-type-cache' is deprecated: has no effect; "
        "use metadata-cache:negative-ttl-secs"
    ]


def connected(*argv: str) -> GcsBucket:
    """The bucket handle a mount with these flags gets (no request is made)."""
    kwargs = settings.gcs_connection(flags(*argv))
    kwargs.update(endpoint="http://127.0.0.1:9", anonymous=True)
    return GcsBucket.connect("b", **kwargs)


def test_0_http_timeout_and_0_connections_mean_tierfs_defaults() -> None:
    """0 is neither "none" nor "unlimited": 60 s a request (uploads' stall timeout too,
    when chunk-transfer-timeout-secs is 0) and 32 requests in flight."""
    gcs = connected(
        "--http-client-timeout=0s", "--max-conns-per-host=0", "--chunk-transfer-timeout-secs=0"
    )
    try:
        assert (gcs._timeout_s, gcs._upload_timeout_s) == (60, 60)
        assert gcs._limiter.total_tokens == 32
    finally:
        gcs.close()
    gcs = connected("--http-client-timeout=5s", "--max-conns-per-host=3")
    try:
        assert (gcs._timeout_s, gcs._limiter.total_tokens) == (5, 3)
    finally:
        gcs.close()


@pytest.mark.parametrize(
    ("argv", "ahead_mib"),
    [
        ((), 128),  # 200 asked, half the 256 MiB RAM tier
        (("--ram-cache-max-size-mb=2048",), 200),
        (("--sequential-read-size-mb=16",), 16),
        (("--ram-cache-max-size-mb=8",), 8),  # the cap is never under one block
    ],
)
def test_sequential_read_size_is_how_far_reads_prefetch(argv: tuple[str, ...], ahead_mib: int):
    assert settings.read_ahead_bytes(flags(*argv)) == ahead_mib << 20


@pytest.mark.parametrize(
    ("argv", "streams"),
    [
        ((), 4),
        (("--write-max-blocks-per-file=2",), 2),
        (("--write-global-max-blocks=8", "--write-max-blocks-per-file=4"), 2),
        (("--write-max-blocks-per-file=-1",), 4),
        (("--write-global-max-blocks=0",), 0),
        (("--write-global-max-blocks=-1",), float("inf")),
    ],
)
def test_max_blocks_per_file_divides_the_files_that_stream_at_once(
    argv: tuple[str, ...], streams: float
) -> None:
    assert settings.max_streams(flags(*argv)) == streams
