"""A small CRI client: the calls the kubelet makes to start a pod whose container asks for CDI
devices, over containerd's real gRPC socket.
"""

from __future__ import annotations

import re
import subprocess
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import grpc
from processes import terminate

from ._cri import api_pb2 as pb
from ._cri.api_pb2_grpc import RuntimeServiceStub

RPC_TIMEOUT = 30.0
# A CRI log line: "<RFC 3339 time> <stream> <P|F> <text>"; P marks a partial line.
_LOG_LINE = re.compile(r"^\S+ (stdout|stderr) ([PF]) ?(.*)$")


@dataclass(frozen=True)
class Pod:
    id: str
    config: pb.PodSandboxConfig
    log_dir: Path


@dataclass
class Finished:
    """A container that ran to its end: its exit code and what it printed."""

    exit_code: int
    stdout: list[str]
    stderr: list[str] = field(default_factory=list)

    @property
    def env(self) -> dict[str, str]:
        return dict(line.split("=", 1) for line in self.stdout if "=" in line)


class CRIClient:
    def __init__(self, socket: Path) -> None:
        self._channel = grpc.insecure_channel(f"unix://{socket}")
        self.runtime = RuntimeServiceStub(self._channel)
        self._pods = 0

    def close(self) -> None:
        self._channel.close()

    def version(self, timeout: float = RPC_TIMEOUT) -> pb.VersionResponse:
        return self.runtime.Version(pb.VersionRequest(version="v1"), timeout=timeout)

    def run_pod(self, name: str, log_root: Path, cgroup_parent: str) -> Pod:
        """RunPodSandbox in the host network namespace (NODE), so that no CNI is needed."""
        self._pods += 1
        uid = f"{name}-{self._pods}"
        log_dir = log_root / uid
        log_dir.mkdir(parents=True)
        config = pb.PodSandboxConfig(
            metadata=pb.PodSandboxMetadata(name=name, uid=uid, namespace="cdi-gen-test"),
            log_directory=str(log_dir),
            labels={"cdi-gen-test": "1"},
            linux=pb.LinuxPodSandboxConfig(
                cgroup_parent=cgroup_parent,
                security_context=pb.LinuxSandboxSecurityContext(
                    namespace_options=pb.NamespaceOption(network=pb.NODE)
                ),
            ),
        )
        reply = self.runtime.RunPodSandbox(
            pb.RunPodSandboxRequest(config=config), timeout=RPC_TIMEOUT
        )
        return Pod(reply.pod_sandbox_id, config, log_dir)

    def create_container(
        self,
        pod: Pod,
        name: str,
        image: str,
        command: list[str],
        *,
        cdi_devices: Iterable[str] = (),
        annotations: Mapping[str, str] | None = None,
        envs: Mapping[str, str] | None = None,
    ) -> str:
        """CreateContainer as the kubelet sends it: CDI names go into CDI_devices unchanged."""
        config = pb.ContainerConfig(
            metadata=pb.ContainerMetadata(name=name),
            image=pb.ImageSpec(image=image),
            command=command,
            envs=[pb.KeyValue(key=k, value=v) for k, v in (envs or {}).items()],
            annotations=dict(annotations or {}),
            log_path=f"{name}.log",
            CDI_devices=[pb.CDIDevice(name=n) for n in cdi_devices],
        )
        reply = self.runtime.CreateContainer(
            pb.CreateContainerRequest(
                pod_sandbox_id=pod.id, config=config, sandbox_config=pod.config
            ),
            timeout=RPC_TIMEOUT,
        )
        return reply.container_id

    def start_container(self, container_id: str) -> None:
        self.runtime.StartContainer(
            pb.StartContainerRequest(container_id=container_id), timeout=RPC_TIMEOUT
        )

    def status(self, container_id: str) -> pb.ContainerStatus:
        return self.runtime.ContainerStatus(
            pb.ContainerStatusRequest(container_id=container_id), timeout=RPC_TIMEOUT
        ).status

    def wait_exited(self, container_id: str, timeout: float = 30.0) -> pb.ContainerStatus:
        deadline = time.monotonic() + timeout
        while True:
            status = self.status(container_id)
            if status.state == pb.CONTAINER_EXITED:
                return status
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"container {container_id} still {status.state} after {timeout}s"
                )
            time.sleep(0.01)

    def wait_running(self, container_id: str, timeout: float = 30.0) -> pb.ContainerStatus:
        deadline = time.monotonic() + timeout
        while True:
            status = self.status(container_id)
            if status.state in (pb.CONTAINER_RUNNING, pb.CONTAINER_EXITED):
                return status
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"container {container_id} still {status.state} after {timeout}s"
                )
            time.sleep(0.002)

    def logs(self, pod: Pod, container_name: str) -> tuple[list[str], list[str]]:
        """stdout and stderr lines from the CRI log file in the sandbox's log directory."""
        out: dict[str, list[str]] = {"stdout": [], "stderr": []}
        partial = {"stdout": "", "stderr": ""}
        path = pod.log_dir / f"{container_name}.log"
        for raw in path.read_text().splitlines():
            m = _LOG_LINE.match(raw)
            if m is None:
                raise ValueError(f"{path}: not a CRI log line: {raw!r}")
            stream, tag, text = m.groups()
            if tag == "P":
                partial[stream] += text
            else:
                out[stream].append(partial[stream] + text)
                partial[stream] = ""
        return out["stdout"], out["stderr"]

    def run_to_end(
        self,
        pod: Pod,
        name: str,
        image: str,
        script: str,
        *,
        cdi_devices: Iterable[str] = (),
        annotations: Mapping[str, str] | None = None,
    ) -> Finished:
        """Create, start and wait for a ``sh -c script`` container; its output from the log."""
        cid = self.create_container(
            pod,
            name,
            image,
            ["/bin/sh", "-c", script],
            cdi_devices=cdi_devices,
            annotations=annotations,
        )
        self.start_container(cid)
        status = self.wait_exited(cid)
        stdout, stderr = self.logs(pod, name)
        return Finished(status.exit_code, stdout, stderr)

    def remove_pod(self, pod_id: str) -> None:
        self.runtime.StopPodSandbox(
            pb.StopPodSandboxRequest(pod_sandbox_id=pod_id), timeout=RPC_TIMEOUT
        )
        self.runtime.RemovePodSandbox(
            pb.RemovePodSandboxRequest(pod_sandbox_id=pod_id), timeout=RPC_TIMEOUT
        )

    def remove_all_pods(self) -> list[str]:
        """Stop and remove every sandbox (the daemon is private: all of them are ours)."""
        errors = []
        pods = self.runtime.ListPodSandbox(pb.ListPodSandboxRequest(), timeout=RPC_TIMEOUT)
        for pod in pods.items:
            try:
                self.remove_pod(pod.id)
            except grpc.RpcError as exc:
                errors.append(f"{pod.id}: {exc.code()} {exc.details()}")
        return errors


def stop_runtime(cri: CRIClient | None, process: subprocess.Popen[bytes] | None) -> list[str]:
    """End a container runtime a test started: every pod removed through CRI while it still
    answers, the client closed, then SIGTERM (SIGKILL after 10 s). Returns what could not be
    removed; the caller then clears what survived in its own runc root."""
    problems: list[str] = []
    running = process is not None and process.poll() is None
    if cri is not None:
        if running:
            try:
                problems += cri.remove_all_pods()
            except grpc.RpcError as exc:
                problems.append(f"removing pods: {exc.code()} {exc.details()}")
        cri.close()
    if process is not None:
        terminate(process)
    return problems
