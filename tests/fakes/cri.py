"""A fake container runtime's CRI socket: ``runtime.v1.RuntimeService`` (``Version``,
``ListPodSandbox``, ``ListContainers``, ``ContainerStatus``, ``StopContainer``) served over a
real unix socket by a real gRPC server, answering what containerd or CRI-O answers (or what a
test makes it answer). Every request it got lands in ``requests``.

Use it as ``with FakeCri(socket, "containerd", "v2.3.7") as cri:``; give it pods with
:meth:`FakeCri.add_container` and the verbose ``info`` of :func:`containerd_info` or
:func:`crio_info` (the two runtimes' shapes, read from their ``container_status.go``).
"""

from __future__ import annotations

import contextlib
import json
import queue
import socket as socketlib
import threading
from collections.abc import Iterator
from concurrent import futures
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

import grpc
from google.protobuf.message import Message

from cdi_gen._proto.cri.v1 import api_pb2, api_pb2_grpc


class _Runtime(api_pb2_grpc.RuntimeServiceServicer):
    def __init__(self, fake: FakeCri) -> None:
        self.fake = fake

    def Version(
        self, request: api_pb2.VersionRequest, context: grpc.ServicerContext
    ) -> api_pb2.VersionResponse:
        self.fake.requests.put(request)
        return api_pb2.VersionResponse(
            version="0.1.0",
            runtime_name=self.fake.name,
            runtime_version=self.fake.version,
            runtime_api_version="v1",
        )

    def ListPodSandbox(
        self, request: api_pb2.ListPodSandboxRequest, context: grpc.ServicerContext
    ) -> api_pb2.ListPodSandboxResponse:
        self.fake.requests.put(request)
        wanted = request.filter
        items = [
            s.sandbox
            for s in self.fake.sandboxes.values()
            if self.fake.honour_filters is False
            or (
                (not wanted.HasField("state") or s.sandbox.state == wanted.state.state)
                and all(s.sandbox.labels.get(k) == v for k, v in wanted.label_selector.items())
            )
        ]
        return api_pb2.ListPodSandboxResponse(items=items)

    def ListContainers(
        self, request: api_pb2.ListContainersRequest, context: grpc.ServicerContext
    ) -> api_pb2.ListContainersResponse:
        self.fake.requests.put(request)
        wanted = request.filter
        containers = [
            c.container
            for c in self.fake.containers.values()
            if self.fake.honour_filters is False
            or (
                (not wanted.HasField("state") or c.container.state == wanted.state.state)
                and wanted.pod_sandbox_id in ("", c.container.pod_sandbox_id)
            )
        ]
        return api_pb2.ListContainersResponse(containers=containers)

    def ContainerStatus(
        self, request: api_pb2.ContainerStatusRequest, context: grpc.ServicerContext
    ) -> api_pb2.ContainerStatusResponse:
        self.fake.requests.put(request)
        found = self.fake.containers.get(request.container_id)
        if found is None or request.container_id in self.fake.status_gone:
            context.abort(
                grpc.StatusCode.NOT_FOUND, f"container {request.container_id!r} not found"
            )
        return api_pb2.ContainerStatusResponse(
            status=api_pb2.ContainerStatus(
                id=found.container.id,
                metadata=found.container.metadata,
                state=found.container.state,
                started_at=found.started_at,
            ),
            info=found.info if request.verbose else {},
        )

    def StopContainer(
        self, request: api_pb2.StopContainerRequest, context: grpc.ServicerContext
    ) -> api_pb2.StopContainerResponse:
        self.fake.requests.put(request)
        found = self.fake.containers.get(request.container_id)
        if found is None:
            context.abort(
                grpc.StatusCode.NOT_FOUND, f"container {request.container_id!r} not found"
            )
        found.container.state = api_pb2.CONTAINER_EXITED
        self.fake.stopped.append((request.container_id, request.timeout))
        return api_pb2.StopContainerResponse()


@dataclass
class _Sandbox:
    sandbox: api_pb2.PodSandbox


@dataclass
class _Container:
    container: api_pb2.Container
    info: dict[str, str]
    started_at: int = 0


def runtime_spec(
    cgroups_path: str,
    device_rules: list[dict[str, Any]] | None = None,
    devices: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """An OCI runtime spec with what a container's device handling reads."""
    linux: dict[str, Any] = {"cgroupsPath": cgroups_path, "resources": {}}
    if device_rules is not None:
        linux["resources"]["devices"] = device_rules
    if devices is not None:
        linux["devices"] = devices
    return {"ociVersion": "1.2.1", "process": {"args": ["sleep", "inf"]}, "linux": linux}


def containerd_info(sandbox_id: str, pid: int, spec: dict[str, Any]) -> dict[str, str]:
    """containerd's verbose info (internal/cri/server/container_status.go ContainerInfo)."""
    document = {
        "sandboxID": sandbox_id,
        "pid": pid,
        "removing": False,
        "snapshotKey": "k",
        "snapshotter": "overlayfs",
        "runtimeType": "io.containerd.runc.v2",
        "runtimeOptions": {"systemd_cgroup": True},
        "config": {"metadata": {"name": "c"}},
        "runtimeSpec": spec,
    }
    return {"info": json.dumps(document)}


def crio_info(sandbox_id: str, pid: int, spec: dict[str, Any]) -> dict[str, str]:
    """CRI-O's verbose info (server/container_status.go containerInfo, checkpointing on)."""
    document = {
        "sandboxID": sandbox_id,
        "pid": pid,
        "runtimeSpec": spec,
        "privileged": False,
        "checkpointedAt": "0001-01-01T00:00:00Z",
        "restored": False,
    }
    return {"info": json.dumps(document)}


class FakeCri:
    """A runtime named ``name`` at ``version`` answering on ``socket``."""

    def __init__(self, socket: Path, name: str, version: str) -> None:
        self.socket = socket
        self.name = name
        self.version = version
        self.requests: queue.Queue[Message] = queue.Queue()
        self.sandboxes: dict[str, _Sandbox] = {}
        self.containers: dict[str, _Container] = {}
        #: False: list every sandbox and container whatever the filter (a runtime that ignores
        #: filters must still not lead the client to another pod's container).
        self.honour_filters = True
        #: Containers listed but gone by the time their status is asked (they exited).
        self.status_gone: set[str] = set()
        #: Every StopContainer asked for: (container ID, grace in seconds), in order.
        self.stopped: list[tuple[str, int]] = []
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        api_pb2_grpc.add_RuntimeServiceServicer_to_server(_Runtime(self), self._server)
        self._server.add_insecure_port(f"unix://{socket}")

    def add_sandbox(
        self, sandbox_id: str, namespace: str, pod: str, uid: str = "uid-1", ready: bool = True
    ) -> None:
        """A pod sandbox labelled and described as the kubelet creates one."""
        self.sandboxes[sandbox_id] = _Sandbox(
            api_pb2.PodSandbox(
                id=sandbox_id,
                metadata=api_pb2.PodSandboxMetadata(name=pod, namespace=namespace, uid=uid),
                state=api_pb2.SANDBOX_READY if ready else api_pb2.SANDBOX_NOTREADY,
                labels={
                    "io.kubernetes.pod.namespace": namespace,
                    "io.kubernetes.pod.name": pod,
                    "io.kubernetes.pod.uid": uid,
                },
            )
        )

    def add_container(  # noqa: PLR0917 (the earlier callers pass the first five by position)
        self,
        container_id: str,
        sandbox_id: str,
        name: str,
        info: dict[str, str],
        state: int = api_pb2.CONTAINER_RUNNING,
        started_at: int = 0,
    ) -> None:
        """A container of sandbox ``sandbox_id`` whose verbose status answers ``info``
        (and ``started_at``, ns since the epoch)."""
        self.containers[container_id] = _Container(
            api_pb2.Container(
                id=container_id,
                pod_sandbox_id=sandbox_id,
                metadata=api_pb2.ContainerMetadata(name=name),
                state=state,  # type: ignore[arg-type]
                labels={"io.kubernetes.container.name": name},
            ),
            info,
            started_at,
        )

    def __enter__(self) -> FakeCri:
        self._server.start()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._server.stop(None).wait()


@contextlib.contextmanager
def silent_socket(path: Path) -> Iterator[Path]:
    """A unix socket that accepts connections and never says a word (a hung runtime)."""
    listener = socketlib.socket(socketlib.AF_UNIX, socketlib.SOCK_STREAM)
    try:
        listener.bind(str(path))
        listener.listen(8)
        yield path
    finally:
        listener.close()


@contextlib.contextmanager
def garbage_socket(path: Path) -> Iterator[Path]:
    """A unix socket whose every connection gets bytes that are no HTTP/2, then a close."""
    listener = socketlib.socket(socketlib.AF_UNIX, socketlib.SOCK_STREAM)
    listener.bind(str(path))
    listener.listen(8)

    def serve() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return  # the listener was closed: the test is over
            with conn:
                conn.sendall(b"HTTP/1.0 418 I am a teapot\r\n\r\n\x00\xff garbage")

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield path
    finally:
        # shutdown wakes the blocked accept(); close alone may not.
        with contextlib.suppress(OSError):
            listener.shutdown(socketlib.SHUT_RDWR)
        listener.close()
        thread.join(5)
