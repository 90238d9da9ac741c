"""A pod's running containers as the container runtime sees them, from its CRI socket: the
init process, its start time and the OCI spec's cgroup path and device rules, for giving a
running container a device that came back; and :func:`stop_container`, a container stopped so
that the kubelet starts it again with the current spec.

For each container the kubelet names (:class:`~cdi_gen.kubelet.podresources.ContainerRef`):
``ListPodSandbox`` (the pod's ready sandbox, by the kubelet's labels, checked against the
sandbox's metadata), ``ListContainers`` (the sandbox's running container of that name), then
``ContainerStatus`` with ``verbose``: containerd (1.7, 2.x) and CRI-O (1.36) both answer an
``info`` map whose key ``"info"`` holds one JSON document with the init process's ``pid`` and
the container's OCI ``runtimeSpec``. The socket is read only; all calls share one bound.

An answer that cannot be trusted (not JSON, too big or too deep, no pid, pid 0, no spec, a
spec field of the wrong type, two running containers for one name) refuses that container
with one line in :attr:`Found.notes`, and the others are still found. A socket that is
missing, broken or slow fails the whole lookup with one :class:`CriContainersError` line.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import grpc

from cdi_gen._proto.cri.v1 import api_pb2, api_pb2_grpc
from cdi_gen.errors import quote
from cdi_gen.kubelet.podresources import ContainerRef
from cdi_gen.localclient import Deadline, LocalCallError, call_failure, local_channel

__all__ = [
    "MAX_INFO_BYTES",
    "MAX_PID",
    "TIMEOUT_SECONDS",
    "CriContainersError",
    "Found",
    "RunningContainer",
    "find_running",
    "stop_container",
]

#: How long one lookup (all its calls together) may take: a device that came back must reach
#: its containers within a second.
TIMEOUT_SECONDS = 0.5
#: The largest verbose ``info`` document taken: an OCI spec is tens of kilobytes.
MAX_INFO_BYTES = 1024 * 1024
#: The kernel's ceiling for a PID (``PID_MAX_LIMIT`` on 64-bit).
MAX_PID = 4 * 1024 * 1024
_WHAT = "CRI"
#: The labels the kubelet puts on every pod sandbox it asks a runtime for.
_NAMESPACE_LABEL = "io.kubernetes.pod.namespace"
_NAME_LABEL = "io.kubernetes.pod.name"
#: Statuses that say the runtime, not one container, gives no answer.
_SOCKET_CODES = frozenset({grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.UNAVAILABLE})


class CriContainersError(LocalCallError):
    """One line: the CRI socket and why it gave no answer."""


class _RefusedError(Exception):
    """One container's answer that cannot be used: one line without the container's name."""


@dataclass(frozen=True)
class RunningContainer:
    """A running container of a pod, as its runtime describes it.

    ``device_rules`` is the OCI spec's ``linux.resources.devices`` (the device cgroup rules
    the runtime applied, each a JSON object as the runtime sent it) and ``devices`` its
    ``linux.devices`` (the nodes created in the container); both are left for the caller to
    parse. Being dicts, they take no part in hashing.
    """

    ref: ContainerRef
    pod_uid: str
    sandbox_id: str
    container_id: str
    pid: int
    cgroups_path: str
    device_rules: tuple[dict[str, object], ...] = field(hash=False)
    devices: tuple[dict[str, object], ...] = field(hash=False)
    #: When the runtime started it (``status.started_at``, ns since the epoch; 0: not said):
    #: a process at ``pid`` that started later is another process given the same PID.
    started_at: int = 0


@dataclass(frozen=True, slots=True)
class Found:
    """The running containers found, and one line per container asked for and not given."""

    containers: tuple[RunningContainer, ...]
    notes: tuple[str, ...]


def find_running(
    socket: Path, refs: Iterable[ContainerRef], timeout: float = TIMEOUT_SECONDS
) -> Found:
    """The running container of each of ``refs`` at the runtime serving ``socket``.

    Raises :class:`CriContainersError` when the socket gives no answer within ``timeout``.
    """
    deadline = Deadline(timeout)
    found: list[RunningContainer] = []
    notes: list[str] = []
    method = "RuntimeService"
    try:
        with local_channel(socket, _WHAT) as channel:
            stub = api_pb2_grpc.RuntimeServiceStub(channel)
            sandboxes: dict[tuple[str, str], list[api_pb2.PodSandbox]] = {}
            for ref in dict.fromkeys(refs):
                pod = (ref.namespace, ref.pod)
                if pod not in sandboxes:
                    method = "RuntimeService/ListPodSandbox"
                    sandboxes[pod] = _ready_sandboxes(stub, ref, deadline)
                try:
                    method = "RuntimeService/ListContainers"
                    sandbox, container_id = _running_container(stub, ref, sandboxes[pod], deadline)
                    method = "RuntimeService/ContainerStatus"
                    info, started_at = _verbose_info(stub, container_id, deadline)
                    running = _running(ref, sandbox, container_id, info)
                    found.append(dataclasses.replace(running, started_at=started_at))
                except _RefusedError as exc:
                    notes.append(f"{_WHAT} socket {socket}: container {ref}: {exc}")
    except LocalCallError as exc:
        raise CriContainersError(str(exc)) from None
    except grpc.RpcError as exc:
        raise CriContainersError(call_failure(socket, _WHAT, method, exc, timeout)) from None
    return Found(tuple(found), tuple(notes))


def _ready_sandboxes(
    stub: api_pb2_grpc.RuntimeServiceStub, ref: ContainerRef, deadline: Deadline
) -> list[api_pb2.PodSandbox]:
    selector = {_NAMESPACE_LABEL: ref.namespace, _NAME_LABEL: ref.pod}
    ready = api_pb2.PodSandboxStateValue(state=api_pb2.SANDBOX_READY)
    request = api_pb2.ListPodSandboxRequest(
        filter=api_pb2.PodSandboxFilter(state=ready, label_selector=selector)
    )
    answer = stub.ListPodSandbox(request, timeout=deadline.remaining())
    # The filter is the runtime's to apply; the metadata is what the kubelet created the
    # sandbox with, so it decides (a runtime that ignored the filter touches no other pod).
    return [
        s
        for s in answer.items
        if s.state == api_pb2.SANDBOX_READY
        and (s.metadata.namespace, s.metadata.name) == (ref.namespace, ref.pod)
    ]


def _running_container(
    stub: api_pb2_grpc.RuntimeServiceStub,
    ref: ContainerRef,
    sandboxes: Sequence[api_pb2.PodSandbox],
    deadline: Deadline,
) -> tuple[api_pb2.PodSandbox, str]:
    if not sandboxes:
        raise _RefusedError("no ready pod sandbox")
    running = api_pb2.ContainerStateValue(state=api_pb2.CONTAINER_RUNNING)
    matches: list[tuple[api_pb2.PodSandbox, str]] = []
    for sandbox in sandboxes:
        request = api_pb2.ListContainersRequest(
            filter=api_pb2.ContainerFilter(state=running, pod_sandbox_id=sandbox.id)
        )
        answer = stub.ListContainers(request, timeout=deadline.remaining())
        matches.extend(
            (sandbox, c.id)
            for c in answer.containers
            if c.state == api_pb2.CONTAINER_RUNNING
            and c.pod_sandbox_id == sandbox.id
            and c.metadata.name == ref.container
        )
    if not matches:
        raise _RefusedError("no running container of that name")
    if len(matches) > 1:
        # Two pods of one name (a pod deleted and created again) both ready for a moment:
        # which one holds the device is not known here, so neither is touched.
        ids = ", ".join(quote(c) for _, c in matches[:4])
        raise _RefusedError(f"{len(matches)} running containers of that name ({ids}): ambiguous")
    return matches[0]


def _verbose_info(
    stub: api_pb2_grpc.RuntimeServiceStub, container_id: str, deadline: Deadline
) -> tuple[Mapping[str, str], int]:
    request = api_pb2.ContainerStatusRequest(container_id=container_id, verbose=True)
    try:
        answer = stub.ContainerStatus(request, timeout=deadline.remaining())
        return answer.info, answer.status.started_at
    except grpc.RpcError as exc:
        code = exc.code() if isinstance(exc, grpc.Call) else None
        if code in _SOCKET_CODES:
            raise
        # The container exited and was removed since it was listed, or the runtime could not
        # read this one's spec: this container is refused, the others are still asked for.
        details = exc.details() if isinstance(exc, grpc.Call) else str(exc)
        name = code.name if code is not None else "error"
        raise _RefusedError(
            f"RuntimeService/ContainerStatus of {quote(container_id)} failed: "
            f"{name}: {quote(details or '')}"
        ) from None


def _running(
    ref: ContainerRef, sandbox: api_pb2.PodSandbox, container_id: str, info: Mapping[str, str]
) -> RunningContainer:
    text = info.get("info")
    if text is None:
        raise _RefusedError(f"verbose status has no 'info' (keys: {quote(sorted(info))})")
    if len(text) > MAX_INFO_BYTES:
        raise _RefusedError(
            f"verbose 'info' is {len(text)} long, over the {MAX_INFO_BYTES} allowed"
        )
    try:
        document = json.loads(text)
    except (ValueError, RecursionError) as exc:
        why = "too deep" if isinstance(exc, RecursionError) else "not JSON"
        raise _RefusedError(f"verbose 'info' is {why}: {quote(text)}") from None
    if not isinstance(document, dict):
        raise _RefusedError(f"verbose 'info' is not a JSON object: {quote(text)}")
    pid = document.get("pid")
    if type(pid) is not int or not 0 < pid <= MAX_PID:
        raise _RefusedError(f"'pid' {quote(pid)} is not a process ID (1 to {MAX_PID})")
    spec = _object(document, "runtimeSpec", "info")
    linux = _object(spec, "linux", "runtimeSpec")
    cgroups_path = linux.get("cgroupsPath")
    if not isinstance(cgroups_path, str) or not cgroups_path:
        raise _RefusedError(
            f"runtimeSpec.linux.cgroupsPath {quote(cgroups_path)} is no cgroup path"
        )
    resources = linux.get("resources") or {}
    if not isinstance(resources, dict):
        raise _RefusedError(f"runtimeSpec.linux.resources {quote(resources)} is not an object")
    return RunningContainer(
        ref=ref,
        pod_uid=sandbox.metadata.uid,
        sandbox_id=sandbox.id,
        container_id=container_id,
        pid=pid,
        cgroups_path=cgroups_path,
        device_rules=_objects(resources, "devices", "runtimeSpec.linux.resources"),
        devices=_objects(linux, "devices", "runtimeSpec.linux"),
    )


def _object(parent: dict[str, object], key: str, where: str) -> dict[str, object]:
    value = parent.get(key)
    if not isinstance(value, dict):
        raise _RefusedError(f"{where}.{key} {quote(value)} is not a JSON object")
    return value


def _objects(parent: dict[str, object], key: str, where: str) -> tuple[dict[str, object], ...]:
    """``parent[key]``, a list of objects; absent or null is none (runc applies no rule)."""
    value = parent.get(key)
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(item, dict) for item in value):
        raise _RefusedError(f"{where}.{key} {quote(value)} is not a list of JSON objects")
    return tuple(value)


def stop_container(
    socket: Path, container_id: str, grace_seconds: int, timeout: float = TIMEOUT_SECONDS
) -> None:
    """Stop container ``container_id`` (``StopContainer``: SIGTERM, then SIGKILL after
    ``grace_seconds``); the kubelet then starts it again, with the spec as it is now.

    The call may take the grace, so its bound is the grace and ``timeout``. Raises
    :class:`CriContainersError` with one line.
    """
    bound = grace_seconds + timeout
    request = api_pb2.StopContainerRequest(container_id=container_id, timeout=grace_seconds)
    try:
        with local_channel(socket, _WHAT) as channel:
            api_pb2_grpc.RuntimeServiceStub(channel).StopContainer(request, timeout=bound)
    except LocalCallError as exc:
        raise CriContainersError(str(exc)) from None
    except grpc.RpcError as exc:
        method = f"RuntimeService/StopContainer of {quote(container_id)}"
        raise CriContainersError(call_failure(socket, _WHAT, method, exc, bound)) from None
