"""Which containers hold a device, from the kubelet's pod-resources socket
(``v1.PodResourcesLister``, ``List`` and ``Get``).

The kubelet says, per pod and container, the device-plugin devices it allocated (resource
name and device IDs) and the DRA claims the container uses (claim namespace and name; per
claim resource its CDI device names and, from Kubernetes 1.31, the driver, pool and device).
:func:`read_assignments` returns that as plain values; :class:`Assignments` answers "who
holds this device" for a device-plugin device and for a DRA device. The socket is read only;
every failure is one line naming it, within the caller's bound. An entry the kubelet sent
without a pod or container name is left out with one line in :attr:`Assignments.notes`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc

from cdi_gen._proto.podresources.v1 import api_pb2, api_pb2_grpc
from cdi_gen.errors import quote
from cdi_gen.localclient import LocalCallError, call_failure, local_channel
from cdi_gen.paths import POD_RESOURCES_SOCKET

__all__ = [
    "POD_RESOURCES_SOCKET",
    "TIMEOUT_SECONDS",
    "Assignments",
    "ClaimDevice",
    "ContainerDevices",
    "ContainerRef",
    "PluginDevice",
    "PodResourcesError",
    "read_assignments",
    "read_pod_assignments",
]

#: How long one read may take: the kubelet answers from memory, and a device that came back
#: must reach its containers within a second.
TIMEOUT_SECONDS = 0.5
_WHAT = "pod-resources"


class PodResourcesError(LocalCallError):
    """One line: the pod-resources socket and why it gave no answer."""


@dataclass(frozen=True, slots=True)
class ContainerRef:
    """A container as the kubelet names it: pod namespace, pod name, container name."""

    namespace: str
    pod: str
    container: str

    def __str__(self) -> str:
        return f"{self.namespace}/{self.pod}/{self.container}"


@dataclass(frozen=True, slots=True)
class PluginDevice:
    """A device-plugin device: the extended resource's name and the plugin's device ID."""

    resource_name: str
    device_id: str


@dataclass(frozen=True, slots=True)
class ClaimDevice:
    """One device of a DRA claim a container uses. ``driver``, ``pool`` and ``device`` are
    empty from a kubelet before 1.31, which sends only the CDI device names."""

    claim_namespace: str
    claim_name: str
    driver: str
    pool: str
    device: str
    cdi_devices: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class ContainerDevices:
    """What one container holds."""

    container: ContainerRef
    plugin_devices: tuple[PluginDevice, ...]
    claim_devices: tuple[ClaimDevice, ...]


@dataclass(frozen=True, slots=True)
class Assignments:
    """Every container the kubelet listed with what it holds, and one line per entry left out."""

    containers: tuple[ContainerDevices, ...]
    notes: tuple[str, ...] = ()

    def holding_plugin_device(self, resource_name: str, device_id: str) -> tuple[ContainerRef, ...]:
        """The containers allocated device ``device_id`` of extended resource ``resource_name``
        (an empty name or ID matches nothing)."""
        if not (resource_name and device_id):
            return ()
        wanted = PluginDevice(resource_name, device_id)
        return tuple(c.container for c in self.containers if wanted in c.plugin_devices)

    def holding_claim_device(self, driver: str, pool: str, device: str) -> tuple[ContainerRef, ...]:
        """The containers whose claims hold ``device`` of ``pool`` published by ``driver``.

        An empty part matches nothing: a kubelet before 1.31 sends all three empty, and its
        entries are found by CDI device name instead.
        """
        if not (driver and pool and device):
            return ()
        return tuple(
            c.container
            for c in self.containers
            if any((d.driver, d.pool, d.device) == (driver, pool, device) for d in c.claim_devices)
        )

    def holding_cdi_device(
        self, cdi_device: str, claim: tuple[str, str] | None = None
    ) -> tuple[ContainerRef, ...]:
        """The containers given CDI device ``cdi_device`` (``vendor/class=name``) through a
        claim, through claim ``(namespace, name)`` only when ``claim`` is given (an empty
        name matches nothing)."""
        if not cdi_device:
            return ()
        return tuple(
            c.container
            for c in self.containers
            if any(
                cdi_device in d.cdi_devices
                and (claim is None or (d.claim_namespace, d.claim_name) == claim)
                for d in c.claim_devices
            )
        )


def read_assignments(
    socket: Path = POD_RESOURCES_SOCKET, timeout: float = TIMEOUT_SECONDS
) -> Assignments:
    """Every pod's containers with their devices (``List``). Raises :class:`PodResourcesError`."""
    with _answering(socket, "List", timeout) as channel:
        stub = api_pb2_grpc.PodResourcesListerStub(channel)
        answer = stub.List(api_pb2.ListPodResourcesRequest(), timeout=timeout)
    return _assignments(answer.pod_resources)


def read_pod_assignments(
    namespace: str, pod: str, socket: Path = POD_RESOURCES_SOCKET, timeout: float = TIMEOUT_SECONDS
) -> Assignments:
    """One pod's containers with their devices (``Get``; the kubelet's gate
    ``KubeletPodResourcesGet``). Raises :class:`PodResourcesError`."""
    request = api_pb2.GetPodResourcesRequest(pod_name=pod, pod_namespace=namespace)
    with _answering(socket, "Get", timeout) as channel:
        answer = api_pb2_grpc.PodResourcesListerStub(channel).Get(request, timeout=timeout)
    if not answer.HasField("pod_resources"):
        return Assignments(())
    return _assignments([answer.pod_resources])


@contextlib.contextmanager
def _answering(socket: Path, method: str, timeout: float) -> Iterator[grpc.Channel]:
    """A channel to the kubelet whose every failure becomes one :class:`PodResourcesError`."""
    try:
        with local_channel(socket, _WHAT) as channel:
            yield channel
    except LocalCallError as exc:
        raise PodResourcesError(str(exc)) from None
    except grpc.RpcError as exc:
        why = call_failure(socket, _WHAT, f"PodResourcesLister/{method}", exc, timeout)
        raise PodResourcesError(why) from None


def _assignments(pods: Iterable[api_pb2.PodResources]) -> Assignments:
    containers: list[ContainerDevices] = []
    notes: list[str] = []
    for pod in pods:
        for container in pod.containers:
            ref = ContainerRef(pod.namespace, pod.name, container.name)
            if not (ref.namespace and ref.pod and ref.container):
                notes.append(
                    f"pod-resources: left out a container without a namespace, pod or "
                    f"container name: namespace {quote(ref.namespace)}, pod {quote(ref.pod)}, "
                    f"container {quote(ref.container)}"
                )
                continue
            plugin = tuple(
                PluginDevice(devices.resource_name, device_id)
                for devices in container.devices
                for device_id in devices.device_ids
            )
            claims = tuple(
                ClaimDevice(
                    claim.claim_namespace,
                    claim.claim_name,
                    resource.driver_name,
                    resource.pool_name,
                    resource.device_name,
                    tuple(cdi.name for cdi in resource.cdi_devices),
                )
                for claim in container.dynamic_resources
                for resource in claim.claim_resources
            )
            containers.append(ContainerDevices(ref, plugin, claims))
    return Assignments(tuple(containers), tuple(notes))
