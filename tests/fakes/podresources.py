"""A fake kubelet pod-resources socket: ``v1.PodResourcesLister`` (``List`` and ``Get``) served
over a real unix socket by a real gRPC server, answering the pods a test gives it as the
kubelet does (``Get`` of an unknown pod fails as the kubelet's does). Every request lands in
``requests``.

Use it as ``with FakePodResources(socket, [pod(...)]) as kubelet:``.
"""

from __future__ import annotations

import queue
from collections.abc import Sequence
from concurrent import futures
from pathlib import Path
from types import TracebackType

import grpc
from google.protobuf.message import Message

from cdi_gen._proto.podresources.v1 import api_pb2, api_pb2_grpc


def plugin_devices(resource_name: str, *device_ids: str) -> api_pb2.ContainerDevices:
    """A device-plugin allocation as the kubelet reports it."""
    return api_pb2.ContainerDevices(resource_name=resource_name, device_ids=list(device_ids))


def claim(
    namespace: str, name: str, *resources: tuple[str, str, str, Sequence[str]]
) -> api_pb2.DynamicResource:
    """A DRA claim a container uses; each resource is (driver, pool, device, CDI names)."""
    return api_pb2.DynamicResource(
        claim_namespace=namespace,
        claim_name=name,
        claim_resources=[
            api_pb2.ClaimResource(
                driver_name=driver,
                pool_name=pool,
                device_name=device,
                cdi_devices=[api_pb2.CDIDevice(name=n) for n in cdi],
            )
            for driver, pool, device, cdi in resources
        ],
    )


def container(
    name: str,
    devices: Sequence[api_pb2.ContainerDevices] = (),
    claims: Sequence[api_pb2.DynamicResource] = (),
) -> api_pb2.ContainerResources:
    return api_pb2.ContainerResources(
        name=name, devices=list(devices), dynamic_resources=list(claims)
    )


def pod(namespace: str, name: str, *containers: api_pb2.ContainerResources) -> api_pb2.PodResources:
    return api_pb2.PodResources(namespace=namespace, name=name, containers=list(containers))


class _Lister(api_pb2_grpc.PodResourcesListerServicer):
    def __init__(self, fake: FakePodResources) -> None:
        self.fake = fake

    def List(
        self, request: api_pb2.ListPodResourcesRequest, context: grpc.ServicerContext
    ) -> api_pb2.ListPodResourcesResponse:
        self.fake.requests.put(request)
        return api_pb2.ListPodResourcesResponse(pod_resources=list(self.fake.pods))

    def Get(
        self, request: api_pb2.GetPodResourcesRequest, context: grpc.ServicerContext
    ) -> api_pb2.GetPodResourcesResponse:
        self.fake.requests.put(request)
        for candidate in self.fake.pods:
            if (candidate.namespace, candidate.name) == (request.pod_namespace, request.pod_name):
                return api_pb2.GetPodResourcesResponse(pod_resources=candidate)
        # The kubelet answers an unknown pod with a plain error (gRPC code Unknown).
        context.abort(
            grpc.StatusCode.UNKNOWN,
            f"pod {request.pod_name} not found in {request.pod_namespace}",
        )


class FakePodResources:
    """A kubelet's pod-resources socket at ``socket`` answering ``pods``."""

    def __init__(self, socket: Path, pods: Sequence[api_pb2.PodResources]) -> None:
        self.socket = socket
        self.pods = list(pods)
        self.requests: queue.Queue[Message] = queue.Queue()
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        api_pb2_grpc.add_PodResourcesListerServicer_to_server(_Lister(self), self._server)
        self._server.add_insecure_port(f"unix://{socket}")

    def __enter__(self) -> FakePodResources:
        self._server.start()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._server.stop(None).wait()
