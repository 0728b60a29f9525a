"""Every input form of the mount-options language, with the real lines gcsfuse users write.

The examples come from the gcsfuse / GKE CSI reference (`/work/shared/reference/gcsfuse.md`,
sections 1 and 2): fstab lines and ``mount -t`` commands from gcsfuse's docs, the
``mount.gcsfuse`` forms of gcsfuse's integration tests, CLI flags, CSI ``mountOptions`` and
``volumeAttributes``, and the YAML config file. Each case asserts the resulting values and
their sources exactly: ``explicit()`` lists every option not at its default, so comparing it
to a dict also proves that nothing else changed.
"""

from __future__ import annotations

import shlex
from typing import Any

import pytest

from mount_options import (
    CONFIG_FILE,
    CSI_ATTRIBUTE,
    DEFAULT,
    FLAG,
    MOUNT_OPTION,
    SCHEMA,
    Config,
    OptionError,
    Parsed,
    load,
    parse_config_file,
    parse_flags,
    parse_mount_helper,
    parse_option_string,
    parse_volume,
)
from mount_options.target import parse_target
from tierfs.cli.main import MOUNT_EXTRAS, UsageError, effective_config

MO = MOUNT_OPTION
FUSE = "file-system:fuse-options"

# The GKE checkpointing line (gcsfusecsi-checkpointing users paste it into mountOptions).
CHECKPOINT_LINE = (
    "implicit-dirs,metadata-cache:negative-ttl-secs:0,metadata-cache:ttl-secs:-1,"
    "metadata-cache:stat-cache-max-size-mb:-1,metadata-cache:type-cache-max-size-mb:-1,"
    "file-cache:max-size-mb:-1,file-cache:cache-file-for-range-read:true,"
    "file-system:kernel-list-cache-ttl-secs:0,file-cache:enable-parallel-downloads:true,"
    "read_ahead_kb=1024,write:enable-streaming-writes:true"
)
CHECKPOINT_VALUES = {
    "implicit-dirs": True,
    "metadata-cache:ttl-secs": -1,
    "metadata-cache:negative-ttl-secs": 0,
    "metadata-cache:stat-cache-max-size-mb": -1,
    "metadata-cache:type-cache-max-size-mb": -1,
    "file-cache:max-size-mb": -1,
    "file-cache:cache-file-for-range-read": True,
    "file-system:kernel-list-cache-ttl-secs": 0,
    "file-cache:enable-parallel-downloads": True,
    "read-ahead-kb": 1024,
    "write:enable-streaming-writes": True,
}


def explicit(config: Config) -> dict[str, tuple[Any, str]]:
    """Every option not at its default, as {path: (value, source)}."""
    return {option.path: (s.value, s.source) for option, s in config.explicit()}


def opts(text: str, **kwargs: Any) -> Config:
    return load(parse_option_string(text, MO), **kwargs)


def flags(*argv: str, files: dict[str, str] | None = None) -> Config:
    line = parse_flags(list(argv))
    return load(line.parsed, read_text=(files or {}).__getitem__)


def csi(attributes: dict[str, str] | None = None, mount_options: tuple[str, ...] = ()) -> Config:
    return load(parse_volume(attributes or {}, mount_options).parsed)


# --- the checkpoint line ---------------------------------------------------------------------


def _checkpoint_expected() -> dict[str, tuple[Any, str]]:
    return {path: (value, MO) for path, value in CHECKPOINT_VALUES.items()}


def test_checkpoint_line_as_dash_o():
    config = opts(CHECKPOINT_LINE)
    assert explicit(config) == _checkpoint_expected()
    assert config.fuse_options == ()


def test_checkpoint_line_through_mount_helper_argv():
    line = parse_mount_helper(["my-bucket", "/mnt/ckpt", "-o", CHECKPOINT_LINE])
    assert line.positional == ["my-bucket", "/mnt/ckpt"]
    assert explicit(load(line.parsed)) == _checkpoint_expected()


@pytest.mark.parametrize(
    ("attributes", "mount_options"),
    [
        pytest.param({}, (CHECKPOINT_LINE,), id="pv-mountOptions-one-string"),
        pytest.param({}, tuple(CHECKPOINT_LINE.split(",")), id="pv-mountOptions-list"),
        pytest.param({"mountOptions": CHECKPOINT_LINE}, (), id="volumeAttributes.mountOptions"),
    ],
)
def test_checkpoint_line_as_csi_mount_options(attributes, mount_options):
    volume = parse_volume(attributes, mount_options)
    config = load(volume.parsed)
    assert explicit(config) == _checkpoint_expected()
    assert config.fuse_options == ()
    assert volume.parsed.warnings == []


# --- fstab lines and mount(8) commands from gcsfuse's docs (section 2) -------------------------

FSTAB_CASES = [
    ("my-bucket /mount/point tierfs rw,noauto,user", {}, ()),
    ("my-bucket /mount/point tierfs rw,x-systemd.requires=network-online.target,user", {}, ()),
    (
        "my-bucket /mount/point tierfs rw,_netdev,allow_other,uid=1001,gid=1001",
        {
            FUSE: (("allow_other",), MO),
            "file-system:uid": (1001, MO),
            "file-system:gid": (1001, MO),
        },
        ("allow_other",),
    ),
    (
        "my-bucket /mount/point tierfs rw,noauto,user,key_file=/path/to/key.json",
        {"gcs-auth:key-file": ("/path/to/key.json", MO)},
        (),
    ),
]


@pytest.mark.parametrize(("fstab", "expected", "fuse"), FSTAB_CASES)
def test_fstab_line(fstab, expected, fuse):
    spec, mountpoint, fstype, options = fstab.split()
    assert fstype == "tierfs"
    # mount(8) runs the helper as: mount.tierfs SPEC DIR -o OPTIONS
    line = parse_mount_helper([spec, mountpoint, "-o", options])
    assert line.positional == ["my-bucket", "/mount/point"]
    config = load(line.parsed)
    assert explicit(config) == expected
    assert config.fuse_options == fuse
    # the options part alone parses to the same
    assert load(parse_option_string(options, MO)) == config


def test_mount_command_from_docs():
    argv = shlex.split("mount -t tierfs -o rw,user my-bucket /path/to/mount/point")[1:]
    line = parse_mount_helper(argv)
    assert line.positional == ["my-bucket", "/path/to/mount/point"]
    config = load(line.parsed)
    assert explicit(config) == {}
    assert config.fuse_options == ()
    assert explicit(opts(argv[argv.index("-o") + 1])) == {}


def test_mount_helper_flags_from_mount8_are_accepted():
    line = parse_mount_helper(["my-bucket", "/mnt", "-n", "-sfv", "-o", "implicit_dirs"])
    assert line.positional == ["my-bucket", "/mnt"]
    assert line.extras == {"n": True, "s": True, "f": True, "v": True}
    assert explicit(load(line.parsed)) == {"implicit-dirs": (True, MO)}


# --- mount.gcsfuse forms used by gcsfuse's integration tests ----------------------------------


def test_helper_implicit_dirs_and_config_file():
    files = {
        "/tmp/gcsfuse_config.yaml": "metadata-cache:\n  ttl-secs: 10\nlogging:\n  severity: debug\n"
    }
    line = parse_mount_helper(
        ["my-bucket", "/mnt", "-o", "implicit_dirs", "-o", "config_file=/tmp/gcsfuse_config.yaml"]
    )
    config = load(line.parsed, read_text=files.__getitem__)
    assert explicit(config) == {
        "config-file": ("/tmp/gcsfuse_config.yaml", MO),
        "implicit-dirs": (True, MO),
        "metadata-cache:ttl-secs": (10, CONFIG_FILE),
        "logging:severity": ("debug", CONFIG_FILE),
    }


@pytest.mark.parametrize(
    ("options", "expected", "fuse"),
    [
        (
            "only_dir=testDir,rename_dir_limit=3,implicit_dirs",
            {
                "only-dir": ("testDir", MO),
                "file-system:rename-dir-limit": (3, MO),
                "implicit-dirs": (True, MO),
            },
            (),
        ),
        ("ro,implicit_dirs=true", {FUSE: (("ro",), MO), "implicit-dirs": (True, MO)}, ("ro",)),
        (
            "file_mode=544,dir_mode=544,implicit_dirs=true",
            {
                "file-system:file-mode": (0o544, MO),
                "file-system:dir-mode": (0o544, MO),
                "implicit-dirs": (True, MO),
            },
            (),
        ),
    ],
)
def test_helper_forms_from_integration_tests(options, expected, fuse):
    line = parse_mount_helper(["my-bucket", "/mnt", "-o", options])
    config = load(line.parsed)
    assert explicit(config) == expected
    assert config.fuse_options == fuse


# --- command-line flags --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "expected", "positional"),
    [
        (["--metadata-cache-ttl-secs=-1"], {"metadata-cache:ttl-secs": (-1, FLAG)}, []),
        (["--metadata-cache-ttl-secs", "-1"], {"metadata-cache:ttl-secs": (-1, FLAG)}, []),
        (["--implicit-dirs"], {"implicit-dirs": (True, FLAG)}, []),
        (["-implicit-dirs"], {"implicit-dirs": (True, FLAG)}, []),
        (["-metadata-cache-ttl-secs=30"], {"metadata-cache:ttl-secs": (30, FLAG)}, []),
        (["--log-severity", "debug"], {"logging:severity": ("debug", FLAG)}, []),
        (["--log-severity=DEBUG"], {"logging:severity": ("debug", FLAG)}, []),
        # explicitly false: same value as the default, but the user said it
        (["--implicit-dirs=false"], {"implicit-dirs": (False, FLAG)}, []),
        # pflag: a bool flag never takes the next argument
        (["--implicit-dirs", "false"], {"implicit-dirs": (True, FLAG)}, ["false"]),
        (
            ["--implicit-dirs", "--", "--foreground", "-o"],
            {"implicit-dirs": (True, FLAG)},
            ["--foreground", "-o"],
        ),
        (
            ["my-bucket", "--implicit-dirs", "/mnt", "--uid=7"],
            {"implicit-dirs": (True, FLAG), "file-system:uid": (7, FLAG)},
            ["my-bucket", "/mnt"],
        ),
        (["--file-mode=544"], {"file-system:file-mode": (0o544, FLAG)}, []),
        (["--max-retry-sleep=1m30s"], {"gcs-retries:max-retry-sleep": (90.0, FLAG)}, []),
        (["--retry-multiplier", "1.5"], {"gcs-retries:multiplier": (1.5, FLAG)}, []),
        # gcsfuse's own underscore flags and tierfs's kindness about _ and -
        (["--debug_invariants"], {"debug:exit-on-invariant-violation": (True, FLAG)}, []),
        (["--only_dir=a/b"], {"only-dir": ("a/b", FLAG)}, []),
        (["--metadata-cache:ttl-secs=-1"], {"metadata-cache:ttl-secs": (-1, FLAG)}, []),
        (
            ["-o", "ro,implicit_dirs", "-oallow_other"],
            {FUSE: (("ro", "allow_other"), MO), "implicit-dirs": (True, MO)},
            [],
        ),
        (["--o=noatime"], {FUSE: (("noatime",), MO)}, []),
    ],
)
def test_cli_flags(argv, expected, positional):
    line = parse_flags(argv)
    assert line.positional == positional
    assert explicit(load(line.parsed)) == expected


def test_cli_extras_are_returned_apart():
    line = parse_flags(
        ["--dry-run", "--csi-volume-attributes", "{}", "--implicit-dirs", "b", "m"], MOUNT_EXTRAS
    )
    assert line.extras == {"dry-run": True, "csi-volume-attributes": "{}"}
    assert line.positional == ["b", "m"]
    assert [(a.path, a.value) for a in line.parsed.assignments] == [("implicit-dirs", True)]


# --- CSI mountOptions ----------------------------------------------------------------------------

PV_EXAMPLE = (
    "implicit-dirs",
    "file-cache:max-size-mb:-1",
    "file-cache:enable-parallel-downloads:true",
    "file-cache:parallel-downloads-per-file:4",
    "file-cache:max-parallel-downloads:-1",
    "file-cache:download-chunk-size-mb:3",
    "uid=50000",
    "gid=0",
)
PV_EXPECTED = {
    "implicit-dirs": (True, MO),
    "file-cache:max-size-mb": (-1, MO),
    "file-cache:enable-parallel-downloads": (True, MO),
    "file-cache:parallel-downloads-per-file": (4, MO),
    "file-cache:max-parallel-downloads": (-1, MO),
    "file-cache:download-chunk-size-mb": (3, MO),
    "file-system:uid": (50000, MO),
    "file-system:gid": (0, MO),
}


@pytest.mark.parametrize(
    "mount_options",
    [PV_EXAMPLE, (", ".join(PV_EXAMPLE),), (",".join(PV_EXAMPLE[:4]), ",".join(PV_EXAMPLE[4:]))],
    ids=["list", "one-string-with-blanks", "two-strings"],
)
def test_csi_pv_mount_options_example(mount_options):
    assert explicit(csi(mount_options=mount_options)) == PV_EXPECTED


def test_csi_colon_and_flag_forms_mixed():
    config = csi(
        mount_options=(
            "implicit-dirs",
            "metadata-cache:ttl-secs:-1",
            "uid=1001",
            "max-conns-per-host=100",
            "only-dir=dir1",
            "log-severity=trace",
            "gcs-connection:client-protocol:http2",
            "ro",
        )
    )
    assert explicit(config) == {
        "implicit-dirs": (True, MO),
        "only-dir": ("dir1", MO),
        "metadata-cache:ttl-secs": (-1, MO),
        FUSE: (("ro",), MO),
        "file-system:uid": (1001, MO),
        "gcs-connection:client-protocol": ("http2", MO),
        "gcs-connection:max-conns-per-host": (100, MO),
        "logging:severity": ("trace", MO),
    }


@pytest.mark.parametrize(
    ("token", "warning"),
    [
        (
            "cache-dir=/my/cache",
            "mount option 'cache-dir=/my/cache' is set by the CSI driver; ignored",
        ),
        ("log-file=/tmp/log", "mount option 'log-file=/tmp/log' is set by the CSI driver; ignored"),
        ("log-format=text", "mount option 'log-format=text' is set by the CSI driver; ignored"),
        ("temp-dir=/t", "mount option 'temp-dir=/t' is set by the CSI driver; ignored"),
        (
            "config-file=/c.yaml",
            "mount option 'config-file=/c.yaml' is set by the CSI driver; ignored",
        ),
        ("key-file=/k.json", "mount option 'key-file=/k.json' is set by the CSI driver; ignored"),
        (
            "prometheus-port=9000",
            "mount option 'prometheus-port=9000' is set by the CSI driver; ignored",
        ),
        ("foreground", "mount option 'foreground' is set by the CSI driver; ignored"),
        ("cache_dir=/x", "mount option 'cache_dir=/x' is set by the CSI driver; ignored"),
    ],
)
def test_csi_driver_owned_options_are_dropped_with_a_warning(token, warning):
    volume = parse_volume({}, ["implicit-dirs", token])
    assert volume.parsed.warnings == [warning]
    config = load(volume.parsed)
    assert explicit(config) == {"implicit-dirs": (True, MO)}
    assert warning in config.warnings


@pytest.mark.parametrize(
    "token",
    ["token-server-identity-provider=x", "hnw-ksa=true", "file-cache-medium=ram",
     "disable-metrics-for-gke=true", "enable-sidecar-bucket-access-check=true"],
)  # fmt: skip
def test_csi_driver_internal_options_are_consumed_silently(token):
    volume = parse_volume({}, [token])
    assert volume.parsed.assignments == []
    assert volume.parsed.warnings == []


@pytest.mark.parametrize("word", ["noexec", "exec", "noatime", "sync", "async", "dirsync"])
def test_csi_o_form_accepts_its_kernel_options(word):
    config = csi(mount_options=(f"o={word}",))
    assert config.fuse_options == (word,)
    assert explicit(config) == {FUSE: ((word,), MO)}


@pytest.mark.parametrize(
    "token",
    ["o=atime", "atime", "diratime", "relatime", "norelatime", "strictatime", "lazytime",
     "nolazytime", "max_read=131072", "blksize=4096"],
)  # fmt: skip
def test_kernel_options_libfuse_refuses_are_accepted_without_effect_and_warned(token):
    """libfuse 3 refuses these for a FUSE mount: the mount failed ("fuse_session_new()
    failed"; max_read mounted and never answered). gcsfuse and the CSI driver accept them:
    they are dropped, with a warning naming them."""
    config = csi(mount_options=(token,))
    name = token.removeprefix("o=").partition("=")[0]
    assert config.fuse_options == ()
    assert f"kernel option '{name}' has no effect on a FUSE mount: ignored" in config.warnings


@pytest.mark.parametrize("word", ["ro", "rw", "nodev", "allow_other", ""])
def test_csi_o_form_refuses_other_kernel_options(word):
    with pytest.raises(OptionError) as err:
        parse_volume({}, [f"o={word}"])
    assert str(err.value) == (
        f"bad value '{word}' for option 'o': expected one of "
        "async, atime, dirsync, exec, noatime, noexec, sync"
    )


# --- CSI volumeAttributes ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("quantity", "megabytes"),
    [
        ("10Gi", 10240),
        ("500M", 500),
        ("1.5Gi", 1536),
        ("-1", -1),
        ("-5Gi", -1),
        ("500Mi", 500),
        ("1G", 1000),
        ("1Ti", 1048576),
        ("0", 0),
        ("1e9", 1000),
        ("2000000", 2),
        ("1536Ki", 1),
    ],
)
def test_csi_file_cache_capacity_quantity(quantity, megabytes):
    config = csi({"fileCacheCapacity": quantity})
    assert explicit(config) == {"file-cache:max-size-mb": (megabytes, CSI_ATTRIBUTE)}


@pytest.mark.parametrize(
    ("attributes", "expected"),
    [
        ({"metadataCacheTTLSeconds": "30"}, {"metadata-cache:ttl-secs": (30, CSI_ATTRIBUTE)}),
        ({"metadataCacheTTLSeconds": "-1"}, {"metadata-cache:ttl-secs": (-1, CSI_ATTRIBUTE)}),
        ({"metadataCacheTTLSeconds": "-300"}, {"metadata-cache:ttl-secs": (-1, CSI_ATTRIBUTE)}),
        ({"metadataCacheTtlSeconds": "-7"}, {"metadata-cache:ttl-secs": (-1, CSI_ATTRIBUTE)}),
        ({"metadataCacheTtlSeconds": "600"}, {"metadata-cache:ttl-secs": (600, CSI_ATTRIBUTE)}),
        (
            {"fileCacheForRangeRead": "true"},
            {"file-cache:cache-file-for-range-read": (True, CSI_ATTRIBUTE)},
        ),
        (
            {"fileCacheForRangeRead": "false"},
            {"file-cache:cache-file-for-range-read": (False, CSI_ATTRIBUTE)},
        ),
        (
            {"metadataStatCacheCapacity": "1Gi"},
            {"metadata-cache:stat-cache-max-size-mb": (1024, CSI_ATTRIBUTE)},
        ),
        (
            {"metadataStatCacheCapacity": "-1"},
            {"metadata-cache:stat-cache-max-size-mb": (-1, CSI_ATTRIBUTE)},
        ),
        (
            {"metadataTypeCacheCapacity": "64Mi"},
            {"metadata-cache:type-cache-max-size-mb": (64, CSI_ATTRIBUTE)},
        ),
        ({"gcsfuseLoggingSeverity": "debug"}, {"logging:severity": ("debug", CSI_ATTRIBUTE)}),
        ({"gcsfuseLoggingSeverity": "warning"}, {"logging:severity": ("warning", CSI_ATTRIBUTE)}),
        ({"disableMetrics": "true"}, {"metrics:prometheus-port": (0, CSI_ATTRIBUTE)}),
        ({"disableMetrics": "false"}, {}),
        ({"bucketName": "my-bucket"}, {}),
        ({"mountOptions": "implicit-dirs,uid=5"},
         {"implicit-dirs": (True, MO), "file-system:uid": (5, MO)}),
    ],
)  # fmt: skip
def test_csi_volume_attributes(attributes, expected):
    assert explicit(csi(attributes)) == expected


def test_csi_bucket_name_and_driver_attributes():
    volume = parse_volume(
        {
            "bucketName": "my-bucket",
            "disableMetrics": "true",
            "skipCSIBucketAccessCheck": "true",
            "gcsfuseMetadataPrefetchOnMount": "false",
            "identityProvider": "https://example.com/pool",
        }
    )
    assert volume.bucket == "my-bucket"
    assert volume.driver == {
        "disableMetrics": True,
        "skipCSIBucketAccessCheck": True,
        "gcsfuseMetadataPrefetchOnMount": False,
        "identityProvider": "https://example.com/pool",
    }


def test_csi_kubelet_attributes_are_accepted_and_ignored():
    volume = parse_volume(
        {
            "csi.storage.k8s.io/pod.name": "trainer-0",
            "csi.storage.k8s.io/pod.namespace": "ml",
            "csi.storage.k8s.io/pod.uid": "0b3e2a4c",
            "csi.storage.k8s.io/serviceAccount.name": "trainer",
            "csi.storage.k8s.io/ephemeral": "true",
            "bucketName": "my-bucket",
        }
    )
    assert volume.parsed.assignments == []
    assert volume.driver == {}
    assert volume.bucket == "my-bucket"


@pytest.mark.parametrize(
    ("attributes", "message"),
    [
        (
            {"fileCacheCapacit": "10Gi"},
            "unknown volume attribute 'fileCacheCapacit' (did you mean 'fileCacheCapacity'?)",
        ),
        (
            {"fileCacheCapacity": "10GB"},
            "bad value '10GB' for volume attribute 'fileCacheCapacity': "
            "expected a Kubernetes quantity such as 10Gi or 500Mi",
        ),
        (
            {"metadataCacheTTLSeconds": "1m"},
            "bad value '1m' for volume attribute 'metadataCacheTTLSeconds': expected an integer",
        ),
        (
            {"fileCacheForRangeRead": "sometimes"},
            "bad value 'sometimes' for volume attribute 'fileCacheForRangeRead': "
            "expected true or false",
        ),
    ],
)
def test_csi_bad_attributes(attributes, message):
    with pytest.raises(OptionError) as err:
        parse_volume(attributes)
    assert str(err.value) == message


def test_csi_unknown_attribute_suggests_current_spelling():
    with pytest.raises(OptionError) as err:
        parse_volume({"metadataCacheTTLSecond": "1"})
    assert str(err.value) == (
        "unknown volume attribute 'metadataCacheTTLSecond' "
        "(did you mean 'metadataCacheTTLSeconds'?)"
    )


# --- mount(8) words, kernel options, name spelling --------------------------------------------


@pytest.mark.parametrize(
    "word",
    ["rw", "user", "nouser", "users", "auto", "noauto", "_netdev", "no_netdev", "nofail",
     "x-systemd.requires=network-online.target", "x-systemd.automount", "defaults",
     "user=alice", "comment=x-gvfs-show"],
)  # fmt: skip
def test_mount8_words_are_dropped(word):
    config = opts(f"implicit-dirs,{word}")
    assert explicit(config) == {"implicit-dirs": (True, MO)}
    assert config.fuse_options == ()


@pytest.mark.parametrize("word", ["ro", "allow_other", "nodev", "noexec", "default_permissions"])
def test_kernel_options_are_kept_apart(word):
    config = opts(f"implicit-dirs,{word},uid=3")
    assert config.fuse_options == (word,)
    assert explicit(config) == {
        "implicit-dirs": (True, MO),
        FUSE: ((word,), MO),
        "file-system:uid": (3, MO),
    }


def test_kernel_options_keep_their_order_and_drop_duplicates():
    config = opts("rw,nodev,allow_other,nodev,noexec,default_permissions,fsname=gcs")
    assert config.fuse_options == (
        "nodev", "allow_other", "noexec", "default_permissions", "fsname=gcs",
    )  # fmt: skip


@pytest.mark.parametrize(
    ("underscored", "dashed"),
    [
        ("implicit_dirs", "implicit-dirs"),
        ("file_mode=544", "file-mode=544"),
        ("only_dir=a", "only-dir=a"),
        ("metadata_cache_ttl_secs=-1", "metadata-cache-ttl-secs=-1"),
        ("cache_dir=/c", "cache-dir=/c"),
        ("file_cache_max_size_mb=5", "file-cache-max-size-mb=5"),
        ("key_file=/k.json", "key-file=/k.json"),
        ("metadata_cache:ttl_secs:-1", "metadata-cache:ttl-secs:-1"),
        ("debug_fuse", "debug-fuse"),
        ("allow-other", "allow_other"),
    ],
)
def test_underscore_and_dash_are_the_same(underscored, dashed):
    assert opts(underscored) == opts(dashed)
    assert explicit(opts(underscored)) != {}


@pytest.mark.parametrize(
    ("token", "path"),
    [
        ("implicit-dirs", "implicit-dirs"),
        ("implicit_dirs", "implicit-dirs"),
        ("foreground", "foreground"),
        ("anonymous-access", "gcs-auth:anonymous-access"),
        ("implicit-dirs:", "implicit-dirs"),
        ("file-cache:enable-crc:", "file-cache:enable-crc"),
    ],
)
def test_bare_bool_means_true(token, path):
    assert explicit(opts(token)) == {path: (True, MO)}


@pytest.mark.parametrize(
    ("text", "path", "value"),
    [
        ("app-name=a=b", "app-name", "a=b"),
        ("file-cache-include-regex=k=v", "file-cache:include-regex", "k=v"),
        ("billing-project==x", "gcs-connection:billing-project", "=x"),
        ("file-cache:include-regex:a=b", "file-cache:include-regex", "a=b"),
    ],
)
def test_first_equals_sign_splits(text, path, value):
    assert explicit(opts(text)) == {path: (value, MO)}


@pytest.mark.parametrize(
    ("text", "path", "value"),
    [
        (
            "gcs-connection:custom-endpoint:http://127.0.0.1:4443",
            "gcs-connection:custom-endpoint",
            "http://127.0.0.1:4443",
        ),
        (
            "gcs-connection:custom-endpoint:https://storage.example.com:443/storage/v1/",
            "gcs-connection:custom-endpoint",
            "https://storage.example.com:443/storage/v1/",
        ),
        ("app-name:job:42", "app-name", "job:42"),
        ("only-dir:a:b", "only-dir", "a:b"),
        ("gcs-retries:read-stall:enable:false", "gcs-retries:read-stall:enable", False),
        ("logging:log-rotate:max-file-size-mb:7", "logging:log-rotate:max-file-size-mb", 7),
    ],
)
def test_colon_form_values_may_contain_colons(text, path, value):
    assert explicit(opts(text)) == {path: (value, MO)}


def test_flag_form_value_with_colons():
    config = opts("custom-endpoint=http://127.0.0.1:4443")
    assert explicit(config) == {"gcs-connection:custom-endpoint": ("http://127.0.0.1:4443", MO)}


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("file-mode=644", 0o644),
        ("file-mode=0644", 0o644),
        ("file-mode=0o644", 0o644),
        ("file-system:file-mode:0400", 0o400),
        ("file-mode=777", 0o777),
        ("file-mode=0", 0),
    ],
)
def test_octal_modes(text, value):
    assert opts(text)["file-system:file-mode"] == value


# --- YAML config file ----------------------------------------------------------------------------

NESTED_YAML = """\
implicit-dirs: true
only-dir: data/train
metadata-cache:
  ttl-secs: -1
  negative-ttl-secs: 0
file-cache:
  max-size-mb: 2048
  cache-file-for-range-read: true
file-system:
  file-mode: 644
  dir-mode: 755
  uid: 1000
  fuse-options: [allow_other, ro]
gcs-connection:
  custom-endpoint: http://127.0.0.1:4443
  limit-ops-per-sec: 12.5
gcs-retries:
  max-retry-sleep: 1m30s
  read-stall:
    enable: false
    min-req-timeout: 1500ms
logging:
  severity: DEBUG
  log-rotate:
    max-file-size-mb: 100
    compress: false
write:
  block-size-mb: 0.5
"""


def test_config_file_nested_keys():
    assignments = parse_config_file(NESTED_YAML)
    assert {a.source for a in assignments} == {CONFIG_FILE}
    assert {a.path: a.value for a in assignments} == {
        "implicit-dirs": True,
        "only-dir": "data/train",
        "metadata-cache:ttl-secs": -1,
        "metadata-cache:negative-ttl-secs": 0,
        "file-cache:max-size-mb": 2048,
        "file-cache:cache-file-for-range-read": True,
        "file-system:file-mode": 0o644,
        "file-system:dir-mode": 0o755,
        "file-system:uid": 1000,
        FUSE: ("allow_other", "ro"),
        "gcs-connection:custom-endpoint": "http://127.0.0.1:4443",
        "gcs-connection:limit-ops-per-sec": 12.5,
        "gcs-retries:max-retry-sleep": 90.0,
        "gcs-retries:read-stall:enable": False,
        "gcs-retries:read-stall:min-req-timeout": 1.5,
        "logging:severity": "debug",
        "logging:log-rotate:max-file-size-mb": 100,
        "logging:log-rotate:compress": False,
        "write:block-size-mb": 0.5,
    }


def test_config_file_through_load():
    config = flags("--config-file", "/etc/tierfs.yaml", files={"/etc/tierfs.yaml": NESTED_YAML})
    assert config.source("config-file") == FLAG
    assert config["file-system:file-mode"] == 0o644
    assert config.source("file-system:file-mode") == CONFIG_FILE
    assert config.fuse_options == ("allow_other", "ro")
    assert config.source(FUSE) == CONFIG_FILE


@pytest.mark.parametrize(
    ("yaml_text", "value"),
    [
        ("file-system:\n  file-mode: 644\n", 0o644),
        ("file-system:\n  file-mode: 600\n", 0o600),
        ("file-system:\n  file-mode: '0644'\n", 0o644),
        ("file-system:\n  file-mode: 0o644\n", 0o644),
        ("file-system:\n  file-mode: '755'\n", 0o755),
    ],
)
def test_config_file_mode_is_octal(yaml_text, value):
    assert [(a.path, a.value) for a in parse_config_file(yaml_text)] == [
        ("file-system:file-mode", value)
    ]


def test_config_file_mode_with_leading_zero():
    assert [(a.path, a.value) for a in parse_config_file("file-system:\n  file-mode: 0644\n")] == [
        ("file-system:file-mode", 0o644)
    ]


def test_config_file_severity_off():
    assert [(a.path, a.value) for a in parse_config_file("logging:\n  severity: off\n")] == [
        ("logging:severity", "off")
    ]


@pytest.mark.parametrize(
    ("duration", "seconds"),
    [
        ("1m30s", 90.0),
        ("30s", 30.0),
        ("1500ms", 1.5),
        ("2h", 7200.0),
        ("1h30m", 5400.0),
        ("0s", 0.0),
        ("30", 30.0),
        ("0.5s", 0.5),
        ("250us", 0.00025),
    ],
)
def test_config_file_durations(duration, seconds):
    assignments = parse_config_file(f"gcs-retries:\n  max-retry-sleep: {duration}\n")
    assert [(a.path, a.value) for a in assignments] == [("gcs-retries:max-retry-sleep", seconds)]


@pytest.mark.parametrize(
    ("yaml_text", "message"),
    [
        (
            "metadata-cache:\n  ttl-sec: 5\n",
            "config file: unknown key 'metadata-cache:ttl-sec' "
            "(did you mean 'metadata-cache:ttl-secs'?)",
        ),
        ("implicit-dir: true\n",
         "config file: unknown key 'implicit-dir' (did you mean 'implicit-dirs'?)"),
        (
            "file-system:\n  file_mode: 644\n",
            "config file: unknown key 'file-system:file_mode' "
            "(did you mean 'file-system:file-mode'?)",
        ),
        ("metadata-cache: 5\n",
         "config file: 'metadata-cache' is a section and holds options, not a value"),
        ("gcs-retries:\n  read-stall: true\n",
         "config file: 'gcs-retries:read-stall' is a section and holds options, not a value"),
        ("- implicit-dirs\n", "config file: expected a mapping of options at the top level"),
        ("implicit-dirs: true\n  ttl: 5\n",
         "config file line 2: mapping values are not allowed here"),
        ("file-system:\n  fuse-options: [ro\n",
         "config file line 3: expected ',' or ']', but got '<stream end>'"),
        (
            "metadata-cache:\n  ttl-secs: soon\n",
            "config file: bad value 'soon' for option 'metadata-cache:ttl-secs': "
            "expected an integer",
        ),
        (
            "file-system:\n  fuse-options: [ro, frobnicate]\n",
            "config file: unknown kernel option 'frobnicate' in file-system:fuse-options",
        ),
    ],
)  # fmt: skip
def test_config_file_errors(yaml_text, message):
    with pytest.raises(OptionError) as err:
        parse_config_file(yaml_text)
    assert str(err.value) == message


def test_config_file_rejects_config_file_key():
    with pytest.raises(OptionError) as err:
        parse_config_file("config-file: /other.yaml\n")
    assert str(err.value).startswith("config file: unknown key 'config-file'")


def test_config_file_error_names_the_file():
    files = {"/etc/t.yaml": "a: b\n  c: d\n"}
    with pytest.raises(OptionError) as err:
        flags("--config-file=/etc/t.yaml", files=files)
    assert str(err.value) == "config file '/etc/t.yaml' line 2: mapping values are not allowed here"


@pytest.mark.parametrize("yaml_text", ["", "# only a comment\n", "---\n", "metadata-cache:\n"])
def test_config_file_empty(yaml_text):
    assert parse_config_file(yaml_text) == []


# --- precedence ----------------------------------------------------------------------------------

TTL = "metadata-cache:ttl-secs"
TTL_FILE = {"/c.yaml": "metadata-cache:\n  ttl-secs: 10\n"}


@pytest.mark.parametrize(
    ("argv", "value", "source"),
    [
        (["--config-file=/c.yaml"], 10, CONFIG_FILE),
        (["--config-file=/c.yaml", "--metadata-cache-ttl-secs=5"], 5, FLAG),
        (["--metadata-cache-ttl-secs=5", "--config-file=/c.yaml"], 5, FLAG),
        (["--config-file=/c.yaml", "-o", "metadata-cache-ttl-secs=5"], 5, MO),
        (["-o", "metadata-cache:ttl-secs:7", "--config-file=/c.yaml"], 7, MO),
        (["-o", "metadata-cache:ttl-secs:7", "--metadata-cache-ttl-secs=5"], 5, FLAG),
        (["--metadata-cache-ttl-secs=5", "-o", "metadata-cache:ttl-secs:7"], 5, FLAG),
        ([], 60, DEFAULT),
    ],
)
def test_precedence_flag_over_config_file_over_default(argv, value, source):
    config = flags(*argv, files=TTL_FILE)
    assert (config[TTL], config.source(TTL)) == (value, source)


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("metadata-cache-ttl-secs=5,metadata-cache:ttl-secs:7", 5),
        ("metadata-cache:ttl-secs:7,metadata-cache-ttl-secs=5", 5),
        ("implicit-dirs=false,implicit-dirs:true", False),
        ("implicit-dirs:true,implicit-dirs=false", False),
    ],
)
def test_precedence_flag_form_mount_option_over_colon_form(text, value):
    config = opts(text)
    path = TTL if "ttl" in text else "implicit-dirs"
    assert config[path] == value


@pytest.mark.parametrize(
    ("attributes", "mount_options", "value", "source"),
    [
        ({"fileCacheCapacity": "1Gi"}, ("file-cache:max-size-mb:100",), 1024, CSI_ATTRIBUTE),
        ({"fileCacheCapacity": "1Gi", "mountOptions": "file-cache:max-size-mb:7"}, (),
         1024, CSI_ATTRIBUTE),
        ({"fileCacheCapacity": "1Gi"}, ("file-cache-max-size-mb=5",), 5, MO),
        ({"fileCacheCapacity": "1Gi", "mountOptions": "file-cache-max-size-mb=5"}, (), 5, MO),
        ({"mountOptions": "file-cache:max-size-mb:7"}, ("file-cache:max-size-mb:100",), 7, MO),
    ],
)  # fmt: skip
def test_precedence_csi_attribute_vs_mount_options(attributes, mount_options, value, source):
    config = csi(attributes, mount_options)
    path = "file-cache:max-size-mb"
    assert (config[path], config.source(path)) == (value, source)


@pytest.mark.parametrize(
    ("argv", "value", "source"),
    [
        (["-o", "uid=1,uid=2"], 2, MO),
        (["--uid=1", "--uid=2"], 2, FLAG),
        (["--uid", "1", "--uid", "2"], 2, FLAG),
        (["-o", "uid=1", "--uid=2"], 2, FLAG),
        (["--uid=2", "-o", "uid=1"], 1, MO),
        (["-o", "file-system:uid:1,file-system:uid:2"], 2, MO),
        (["-o", "file-system:uid:1", "-o", "file-system:uid:2"], 2, MO),
    ],
)
def test_precedence_later_wins_within_a_rank(argv, value, source):
    config = flags(*argv)
    assert (config["file-system:uid"], config.source("file-system:uid")) == (value, source)


def test_precedence_last_config_file_is_read():
    files = {
        "/a.yaml": "metadata-cache:\n  ttl-secs: 1\n",
        "/b.yaml": "metadata-cache:\n  ttl-secs: 2\n",
    }
    config = flags("--config-file=/a.yaml", "--config-file=/b.yaml", files=files)
    assert (config["config-file"], config[TTL]) == ("/b.yaml", 2)


def test_precedence_cli_flags_over_csi_attributes():
    line = parse_flags(
        ["--csi-volume-attributes", '{"metadataCacheTTLSeconds": "30", "bucketName": "my-bucket"}',
         "--metadata-cache-ttl-secs=5", "/mnt/x"],
        MOUNT_EXTRAS,
    )  # fmt: skip
    config = effective_config(line)
    assert (config.bucket, config.mountpoint) == ("my-bucket", "/mnt/x")
    assert (config[TTL], config.source(TTL)) == (5, FLAG)


# --- derived values -----------------------------------------------------------------------------

PARALLEL = "file-cache:enable-parallel-downloads"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("cache-dir=/ssd", {"cache-dir": ("/ssd", MO), PARALLEL: (True, MO)}),
        ("cache-dir:/ssd,file-cache:max-size-mb:100",
         {"cache-dir": ("/ssd", MO), "file-cache:max-size-mb": (100, MO), PARALLEL: (True, MO)}),
        ("cache-dir=/ssd,file-cache-enable-parallel-downloads=false",
         {"cache-dir": ("/ssd", MO), PARALLEL: (False, MO)}),
        ("cache-dir=/ssd,file-cache:max-size-mb:0",
         {"cache-dir": ("/ssd", MO), "file-cache:max-size-mb": (0, MO)}),
        ("cache-dir=/ssd,file-cache:experimental-parallel-downloads-default-on:false",
         {"cache-dir": ("/ssd", MO),
          "file-cache:experimental-parallel-downloads-default-on": (False, MO)}),
        ("file-cache:max-size-mb:100", {"file-cache:max-size-mb": (100, MO)}),
    ],
)  # fmt: skip
def test_file_cache_turns_parallel_downloads_on(text, expected):
    assert explicit(opts(text)) == expected


def test_file_cache_options_without_cache_dir_warn():
    config = opts("file-cache:max-size-mb:100")
    assert config.warnings == (
        "file-cache options are set but cache-dir is not: the SSD file cache is off",
    )


def test_write_back_dir_without_write_back_warns():
    assert opts("write:write-back-dir:/dev/shm/wb").warnings == (
        "write:write-back-dir has no effect without write:write-back",
    )
    assert opts("write:write-back:true,write:write-back-dir:/dev/shm/wb").warnings == ()


@pytest.mark.parametrize(("cpus", "value"), [(1, 16), (2, 16), (8, 16), (12, 24), (64, 128)])
def test_max_parallel_downloads_default_depends_on_cpus(cpus, value):
    config = load(parse_option_string("", MO), cpu_count=cpus)
    path = "file-cache:max-parallel-downloads"
    assert (config[path], config.source(path)) == (value, DEFAULT)


@pytest.mark.parametrize(
    ("argv", "ttl", "source"),
    [
        (["--stat-cache-ttl=30s", "--type-cache-ttl=45s"], 30, FLAG),
        (["--type-cache-ttl=45s", "--stat-cache-ttl=30s"], 30, FLAG),
        (["--stat-cache-ttl=30s"], 30, FLAG),
        (["--type-cache-ttl=2m"], 60, FLAG),
        (["--stat-cache-ttl=1500ms"], 2, FLAG),
        (["--stat-cache-ttl=0s"], 0, FLAG),
        (["--stat-cache-ttl=30s", "--metadata-cache-ttl-secs=90"], 90, FLAG),
        (["-o", "metadata-cache:deprecated-stat-cache-ttl:20s"], 20, MO),
    ],
)
def test_deprecated_stat_and_type_ttl_feed_ttl_secs(argv, ttl, source):
    config = flags(*argv)
    assert (config[TTL], config.source(TTL)) == (ttl, source)


@pytest.mark.parametrize(
    ("argv", "size", "source"),
    [
        ([], 34, DEFAULT),
        (["--stat-cache-capacity=100000"], 165, FLAG),
        (["--stat-cache-capacity=0"], 0, FLAG),
        (["--stat-cache-capacity=609"], 1, FLAG),
        (["--stat-cache-capacity=100000", "--stat-cache-max-size-mb=7"], 7, FLAG),
        (["--stat-cache-max-size-mb=-1"], -1, FLAG),
    ],
)
def test_stat_cache_size(argv, size, source):
    config = flags(*argv)
    path = "metadata-cache:stat-cache-max-size-mb"
    assert (config[path], config.source(path)) == (size, source)


def test_deprecated_options_warn():
    config = flags("--stat-cache-ttl=30s", "--stat-cache-capacity=10")
    assert config.warnings == (
        "option 'metadata-cache:deprecated-stat-cache-ttl' is deprecated: "
        "use metadata-cache:ttl-secs",
        "option 'metadata-cache:deprecated-stat-cache-capacity' is deprecated: "
        "use metadata-cache:stat-cache-max-size-mb",
    )


@pytest.mark.parametrize(
    ("text", "severity"),
    [
        ("debug_fuse", "trace"),
        ("debug_gcs", "trace"),
        ("debug_mutex", "trace"),
        ("debug_fuse,log-severity=error", "trace"),
        ("debug:fuse:true", "trace"),
        ("debug_fuse=false", "info"),
        ("log-severity=error", "error"),
    ],
)
def test_debug_flags_force_trace(text, severity):
    assert opts(text)["logging:severity"] == severity


_AIML = {
    "implicit-dirs": True,
    "metadata-cache:ttl-secs": -1,
    "metadata-cache:negative-ttl-secs": 0,
    "metadata-cache:stat-cache-max-size-mb": -1,
    "metadata-cache:type-cache-max-size-mb": -1,
}
PROFILE_VALUES = {
    "aiml-training": _AIML,
    "aiml-serving": {
        **_AIML,
        "file-system:kernel-list-cache-ttl-secs": -1,
        "file-cache:cache-file-for-range-read": True,
    },
    "aiml-checkpointing": {
        **_AIML,
        "file-cache:cache-file-for-range-read": True,
        "file-system:rename-dir-limit": 200000,
    },
}


@pytest.mark.parametrize("profile", sorted(PROFILE_VALUES))
def test_profile_sets_unset_options(profile):
    config = opts(f"profile={profile}")
    expected = {path: (value, MO) for path, value in PROFILE_VALUES[profile].items()}
    assert explicit(config) == {**expected, "profile": (profile, MO)}


@pytest.mark.parametrize("profile", sorted(PROFILE_VALUES))
def test_profile_leaves_explicit_options_alone(profile):
    config = flags(
        f"--profile={profile}",
        "--implicit-dirs=false",
        "--metadata-cache-ttl-secs=30",
        "--kernel-list-cache-ttl-secs=5",
        "--file-cache-cache-file-for-range-read=false",
        "--rename-dir-limit=10",
    )
    assert config["implicit-dirs"] is False
    assert config[TTL] == 30
    assert config["file-system:kernel-list-cache-ttl-secs"] == 5
    assert config["file-cache:cache-file-for-range-read"] is False
    assert config["file-system:rename-dir-limit"] == 10
    assert config["metadata-cache:negative-ttl-secs"] == 0
    assert config.source("metadata-cache:negative-ttl-secs") == FLAG


def test_profile_from_config_file_keeps_its_source():
    config = flags("--config-file=/p.yaml", files={"/p.yaml": "profile: aiml-training\n"})
    assert (config["implicit-dirs"], config.source("implicit-dirs")) == (True, CONFIG_FILE)


HIGH_PERFORMANCE = {
    "implicit-dirs": True,
    "metadata-cache:ttl-secs": -1,
    "metadata-cache:negative-ttl-secs": 0,
    "metadata-cache:stat-cache-max-size-mb": 1024,
    "file-system:rename-dir-limit": 200000,
    "write:global-max-blocks": 1600,
}


@pytest.mark.parametrize(
    "machine", ["a3-highgpu-8g", "a3-megagpu-8g", "a2-ultragpu-1g", "ct6e-standard-4t"]
)
def test_high_performance_machine_type(machine):
    config = opts(f"machine-type={machine}")
    for path, value in HIGH_PERFORMANCE.items():
        assert (config[path], config.source(path)) == (value, MO), path


@pytest.mark.parametrize(
    "text",
    [
        "machine-type=n2-standard-4",
        "machine-type=e2-medium",
        "machine-type=a3-highgpu-8g,disable-autoconfig",
    ],
)
def test_other_machine_types_and_disable_autoconfig(text):
    config = opts(text)
    for path in HIGH_PERFORMANCE:
        assert config.source(path) == DEFAULT, path


def test_machine_type_keeps_explicit_values_and_profile_wins():
    config = opts("machine-type=a3-highgpu-8g,profile=aiml-training,rename-dir-limit=5")
    assert config["file-system:rename-dir-limit"] == 5
    assert config["metadata-cache:stat-cache-max-size-mb"] == -1  # profile > machine group
    assert config["write:global-max-blocks"] == 1600


@pytest.mark.parametrize(
    ("text", "create_empty"),
    [
        ("write:create-empty-file:true", False),
        ("write:create-empty-file:true,write:enable-streaming-writes:true", False),
        ("write:create-empty-file:true,write:enable-streaming-writes:false", True),
        ("enable-streaming-writes=false", False),
    ],
)
def test_streaming_writes_force_create_empty_file_off(text, create_empty):
    assert opts(text)["write:create-empty-file"] is create_empty


@pytest.mark.parametrize(
    ("text", "only_dir"),
    [("only-dir=/a/b/", "a/b"), ("only-dir=a//b", "a/b"), ("only-dir=/", ""), ("only-dir=a", "a")],
)
def test_only_dir_is_normalized(text, only_dir):
    assert opts(text)["only-dir"] == only_dir


# --- what to mount: BUCKET, BUCKET/PREFIX, gs://BUCKET/PREFIX ----------------------------------


@pytest.mark.parametrize(
    ("spec", "bucket", "prefix"),
    [
        ("my-bucket", "my-bucket", ""),
        ("my-bucket/", "my-bucket", ""),
        ("my-bucket/a/b", "my-bucket", "a/b"),
        ("my-bucket//a//b/", "my-bucket", "a/b"),
        ("gs://my-bucket", "my-bucket", ""),
        ("gs://my-bucket/", "my-bucket", ""),
        ("gs://my-bucket/models/llama", "my-bucket", "models/llama"),
        ("my_bucket.example.com/x", "my_bucket.example.com", "x"),
        ("abc", "abc", ""),
        ("a" * 63, "a" * 63, ""),
    ],
)
def test_target(spec, bucket, prefix):
    target = parse_target(spec)
    assert (target.bucket, target.prefix) == (bucket, prefix)


@pytest.mark.parametrize(
    ("argv", "only_dir"),
    [
        (["my-bucket/models/llama", "/mnt"], "models/llama"),
        (["gs://my-bucket/models/llama/", "/mnt"], "models/llama"),
        (["gs://my-bucket", "/mnt"], ""),
    ],
)
def test_target_prefix_becomes_only_dir(argv, only_dir):
    config = effective_config(parse_flags(argv, MOUNT_EXTRAS))
    assert config.bucket == "my-bucket"
    assert config["only-dir"] == only_dir
    assert config.source("only-dir") == (FLAG if only_dir else DEFAULT)


def test_target_prefix_through_mount_helper():
    line = parse_mount_helper(["my-bucket/a/b", "/mnt", "-o", "implicit_dirs"], MOUNT_EXTRAS)
    config = effective_config(line)
    assert (config.bucket, config["only-dir"]) == ("my-bucket", "a/b")


def test_target_prefix_and_only_dir_together_are_refused():
    with pytest.raises(
        UsageError, match=r"^give the prefix once: BUCKET/PREFIX or --only-dir, not both$"
    ):
        effective_config(parse_flags(["my-bucket/a", "--only-dir=b", "/mnt"], MOUNT_EXTRAS))


@pytest.mark.parametrize(
    "name",
    ["ab", "My-Bucket", "-bucket", "bucket-", ".bucket", "goog-bucket", "googbucket", "a..b",
     "a" * 64, "my bucket", "bucket!", "", "x" * 223, f"{'a' * 64}.com"],
)  # fmt: skip
def test_bad_bucket_names(name):
    with pytest.raises(OptionError, match=r"^bad bucket name '"):
        parse_target(name)


def test_all_buckets_underscore_is_refused():
    with pytest.raises(OptionError) as err:
        parse_target("_")
    assert str(err.value) == "mounting all buckets ('_') is not supported: name one bucket"


@pytest.mark.parametrize("name", ["192.168.5.4", "my-google-bucket"])
def test_bad_bucket_names_gcs_rules(name):
    with pytest.raises(OptionError, match=r"^bad bucket name '"):
        parse_target(name)


# --- every option is reachable in every spelling ------------------------------------------------


def _sample_text(option) -> str:
    """A valid, non-default-looking value for any option, as text."""
    kind = option.kind.name
    if kind == "bool":
        return "false" if option.path == "write:create-empty-file" else "true"
    if kind == "int":
        if option.path == "file-cache:write-buffer-size":
            return str(4096 * 1025)
        return str(int(option.minimum if option.minimum is not None else 0) + 1)
    if kind == "float":
        return "0.5" if option.maximum is not None and option.maximum <= 1 else "1.5"
    if kind == "duration":
        return "45s"
    if kind == "octal":
        return "0600"
    if kind == "enum":
        return option.kind.choices[-1]
    if kind == "list":
        return "stdout"
    return "http://127.0.0.1:9000" if option.path.endswith("endpoint") else "value"


CONFIG_OPTIONS = [o for o in SCHEMA if o.in_config and o.path != FUSE]


@pytest.mark.parametrize("option", CONFIG_OPTIONS, ids=lambda o: o.path)
def test_every_option_in_every_spelling(option):
    text = _sample_text(option)
    expected = option.kind.parse(text)
    colon = opts(f"{option.path}:{text}")
    flag_form = opts(f"{option.flag.replace('-', '_')}={text}")
    cli = flags(f"--{option.flag}={text}")
    config_file = load(Parsed(assignments=parse_config_file(_nested_yaml(option.path, text))))
    for config, source in ((colon, MO), (flag_form, MO), (cli, FLAG), (config_file, CONFIG_FILE)):
        assert (config[option.path], config.source(option.path)) == (expected, source)


def _nested_yaml(path: str, text: str) -> str:
    parts = path.split(":")
    lines = [f"{'  ' * depth}{part}:" for depth, part in enumerate(parts[:-1])]
    lines.append(f"{'  ' * (len(parts) - 1)}{parts[-1]}: '{text}'")
    return "\n".join(lines) + "\n"


# --- unknown names and the typed view ----------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("allow_others", "unknown option 'allow_others' (did you mean 'allow_other'?)"),
        ("implicit_dir", "unknown option 'implicit_dir' (did you mean 'implicit-dirs'?)"),
        ("implicit-dir=true", "unknown option 'implicit-dir' (did you mean 'implicit-dirs'?)"),
        (
            "metadata-cache:ttl-sec:-1",
            "unknown option 'metadata-cache:ttl-sec' (did you mean 'metadata-cache:ttl-secs'?)",
        ),
        (
            "file-cache:max-size:100",
            "unknown option 'file-cache:max-size' (did you mean 'file-cache:max-size-mb'?)",
        ),
        ("implicit-dir:true", "unknown option 'implicit-dir' (did you mean 'implicit-dirs'?)"),
        ("frobnicate", "unknown option 'frobnicate'"),
    ],
)
def test_unknown_names_suggest_the_nearest(text, message):
    with pytest.raises(OptionError) as err:
        parse_option_string(text, MO)
    assert str(err.value) == message


def test_section_view():
    config = opts("metadata-cache:ttl-secs:-1,file_mode=600,gcs-retries:read-stall:enable:false")
    assert config.section("metadata-cache").ttl_secs == -1
    assert config.section("file-system").file_mode == 0o600
    assert config.section("gcs-retries").read_stall_enable is False
    with pytest.raises(KeyError):
        config.section("no-such-section")
    with pytest.raises(AttributeError):
        _ = config.section("metadata-cache").no_such_key
