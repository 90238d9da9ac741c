"""Who holds a device, asked of real gRPC servers on real unix sockets: the kubelet's
pod-resources socket (device-plugin devices and DRA claims per container) and the runtime's
CRI socket (each container's init process and OCI spec, in containerd's and CRI-O's shapes).
A missing or silent socket fails in one line within the bound; a broken answer about one
container refuses that container in one line and the others are still found."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cdi_gen.kubelet import containers, podresources
from cdi_gen.kubelet.podresources import ContainerRef
from tests.fakes.cri import FakeCri, containerd_info, crio_info, runtime_spec, silent_socket
from tests.fakes.podresources import FakePodResources, claim, container, plugin_devices, pod

pytestmark = pytest.mark.timeout(60)

CDI = "example.com/serial=ttyUSB0"
RULES = [
    {"allow": False, "access": "rwm"},
    {"allow": True, "type": "c", "major": 1, "minor": 3, "access": "rwm"},
    {"allow": True, "type": "c", "major": 188, "minor": 0, "access": "rw"},
]
NODES = [{"path": "/dev/ttyUSB0", "type": "c", "major": 188, "minor": 0, "fileMode": 432}]
#: A bound far above what a local answer takes and far below the test's timeout.
BOUND = 0.5


@pytest.fixture
def kubelet(short_dir: Path) -> Iterator[FakePodResources]:
    pods = [
        pod(
            "default",
            "modem",
            container("app", devices=[plugin_devices("example.com/serial", "ttyUSB0", "ttyUSB1")]),
            # Empty values a broken kubelet could send: an empty query must not find them.
            container("sidecar", devices=[plugin_devices("example.com/serial", "")]),
        ),
        pod(
            "radio",
            "sdr",
            container(
                "rx",
                claims=[
                    claim("radio", "sdr-claim", ("serial.example.com", "node-a", "usb-1", [CDI]))
                ],
            ),
        ),
        pod(
            "old",
            "legacy",
            # A 1.30 kubelet: CDI names only, no driver, pool or device.
            container("app", claims=[claim("old", "c1", ("", "", "", [CDI, ""]))]),
        ),
    ]
    with FakePodResources(short_dir / "kubelet.sock", pods) as fake:
        yield fake


def test_plugin_device_holders_found(kubelet: FakePodResources) -> None:
    found = podresources.read_assignments(kubelet.socket, BOUND)
    assert found.holding_plugin_device("example.com/serial", "ttyUSB1") == (
        ContainerRef("default", "modem", "app"),
    )
    assert found.notes == ()


def test_claim_device_holders_found(kubelet: FakePodResources) -> None:
    found = podresources.read_assignments(kubelet.socket, BOUND)
    sdr = ContainerRef("radio", "sdr", "rx")
    assert found.holding_claim_device("serial.example.com", "node-a", "usb-1") == (sdr,)
    legacy = ContainerRef("old", "legacy", "app")
    assert found.holding_cdi_device(CDI) == (sdr, legacy)
    assert found.holding_cdi_device(CDI, claim=("radio", "sdr-claim")) == (sdr,)


def test_unknown_device_has_no_holder(kubelet: FakePodResources) -> None:
    found = podresources.read_assignments(kubelet.socket, BOUND)
    assert found.holding_plugin_device("example.com/serial", "ttyUSB9") == ()
    assert found.holding_plugin_device("example.com/other", "ttyUSB0") == ()
    assert found.holding_claim_device("serial.example.com", "node-a", "usb-9") == ()
    # An empty driver must not match a pre-1.31 entry, whose driver is empty too.
    assert found.holding_claim_device("", "", "") == ()
    assert found.holding_cdi_device("example.com/serial=ttyUSB9") == ()
    assert found.holding_cdi_device("") == ()
    assert found.holding_plugin_device("example.com/serial", "") == ()


def test_one_pod_through_get(kubelet: FakePodResources) -> None:
    found = podresources.read_pod_assignments("radio", "sdr", kubelet.socket, BOUND)
    assert [c.container for c in found.containers] == [ContainerRef("radio", "sdr", "rx")]
    with pytest.raises(podresources.PodResourcesError) as caught:
        podresources.read_pod_assignments("radio", "gone", kubelet.socket, BOUND)
    assert str(caught.value).startswith(f"pod-resources socket {kubelet.socket}: ")
    assert "PodResourcesLister/Get failed: UNKNOWN: 'pod gone not found in radio'" in str(
        caught.value
    )


def test_nameless_entry_left_out_with_a_line(short_dir: Path) -> None:
    pods = [
        pod("", "ghost", container("app", devices=[plugin_devices("r", "d")])),
        pod("ns", "real", container("app", devices=[plugin_devices("r", "d")])),
    ]
    with FakePodResources(short_dir / "kubelet.sock", pods) as fake:
        found = podresources.read_assignments(fake.socket, BOUND)
    assert found.holding_plugin_device("r", "d") == (ContainerRef("ns", "real", "app"),)
    assert found.notes == (
        "pod-resources: left out a container without a namespace, pod or container name: "
        "namespace '', pod 'ghost', container 'app'",
    )


def test_kubelet_socket_missing_is_one_line(short_dir: Path) -> None:
    socket = short_dir / "kubelet.sock"
    with pytest.raises(podresources.PodResourcesError) as caught:
        podresources.read_assignments(socket, BOUND)
    assert str(caught.value) == f"pod-resources socket {socket}: no such socket"


def test_kubelet_socket_silent_fails_within_the_bound(short_dir: Path) -> None:
    with silent_socket(short_dir / "kubelet.sock") as socket:
        started = time.monotonic()
        with pytest.raises(podresources.PodResourcesError) as caught:
            podresources.read_assignments(socket, 0.2)
        took = time.monotonic() - started
    assert str(caught.value) == (
        f"pod-resources socket {socket}: no answer to PodResourcesLister/List within 0.2 s"
    )
    assert "\n" not in str(caught.value)
    # Generous against a loaded machine; a call without a deadline would hit the test timeout.
    assert took < 5


# ---- the runtime's CRI ---------------------------------------------------------------------

SHAPES = {"containerd": containerd_info, "cri-o": crio_info}


def _runtime(short_dir: Path, shape: str) -> FakeCri:
    cri = FakeCri(short_dir / "cri.sock", shape, "1")
    make = SHAPES[shape]
    cri.add_sandbox("sb-modem", "default", "modem", uid="uid-modem")
    cri.add_container(
        "c-app",
        "sb-modem",
        "app",
        make("sb-modem", 4242, runtime_spec("kubepods-pod1.slice:cri:c-app", RULES, NODES)),
    )
    cri.add_container(
        "c-side", "sb-modem", "sidecar", make("sb-modem", 4343, runtime_spec("/kubepods/side"))
    )
    # The same pod's previous sandbox, not ready, with an exited container of the same name.
    cri.add_sandbox("sb-old", "default", "modem", uid="uid-modem", ready=False)
    cri.add_container("c-old", "sb-old", "app", make("sb-old", 99, runtime_spec("/old")), state=2)
    # Another pod with a container of the same name.
    cri.add_sandbox("sb-other", "default", "other")
    cri.add_container("c-other", "sb-other", "app", make("sb-other", 77, runtime_spec("/other")))
    return cri


@pytest.mark.parametrize("shape", sorted(SHAPES))
@pytest.mark.parametrize("honour_filters", [True, False], ids=["filtered", "unfiltered"])
def test_running_container_from_cri(short_dir: Path, shape: str, honour_filters: bool) -> None:
    with _runtime(short_dir, shape) as cri:
        cri.honour_filters = honour_filters
        app = ContainerRef("default", "modem", "app")
        side = ContainerRef("default", "modem", "sidecar")
        found = containers.find_running(cri.socket, [app, side], BOUND)
    assert found.notes == ()
    first, second = found.containers
    assert first == containers.RunningContainer(
        ref=app,
        pod_uid="uid-modem",
        sandbox_id="sb-modem",
        container_id="c-app",
        pid=4242,
        cgroups_path="kubepods-pod1.slice:cri:c-app",
        device_rules=tuple(RULES),
        devices=tuple(NODES),
    )
    assert (second.container_id, second.pid, second.device_rules, second.devices) == (
        "c-side",
        4343,
        (),
        (),
    )


def _broken(spec: dict[str, Any], **document: Any) -> dict[str, str]:
    return {"info": json.dumps({"sandboxID": "sb", "pid": 5, "runtimeSpec": spec, **document})}


GOOD_SPEC = runtime_spec("/kubepods/x", RULES, NODES)
BROKEN = {
    "not json": ({"info": "{pid: 5"}, "verbose 'info' is not JSON: '{pid: 5'"),
    "no info key": ({"other": "{}"}, "verbose status has no 'info' (keys: ['other'])"),
    "not an object": ({"info": "[1, 2]"}, "verbose 'info' is not a JSON object: '[1, 2]'"),
    "too deep": ({"info": "[" * 100_000 + "]" * 100_000}, "verbose 'info' is too deep: '[[["),
    "huge": (
        {"info": json.dumps({"pid": 5, "pad": "x" * containers.MAX_INFO_BYTES})},
        "verbose 'info' is 1048597 long, over the 1048576 allowed",
    ),
    "missing pid": (
        {"info": json.dumps({"runtimeSpec": GOOD_SPEC})},
        "'pid' None is not a process ID (1 to 4194304)",
    ),
    "pid 0": (_broken(GOOD_SPEC, pid=0), "'pid' 0 is not a process ID (1 to 4194304)"),
    "pid true": (_broken(GOOD_SPEC, pid=True), "'pid' True is not a process ID"),
    "pid text": (_broken(GOOD_SPEC, pid="5"), "'pid' '5' is not a process ID"),
    "pid huge": (_broken(GOOD_SPEC, pid=2**40), "'pid' 1099511627776 is not a process ID"),
    "no spec": (
        {"info": json.dumps({"pid": 5})},
        "info.runtimeSpec None is not a JSON object",
    ),
    "no linux": (_broken({"ociVersion": "1"}), "runtimeSpec.linux None is not a JSON object"),
    "no cgroups path": (
        _broken({"linux": {"resources": {}}}),
        "runtimeSpec.linux.cgroupsPath None is no cgroup path",
    ),
    "rules not a list": (
        _broken({"linux": {"cgroupsPath": "/x", "resources": {"devices": "all"}}}),
        "runtimeSpec.linux.resources.devices 'all' is not a list of JSON objects",
    ),
    "node not an object": (
        _broken({"linux": {"cgroupsPath": "/x", "devices": [1]}}),
        "runtimeSpec.linux.devices [1] is not a list of JSON objects",
    ),
}


@pytest.mark.parametrize("case", sorted(BROKEN))
def test_broken_info_refuses_that_container_only(short_dir: Path, case: str) -> None:
    info, line = BROKEN[case]
    with _runtime(short_dir, "containerd") as cri:
        cri.add_container("c-bad", "sb-modem", "bad", info)
        bad = ContainerRef("default", "modem", "bad")
        app = ContainerRef("default", "modem", "app")
        found = containers.find_running(cri.socket, [bad, app], BOUND)
    assert [c.container_id for c in found.containers] == ["c-app"]
    (note,) = found.notes
    assert note.startswith(f"CRI socket {cri.socket}: container default/modem/bad: {line}")
    assert "\n" not in note and len(note) < 400


def test_container_without_a_running_one_is_a_line(short_dir: Path) -> None:
    with _runtime(short_dir, "cri-o") as cri:
        # Two ready sandboxes of one pod name, each with a running "app": ambiguous.
        cri.add_sandbox("sb-twin", "default", "other", uid="uid-twin")
        cri.add_container("c-twin", "sb-twin", "app", crio_info("sb-twin", 8, GOOD_SPEC))
        refs = [
            ContainerRef("default", "gone", "app"),
            ContainerRef("default", "modem", "nope"),
            ContainerRef("default", "other", "app"),
        ]
        found = containers.find_running(cri.socket, refs, BOUND)
    assert found.containers == ()
    prefix = f"CRI socket {cri.socket}: container"
    assert found.notes == (
        f"{prefix} default/gone/app: no ready pod sandbox",
        f"{prefix} default/modem/nope: no running container of that name",
        f"{prefix} default/other/app: 2 running containers of that name ('c-other', 'c-twin'): "
        "ambiguous",
    )


def test_container_gone_before_its_status_is_a_line(short_dir: Path) -> None:
    with _runtime(short_dir, "containerd") as cri:
        cri.add_container("c-gone", "sb-modem", "gone", containerd_info("sb-modem", 9, GOOD_SPEC))
        # Listed, then removed before ContainerStatus: the runtime answers NOT_FOUND.
        cri.status_gone.add("c-gone")
        refs = [ContainerRef("default", "modem", "gone"), ContainerRef("default", "modem", "app")]
        found = containers.find_running(cri.socket, refs, BOUND)
    assert [c.container_id for c in found.containers] == ["c-app"]
    assert found.notes == (
        f"CRI socket {cri.socket}: container default/modem/gone: RuntimeService/ContainerStatus "
        "of 'c-gone' failed: NOT_FOUND: \"container 'c-gone' not found\"",
    )


def test_cri_socket_missing_and_silent_are_one_line(short_dir: Path) -> None:
    ref = ContainerRef("default", "modem", "app")
    missing = short_dir / "none.sock"
    with pytest.raises(containers.CriContainersError) as caught:
        containers.find_running(missing, [ref], BOUND)
    assert str(caught.value) == f"CRI socket {missing}: no such socket"
    with silent_socket(short_dir / "cri.sock") as socket:
        started = time.monotonic()
        with pytest.raises(containers.CriContainersError) as caught:
            containers.find_running(socket, [ref], 0.2)
        took = time.monotonic() - started
    assert str(caught.value) == (
        f"CRI socket {socket}: no answer to RuntimeService/ListPodSandbox within 0.2 s"
    )
    assert took < 5
