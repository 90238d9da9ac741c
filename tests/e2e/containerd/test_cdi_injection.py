"""CDI injection by containerd 1.7 through the kubelet's CRI path, on hand-written specs.

Each test creates real loop devices, writes a spec for them into the daemon's spec folder and
asks for them the way the kubelet does: names copied unchanged into CreateContainer.CDI_devices
(or, the older way, in cdi.k8s.io/ annotations).
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path

import grpc
import pytest
from loopdev import LoopDevice, LoopDevices

from .conftest import ContainerdFactory, Pods, SpecFolders
from .cri import CRIClient, Finished
from .daemon import Containerd
from .image import IMAGE_NAME

pytestmark = pytest.mark.e2e

KIND = "example.com/loop"
# Prints one NODE line per loop device node in the container, then the environment.
LIST_SCRIPT = 'for f in /dev/loop*; do [ -e "$f" ] && stat -c \'NODE %n %F %t:%T\' "$f"; done; env'


def qualified(dev: LoopDevice) -> str:
    return f"{KIND}={dev.name}"


def write_spec(
    folder: Path,
    devices: Sequence[LoopDevice],
    name: str = "example.com-loop",
    version: str = "0.3.0",
    class_env: str = "loop",
) -> Path:
    """A spec as cdi-gen emits one: no major/minor pinned, the runtime stats the host node."""
    spec = {
        "cdiVersion": version,
        "kind": KIND,
        "containerEdits": {"env": [f"CDI_GEN_CLASS={class_env}"]},
        "devices": [
            {
                "name": d.name,
                "containerEdits": {
                    "deviceNodes": [{"path": str(d.path)}],
                    "env": [f"CDI_GEN_LOOP_{d.number}={d.name}"],
                },
            }
            for d in devices
        ],
    }
    path = folder / f"{name}.json"
    tmp = folder / f".{name}.tmp"
    tmp.write_text(json.dumps(spec))
    os.replace(tmp, path)  # atomic: containerd's watcher must never see half a file
    return path


def nodes(result: Finished) -> dict[str, tuple[str, int, int]]:
    """Device nodes the container saw: path -> (file type, major, minor)."""
    out = {}
    for line in result.stdout:
        if line.startswith("NODE "):
            _, path, rest = line.split(" ", 2)
            kind, majmin = rest.rsplit(" ", 1)
            major, minor = (int(x, 16) for x in majmin.split(":"))
            out[path] = (kind, major, minor)
    return out


def run_listing(
    cri: CRIClient,
    pods: Pods,
    name: str,
    cdi_devices: Sequence[str] = (),
    annotations: dict[str, str] | None = None,
) -> Finished:
    pod = pods.new(name)
    result = cri.run_to_end(
        pod, "lister", IMAGE_NAME, LIST_SCRIPT, cdi_devices=cdi_devices, annotations=annotations
    )
    assert result.exit_code == 0, result
    return result


def test_cdi_devices_field_injects_the_node_and_env(
    pods: Pods, spec_folders: SpecFolders, loops: LoopDevices
) -> None:
    dev = loops.add()
    write_spec(spec_folders.run, [dev])

    result = run_listing(pods.cri, pods, "one-device", cdi_devices=[qualified(dev)])

    assert nodes(result) == {str(dev.path): ("block special file", *dev.rdev())}
    assert result.env["CDI_GEN_CLASS"] == "loop"
    assert result.env[f"CDI_GEN_LOOP_{dev.number}"] == dev.name


def test_without_a_request_the_container_gets_no_device(
    pods: Pods, spec_folders: SpecFolders, loops: LoopDevices
) -> None:
    dev = loops.add()
    write_spec(spec_folders.run, [dev])

    result = run_listing(pods.cri, pods, "no-request")

    assert nodes(result) == {}
    assert "CDI_GEN_CLASS" not in result.env


def test_two_devices_in_one_container(
    pods: Pods, spec_folders: SpecFolders, loops: LoopDevices
) -> None:
    a, b = loops.add(), loops.add()
    write_spec(spec_folders.run, [a, b])

    result = run_listing(pods.cri, pods, "two-devices", cdi_devices=[qualified(a), qualified(b)])

    assert nodes(result) == {
        str(a.path): ("block special file", *a.rdev()),
        str(b.path): ("block special file", *b.rdev()),
    }
    assert result.env[f"CDI_GEN_LOOP_{a.number}"] == a.name
    assert result.env[f"CDI_GEN_LOOP_{b.number}"] == b.name


def test_a_removed_and_withdrawn_device_is_unresolvable(
    pods: Pods, spec_folders: SpecFolders, loops: LoopDevices
) -> None:
    keep, gone = loops.add(), loops.add()
    write_spec(spec_folders.run, [keep, gone])
    loops.remove(gone)
    write_spec(spec_folders.run, [keep])  # what the agent does after the remove event

    pod = pods.new("removed")
    with pytest.raises(grpc.RpcError) as err:
        pods.cri.create_container(
            pod, "lister", IMAGE_NAME, ["/bin/true"], cdi_devices=[qualified(gone)]
        )

    assert "unresolvable CDI devices" in str(err.value.details())
    assert qualified(gone) in str(err.value.details())
    # The device that is still there is unaffected.
    result = run_listing(pods.cri, pods, "kept", cdi_devices=[qualified(keep)])
    assert list(nodes(result)) == [str(keep.path)]


def test_annotation_path_injects_the_device(
    pods: Pods, spec_folders: SpecFolders, loops: LoopDevices
) -> None:
    dev = loops.add()
    write_spec(spec_folders.run, [dev])
    # What a plugin in annotation mode returns and the kubelet copies onto the container.
    annotations = {f"cdi.k8s.io/cdi-gen_{dev.name}": qualified(dev)}

    result = run_listing(pods.cri, pods, "annotated", annotations=annotations)

    assert nodes(result) == {str(dev.path): ("block special file", *dev.rdev())}
    assert result.env["CDI_GEN_CLASS"] == "loop"


def test_with_cdi_disabled_the_request_is_silently_dropped(
    start_containerd: ContainerdFactory, loops: LoopDevices
) -> None:
    daemon = start_containerd(enable_cdi=False)
    dev = loops.add()
    write_spec(daemon.spec_dirs[-1], [dev])
    pods = Pods(daemon)
    try:
        result = run_listing(
            pods.cri,
            pods,
            "cdi-off",
            cdi_devices=[qualified(dev)],
            annotations={f"cdi.k8s.io/cdi-gen_{dev.name}": qualified(dev)},
        )
    finally:
        pods.remove_all()

    # The failure mode doctor exists for: no error anywhere, and no device in the container.
    assert nodes(result) == {}
    assert "CDI_GEN_CLASS" not in result.env


@pytest.mark.parametrize(
    ("version", "accepted"), [("0.3.0", True), ("0.5.0", True), ("0.8.0", True), ("1.0.0", False)]
)
def test_cdi_versions_the_tested_containerd_accepts(
    pods: Pods, spec_folders: SpecFolders, loops: LoopDevices, version: str, accepted: bool
) -> None:
    # Debian 13's 1.7.24 is built with CDI library 0.8.0 (upstream 1.7.24 has 0.7.2); a newer
    # cdiVersion makes the whole file unparseable. deploy/containerd/README.md quotes this.
    dev = loops.add()
    write_spec(spec_folders.run, [dev], version=version)

    pod = pods.new(f"cdi-{version.replace('.', '-')}")
    if accepted:
        result = pods.cri.run_to_end(
            pod, "lister", IMAGE_NAME, LIST_SCRIPT, cdi_devices=[qualified(dev)]
        )
        assert list(nodes(result)) == [str(dev.path)]
    else:
        with pytest.raises(grpc.RpcError) as err:
            pods.cri.create_container(
                pod, "lister", IMAGE_NAME, ["/bin/true"], cdi_devices=[qualified(dev)]
            )
        assert "unresolvable CDI devices" in str(err.value.details())


def test_a_broken_spec_file_is_skipped_and_only_logged(
    containerd: Containerd, pods: Pods, spec_folders: SpecFolders, loops: LoopDevices
) -> None:
    dev = loops.add()
    write_spec(spec_folders.run, [dev])
    (spec_folders.run / "example.com-broken.json").write_text('{"cdiVersion": "0.3.0", "kind"')

    result = run_listing(pods.cri, pods, "broken-neighbour", cdi_devices=[qualified(dev)])

    assert list(nodes(result)) == [str(dev.path)]
    assert "example.com-broken.json" in containerd.log_text()


def test_the_later_spec_folder_wins_for_the_same_device(
    pods: Pods, spec_folders: SpecFolders, loops: LoopDevices
) -> None:
    # cdi_spec_dirs = [etc, run] as in deploy/: /var/run/cdi (cdi-gen's) overrides /etc/cdi.
    dev = loops.add()
    write_spec(spec_folders.etc, [dev], class_env="from-etc")
    write_spec(spec_folders.run, [dev], class_env="from-run")

    result = run_listing(pods.cri, pods, "priority", cdi_devices=[qualified(dev)])

    assert result.env["CDI_GEN_CLASS"] == "from-run"


def test_the_same_device_twice_in_one_folder_is_unresolvable(
    pods: Pods, spec_folders: SpecFolders, loops: LoopDevices
) -> None:
    # Why the writer keeps one file per class and never leaves a second copy behind.
    dev = loops.add()
    write_spec(spec_folders.run, [dev], name="example.com-loop")
    write_spec(spec_folders.run, [dev], name="example.com-loop-copy")

    pod = pods.new("conflict")
    with pytest.raises(grpc.RpcError) as err:
        pods.cri.create_container(
            pod, "lister", IMAGE_NAME, ["/bin/true"], cdi_devices=[qualified(dev)]
        )
    assert "unresolvable CDI devices" in str(err.value.details())
