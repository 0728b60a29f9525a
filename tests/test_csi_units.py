"""The CSI plugin's pure parts: the committed stubs match csi.proto, a publish request becomes
the daemon's command line as the GKE driver would make it, target paths stay below the
kubelet root, secrets are written privately."""

from __future__ import annotations

import os
import stat
import subprocess
from pathlib import Path

import grpc
import pytest

from tests.csi_plugin import CHECKPOINTING
from tests.mounting import TIERFS
from tierfs import settings
from tierfs.csi import paths
from tierfs.csi.proto import generate
from tierfs.csi.volume import (
    BadRequest,
    Layout,
    Request,
    bucket_of,
    daemon_args,
    fingerprint,
    key_from_secrets,
    load,
    mount_option_text,
    plan,
)

TARGET = "/var/lib/kubelet/pods/p/volumes/kubernetes.io~csi/v/mount"
LAYOUT = Layout(Path("/state/volumes/v"))


def test_committed_stubs_are_what_make_csi_proto_generates(tmp_path: Path) -> None:
    for made in generate.generate(tmp_path):
        committed = generate.HERE / made.name
        assert committed.read_bytes() == made.read_bytes(), f"run `make csi-proto` ({made.name})"


def test_vendored_proto_says_where_it_came_from() -> None:
    notice = (generate.HERE / "NOTICE").read_text()
    assert "v1.12.0" in notice and "container-storage-interface/spec" in notice
    assert "Apache License" in (generate.HERE / "LICENSE").read_text()


def test_bucket_from_handle_or_bucket_name() -> None:
    assert bucket_of(Request("my-bucket:pv-2", TARGET)) == "my-bucket"
    assert bucket_of(Request("my-bucket", TARGET)) == "my-bucket"
    inline = Request("csi-123", TARGET, context=(("bucketName", "data"),))
    assert bucket_of(inline) == "data"
    with pytest.raises(BadRequest, match="bucketName"):
        bucket_of(Request("csi-123", TARGET, context=(("csi.storage.k8s.io/ephemeral", "true"),)))


@pytest.mark.parametrize(
    "bucket", ["--csi-volume-attributes=@/etc/shadow", "-o", "Bad_Bucket", "a/b", "x"]
)
def test_a_bucket_name_that_is_no_bucket_name_is_refused_before_any_argv(
    bucket: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An inline volume's ``bucketName`` is the pod author's: one that reads as a flag made
    the plugin (root) read any file it named (``@path``) while planning the mount."""

    def no_reading(*args: object, **kwargs: object) -> str:
        raise AssertionError("the plugin read a file the volume named")

    monkeypatch.setattr(Path, "read_text", no_reading)
    inline = Request("csi-1", TARGET, context=(("bucketName", bucket),))
    with pytest.raises(BadRequest, match="bad bucket name"):
        plan(inline, LAYOUT, key_file=False)
    with pytest.raises(BadRequest, match="bad bucket name"):
        bucket_of(Request(f"{bucket}:pv", TARGET))


@pytest.mark.parametrize(
    "token",
    ["gcs-auth:key-file:/var/lib/tierfs-csi/volumes/other/key.json", "key_file=/k",
     "metrics:prometheus-port:80", "logging:file-path:/etc/cron.d/x", "cache-dir:/etc",
     "write:write-back-dir:/etc"],
)  # fmt: skip
def test_what_the_driver_owns_cannot_be_set_in_any_form(token: str) -> None:
    """The colon forms too: only the word before the first colon was looked at, so another
    volume's key file, a metrics port or a log file path came through."""
    request = Request("b-bucket", TARGET, mount_flags=(f"implicit-dirs,{token}",))
    config = load(daemon_args(request, LAYOUT, key_file=False, metrics_port=9100))
    assert config["gcs-auth:key-file"] == ""
    assert config["metrics:prometheus-port"] == 9100
    assert config["logging:file-path"] == "/dev/fd/2"
    assert config["write:write-back-dir"] in ("", str(LAYOUT.write_back_dir))
    assert config["implicit-dirs"] is True
    assert any("set by the CSI driver" in w for w in config.warnings), config.warnings


def test_gke_attributes_this_driver_ignores_are_warned_about() -> None:
    attributes = (("hostNetworkPodKSA", "true"), ("identityPool", "p"), ("disableMetrics", "1"))
    planned = plan(Request("b-bucket", TARGET, context=attributes), LAYOUT, key_file=False)
    assert [w for w in planned.warnings if "without effect" in w] == [
        "volume attribute 'hostNetworkPodKSA' is accepted without effect by this driver",
        "volume attribute 'identityPool' is accepted without effect by this driver",
    ]


def test_checkpointing_line_as_one_element_or_many_gives_one_config() -> None:
    joined = Request("b-bucket", TARGET, mount_flags=(CHECKPOINTING,))
    listed = Request("b-bucket", TARGET, mount_flags=tuple(CHECKPOINTING.split(",")))
    assert mount_option_text(joined) == mount_option_text(listed)
    assert fingerprint(joined) == fingerprint(listed)
    config = load(daemon_args(listed, LAYOUT, key_file=False))
    assert config["metadata-cache:ttl-secs"] == -1
    assert config["file-cache:max-size-mb"] == -1
    assert config["read-ahead-kb"] == 1024
    assert config["write:enable-streaming-writes"] is True
    assert config["cache-dir"] == str(LAYOUT.cache_dir)
    assert config.mountpoint == TARGET and config.bucket == "b-bucket"


def test_attributes_readonly_and_fs_group() -> None:
    request = Request(
        "b-bucket",
        TARGET,
        context=(("fileCacheCapacity", "2Gi"), ("csi.storage.k8s.io/pod.uid", "u")),
        readonly=True,
        mount_group="3000",
    )
    config = load(daemon_args(request, LAYOUT, key_file=True, metrics_port=9100))
    assert config["file-cache:max-size-mb"] == 2048
    assert "ro" in config.fuse_options
    assert {"allow_other", "nodev", "nosuid"} <= set(config.fuse_options)  # any pod user
    assert (config["file-system:gid"], config["file-system:file-mode"]) == (3000, 0o664)
    assert config["gcs-auth:key-file"] == str(LAYOUT.key_file)
    assert config["metrics:prometheus-port"] == 9100
    assert config["logging:file-path"] == "/dev/fd/2"


def test_user_cannot_move_what_the_driver_owns() -> None:
    request = Request(
        "b-bucket", TARGET, mount_flags=("cache-dir=/etc,temp-dir=/,file-cache:max-size-mb:10",)
    )
    config = load(daemon_args(request, LAYOUT, key_file=False))
    assert config["cache-dir"] == str(LAYOUT.cache_dir)
    assert config["file-system:temp-dir"] == str(LAYOUT.temp_dir)
    assert any("cache-dir" in w for w in config.warnings)


def test_no_cache_dir_without_a_file_cache() -> None:
    request = Request("b-bucket", TARGET, mount_flags=("file-cache:max-size-mb:0",))
    assert not any(
        a.startswith("--cache-dir") for a in daemon_args(request, LAYOUT, key_file=False)
    )


@pytest.mark.parametrize(
    "context",
    [(), (("fileCacheForRangeRead", "true"),), (("mountOptions", "implicit-dirs"),)],
    ids=["bare", "range-read-only", "other-options"],
)
def test_a_volume_that_sets_no_file_cache_size_has_no_file_cache(
    context: tuple[tuple[str, str], ...],
) -> None:
    """As GKE's driver: the file cache is off unless the volume gives it a size. tierfs's
    own default (-1: the free space) gave such a volume an SSD tier as large as the free
    space of the node's state volume."""
    args = daemon_args(Request("b-bucket", TARGET, context=context), LAYOUT, key_file=False)
    assert not any(a.startswith("--cache-dir") for a in args)
    config = load(args)
    assert config["cache-dir"] == ""
    assert not settings.tiers(config).ssd


@pytest.mark.parametrize(
    ("context", "size_mb"),
    [
        ((("fileCacheCapacity", "-1"),), -1),
        ((("fileCacheCapacity", "1Gi"),), 1024),
        ((("mountOptions", "file-cache:max-size-mb:-1"),), -1),
        ((("mountOptions", "file-cache-max-size-mb=64"),), 64),
    ],
)
def test_a_volume_that_sets_a_file_cache_size_gets_its_cache_dir(
    context: tuple[tuple[str, str], ...], size_mb: int
) -> None:
    config = load(daemon_args(Request("b-bucket", TARGET, context=context), LAYOUT, key_file=False))
    assert config["cache-dir"] == str(LAYOUT.cache_dir)
    assert config["file-cache:max-size-mb"] == size_mb
    assert settings.tiers(config).ssd


def test_fingerprint_ignores_what_kubelet_varies_and_sees_what_the_user_chose() -> None:
    base = Request("b-bucket", TARGET, mount_flags=("implicit-dirs",))
    with_pod = Request(
        "b-bucket",
        TARGET,
        mount_flags=("implicit-dirs",),
        context=(("csi.storage.k8s.io/serviceAccount.tokens", "{...}"),),
    )
    assert fingerprint(base) == fingerprint(with_pod)
    assert fingerprint(base) != fingerprint(Request("b-bucket", TARGET, readonly=True))
    assert fingerprint(base) != fingerprint(Request("b-bucket:other", TARGET, ("implicit-dirs",)))


def test_bad_options_are_one_line_naming_them() -> None:
    with pytest.raises(BadRequest, match="implicit-dirz"):
        load(daemon_args(Request("b-bucket", TARGET, ("implicit-dirz",)), LAYOUT, key_file=False))


def test_key_from_secrets() -> None:
    assert key_from_secrets({}) is None
    assert key_from_secrets({"sa.json": "K"}) == "K"
    assert key_from_secrets({"key.json": "K", "other": "x"}) == "K"
    with pytest.raises(BadRequest, match=r"key\.json"):
        key_from_secrets({"a": "1", "b": "2"})


def test_targets_below_the_root_only(tmp_path: Path) -> None:
    root = tmp_path / "kubelet"
    (root / "pods").mkdir(parents=True)
    (tmp_path / "elsewhere").mkdir()
    (root / "pods" / "link").symlink_to(tmp_path / "elsewhere")
    inside = paths.resolve_target(str(root / "pods" / "p" / "mount"), root)
    assert inside == (root / "pods" / "p" / "mount").resolve()
    for outside in (
        str(root / "pods" / ".." / ".." / "elsewhere" / "m"),
        str(root / "pods" / "link" / "m"),
        str(root),
        "pods/p/mount",
        "/etc",
    ):
        with pytest.raises(paths.OutsideRoot):
            paths.resolve_target(outside, root)
    (tmp_path / "root-link").symlink_to(root)  # a kubelet root that is a symlink still works
    assert paths.resolve_target(str(root / "pods" / "q"), tmp_path / "root-link")


def test_private_files_and_dirs(tmp_path: Path) -> None:
    old = os.umask(0)
    try:
        directory = paths.private_dir(tmp_path / "state" / "volumes" / "v")
        paths.write_private(directory / "key.json", "secret")
    finally:
        os.umask(old)
    assert stat.S_IMODE(directory.stat().st_mode) == 0o700
    assert stat.S_IMODE((directory / "key.json").stat().st_mode) == 0o600
    paths.remove_volume_dir(directory)
    assert not directory.exists()


@pytest.mark.parametrize(
    ("args", "says"),
    [
        ([], "--node-id"),
        (["--node-id=n", "--endpoint=tcp://0:1"], "unix:///PATH"),
        (["--node-id=n", "--metrics-address=nowhere"], "HOST:PORT"),
        (["--node-id=n", "--upload-timeout-s=soon"], "upload-timeout-s"),
    ],
)
def test_wrong_use_is_one_line_and_status_2(args: list[str], says: str) -> None:
    result = subprocess.run([TIERFS, "csi", *args], capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and says in result.stderr, result.stderr
    assert result.stderr.startswith("tierfs: csi: ")


def test_a_write_back_journal_drained_clean_is_not_pending_and_one_with_data_is(
    tmp_path: Path,
) -> None:
    """A journal keeps its directories and lock file once drained: that counted as data not
    in GCS (an ERROR at every unpublish of an adopted volume, and its directory kept for
    good). A record, a data file or a kept conflict still counts."""
    from tierfs.core.writeback import Journal

    journal = Journal(tmp_path / "vol" / "write-back", "bkt")
    assert not paths.has_pending_writes(tmp_path / "vol")
    for leftover in (journal.dir / "1.data", journal.conflicts_dir / "ckpt.1"):
        leftover.write_bytes(b"x")
        assert paths.has_pending_writes(tmp_path / "vol")
        leftover.unlink()


def test_unpublish_after_the_daemon_died_keeps_what_it_had_not_uploaded(tmp_path: Path) -> None:
    """A volume published by this plugin whose daemon died (its restart failed too, so the
    target is no longer mounted): unpublish deleted the whole volume directory, the
    write-back journal with the data not in GCS included."""
    from tierfs.csi.node import Node, NodeSettings, Published

    class Dead:
        def stop(self, timeout_s: float) -> None:
            return None

    state = tmp_path / "state"
    node = Node(NodeSettings("n", tmp_path / "kubelet", state))
    target = tmp_path / "kubelet" / "pods" / "p" / "mount"
    target.mkdir(parents=True)
    directory = state / "volumes" / "v"
    data = directory / "write-back" / "tierfs-writeback" / "ab" / "1.data"
    data.parent.mkdir(parents=True)
    data.write_bytes(b"closed, not uploaded")
    (directory / "key.json").write_text("{}")
    node.volumes[target] = Published("fp", Dead(), directory, 0)  # type: ignore[arg-type]
    node._unpublish("v", target)
    assert data.read_bytes() == b"closed, not uploaded"
    assert not (directory / "key.json").exists() and not target.exists()


def test_a_target_that_is_a_mount_is_never_looked_up(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Resolving a published target lstat'ed the mount's root: a daemon that does not
    answer (stopped, deadlocked) held the gRPC thread for good, and with the kubelet's
    retries every thread, the probe and so every mount on the node."""
    root = tmp_path / "kubelet"
    target = root / "pods" / "p" / "mount"
    target.mkdir(parents=True)
    real = os.path.realpath

    def realpath(path: str | os.PathLike[str], **kwargs: object) -> str:
        assert os.fspath(path) != str(target), "the mount itself was looked up"
        return real(path, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(paths, "mounted_here", lambda p: object() if p == str(target) else None)
    monkeypatch.setattr(os.path, "realpath", realpath)
    assert paths.resolve_target(str(target), root) == target


def test_unpublish_of_a_volume_whose_daemon_is_stuck_kills_it_and_goes_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A daemon alive but not answering (stopped, deadlocked): unpublish said UNAVAILABLE,
    'being restarted', at every retry, but nothing restarts a daemon that lives on: the pod
    never finished terminating. It is now killed, the target unmounted, the journal kept."""
    from tierfs.csi import node as node_module
    from tierfs.csi.node import Node, NodeSettings, Published

    class Stuck:
        killed = False
        pid = 4242

        def kill(self) -> None:
            self.killed = True

        def stop(self, timeout_s: float) -> None:
            assert self.killed, "stopped (and waited for) before it was killed"

    monkeypatch.setattr(node_module, "is_fuse_mounted", lambda target: True)
    monkeypatch.setattr(node_module, "probe", lambda target: node_module.HUNG)
    state = tmp_path / "state"
    node = Node(NodeSettings("n", tmp_path / "kubelet", state))
    target = tmp_path / "kubelet" / "pods" / "p" / "mount"
    target.mkdir(parents=True)
    directory = state / "volumes" / "v"
    directory.mkdir(parents=True)
    stuck = Stuck()
    node.volumes[target] = Published("fp", stuck, directory, 0)  # type: ignore[arg-type]
    node._unpublish("v", target)
    assert stuck.killed and target not in node.volumes


def test_a_capability_without_an_access_type_is_invalid() -> None:
    """The spec requires one of block or mount; neither was taken for a mount."""
    from tierfs.csi.node import Failure, publish_request
    from tierfs.csi.proto import csi_pb2

    capability = csi_pb2.VolumeCapability(
        access_mode=csi_pb2.VolumeCapability.AccessMode(
            mode=csi_pb2.VolumeCapability.AccessMode.SINGLE_NODE_WRITER
        )
    )
    request = csi_pb2.NodePublishVolumeRequest(
        volume_id="v", target_path="/var/lib/kubelet/pods/p/mount", volume_capability=capability
    )
    with pytest.raises(Failure, match="no access type") as caught:
        publish_request(request)
    assert caught.value.code == grpc.StatusCode.INVALID_ARGUMENT
    request.volume_capability.mount.SetInParent()
    assert publish_request(request).volume_id == "v"


def test_a_journal_an_unpublish_left_goes_to_the_next_publish_of_that_volume(
    tmp_path: Path,
) -> None:
    state = tmp_path / "state"

    def journal_of(volume_id: str, pod: str, *, published: bool = False) -> Path:
        directory = paths.volume_dir(state, volume_id, Path(f"/k/pods/{pod}/mount"))
        data = directory / "write-back" / "tierfs-writeback" / "ab" / "1.data"
        data.parent.mkdir(parents=True)
        data.write_bytes(f"{volume_id} {pod}".encode())
        if published:
            paths.write_record(directory, {"volume_id": volume_id})
        return directory

    left = journal_of("pv-1", "old")
    journal_of("pv-1", "running", published=True)  # another pod's, in use: never taken
    journal_of("pv-10", "old")  # another volume, whose name starts the same
    new = paths.private_dir(paths.volume_dir(state, "pv-1", Path("/k/pods/new/mount")))
    assert paths.adopt_left_journal(state, "pv-1", new) == left
    assert not left.exists()
    data = new / "write-back" / "tierfs-writeback" / "ab" / "1.data"
    assert data.read_bytes() == b"pv-1 old"
    assert paths.adopt_left_journal(state, "pv-1", new) is None  # it has a journal now
    assert len(list((state / "volumes").iterdir())) == 3


@pytest.mark.parametrize(
    ("endpoint", "extra", "key_file", "refused"),
    [
        ("http://attacker.example:8080", (), False, True),
        ("https://googleapis.com.attacker.example", (), False, True),
        ("http://attacker.example:8080", ("anonymous-access",), False, False),
        ("http://attacker.example:8080", (), True, False),  # the volume's own key goes there
        ("https://storage-psc.p.googleapis.com", (), False, False),  # Private Service Connect
    ],
)
def test_a_custom_endpoint_never_gets_the_plugins_own_credentials(
    endpoint: str, extra: tuple[str, ...], key_file: bool, refused: bool
) -> None:
    """A volume author could name a host of theirs as the endpoint: with neither a key
    secret nor anonymous access, the plugin's token went there with every request."""
    request = Request("b-bucket", TARGET, mount_flags=(f"custom-endpoint={endpoint}", *extra))
    if refused:
        with pytest.raises(BadRequest, match="the plugin's own credentials"):
            plan(request, LAYOUT, key_file=key_file)
    else:
        assert plan(request, LAYOUT, key_file=key_file).connection["endpoint"] == endpoint
