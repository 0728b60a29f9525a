"""deploy/kubernetes/: every manifest valid against the Kubernetes schemas (offline, strict:
no unknown field), and agreeing with the plugin (driver name, arguments, the example's
options). Fails, never skips, when the validator cannot run."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from tests.csi_plugin import CHECKPOINTING
from tierfs.csi.identity import DRIVER_NAME
from tierfs.csi.server import parser
from tierfs.csi.volume import Layout, Request, daemon_args, load

DEPLOY = Path(__file__).resolve().parent.parent / "deploy" / "kubernetes"
KUBERNETES = "1.33.0"  # a version kubernetes-validate bundles the schemas of
MANIFESTS = sorted(DEPLOY.rglob("*.yaml"))


def documents(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text(encoding="utf-8")) if d]


def by_kind(kind: str) -> list[dict[str, Any]]:
    return [d for path in MANIFESTS for d in documents(path) if d["kind"] == kind]


def test_there_are_manifests() -> None:
    names = {p.relative_to(DEPLOY).as_posix() for p in MANIFESTS}
    assert {"csidriver.yaml", "daemonset.yaml", "examples/static-pv.yaml"} <= names


def test_the_image_builds_the_venv_as_make_venv_does() -> None:
    """Not a build (no container runtime here): the Dockerfile copies every package the
    wheel is made of and the patched pyfuse3's build script, and starts the plugin."""
    dockerfile = (DEPLOY / "Dockerfile").read_text(encoding="utf-8")
    for package in ("tierfs", "mount_options", "deploy/pyfuse3"):
        assert f"COPY {package} {package}" in dockerfile
    assert "deploy/pyfuse3/build.sh /opt/tierfs/bin/python" in dockerfile
    assert " fuse3 " in dockerfile
    assert 'ENTRYPOINT ["/opt/tierfs/bin/tierfs", "csi"]' in dockerfile


@pytest.mark.parametrize("path", MANIFESTS, ids=lambda p: p.relative_to(DEPLOY).as_posix())
def test_manifest_is_valid(path: Path) -> None:
    for document in documents(path):
        kubernetes_validate.validate(document, KUBERNETES, strict=True)


def test_the_validator_rejects_a_bad_manifest() -> None:
    (driver,) = by_kind("CSIDriver")
    broken = {**driver, "spec": {**driver["spec"], "attachRequired": "no"}}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, KUBERNETES, strict=True)


def test_manifests_agree_with_the_plugin() -> None:
    (driver,) = by_kind("CSIDriver")
    assert driver["metadata"]["name"] == DRIVER_NAME
    assert driver["spec"]["attachRequired"] is False
    assert driver["spec"]["volumeLifecycleModes"] == ["Persistent", "Ephemeral"]
    (daemonset,) = by_kind("DaemonSet")
    containers = {c["name"]: c for c in daemonset["spec"]["template"]["spec"]["containers"]}
    plugin = containers["tierfs-csi"]
    args = parser().parse_args(plugin["args"])
    assert args.endpoint == "unix:///csi/csi.sock"
    kubelet = {m["name"]: m for m in plugin["volumeMounts"]}["kubelet-dir"]
    assert kubelet["mountPropagation"] == "Bidirectional"
    assert kubelet["mountPath"] == str(args.kubelet_root)
    assert plugin["securityContext"]["privileged"] is True
    registrar = containers["node-driver-registrar"]["args"]
    assert (
        f"--kubelet-registration-path=/var/lib/kubelet/plugins/{DRIVER_NAME}/csi.sock" in registrar
    )
    assert "liveness-probe" in containers
    for pv in by_kind("PersistentVolume"):
        assert pv["spec"]["csi"]["driver"] == DRIVER_NAME
    for pod in by_kind("Pod"):
        for volume in pod["spec"]["volumes"]:
            if "csi" in volume:
                assert volume["csi"]["driver"] == DRIVER_NAME


def test_the_examples_options_are_accepted() -> None:
    (pv,) = by_kind("PersistentVolume")
    assert pv["spec"]["mountOptions"] == [CHECKPOINTING]
    csi = pv["spec"]["csi"]
    request = Request(
        csi["volumeHandle"],
        "/var/lib/kubelet/pods/p/volumes/kubernetes.io~csi/checkpoints/mount",
        mount_flags=tuple(pv["spec"]["mountOptions"]),
        context=tuple(csi["volumeAttributes"].items()),
    )
    config = load(daemon_args(request, Layout(Path("/state/v")), key_file=True))
    assert config.bucket == "my-checkpoint-bucket"
    assert config["file-cache:max-size-mb"] == 100 << 10
    for pod in by_kind("Pod"):
        for volume in pod["spec"]["volumes"]:
            if "csi" in volume:
                inline = Request(
                    "csi-inline",
                    "/var/lib/kubelet/pods/p/volumes/kubernetes.io~csi/data/mount",
                    context=(
                        *volume["csi"]["volumeAttributes"].items(),
                        ("csi.storage.k8s.io/ephemeral", "true"),
                    ),
                    readonly=volume["csi"].get("readOnly", False),
                )
                assert load(daemon_args(inline, Layout(Path("/s")), key_file=False)).bucket
