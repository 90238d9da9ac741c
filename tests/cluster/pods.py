"""Consumer pods on the cluster: what they ask for, what they see, and their removal.

A consumer prints, every two seconds, the block devices it sees under /dev and the class's env
variable, between BEGIN and END lines; the tests read the last complete block from the pod's log
(through the API server and the kubelet, as ``kubectl logs`` does). Printing repeatedly shows
that a pod still has its device after a kubelet or agent restart, not only at its start.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from containerd.image import IMAGE_NAME

from .api import Api, ApiError

NAMESPACE = "default"
PODS = f"/api/v1/namespaces/{NAMESPACE}/pods"

_SCRIPT = """\
trap 'exit 0' TERM
while true; do
  echo BEGIN
  for f in /dev/loop*; do [ -b "$f" ] && echo "DEV $f $(stat -c %t:%T "$f")"; done
  echo "ENV {env}=${{{env}:-}}"
  echo END
  sleep 2 & wait
done
"""


def consumer(name: str, limits: dict[str, int], env: str = "FPGA_DEVICE") -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"app": "cdi-gen-cluster-test"}},
        "spec": {
            "hostNetwork": True,
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 5,
            # No token volume: nothing in these pods talks to the API.
            "automountServiceAccountToken": False,
            "containers": [
                {
                    "name": "app",
                    "image": IMAGE_NAME,
                    "imagePullPolicy": "Never",
                    "command": ["sh", "-c", _SCRIPT.format(env=env)],
                    "resources": {"limits": {k: str(v) for k, v in limits.items()}},
                }
            ],
        },
    }


@dataclass(frozen=True)
class Seen:
    """One complete block of a consumer's output."""

    devices: dict[str, str]  # /dev/loopN -> "major:minor" (hex, as stat prints it)
    env: dict[str, str]


def complete_blocks(log: str) -> int:
    """How many complete BEGIN..END blocks a consumer log holds."""
    count, inside = 0, False
    for line in log.splitlines():
        if line == "BEGIN":
            inside = True
        elif line == "END" and inside:
            count, inside = count + 1, False
    return count


def parse(log: str) -> Seen | None:
    """The last complete BEGIN..END block of a consumer log, or None."""
    block: list[str] | None = None
    last: list[str] | None = None
    for line in log.splitlines():
        if line == "BEGIN":
            block = []
        elif line == "END" and block is not None:
            last, block = block, None
        elif block is not None:
            block.append(line)
    if last is None:
        return None
    devices: dict[str, str] = {}
    env: dict[str, str] = {}
    for line in last:
        kind, _, rest = line.partition(" ")
        if kind == "DEV":
            path, _, numbers = rest.partition(" ")
            devices[path] = numbers
        elif kind == "ENV":
            key, _, value = rest.partition("=")
            env[key] = value
    return Seen(devices, env)


def phase(pod: dict[str, Any] | None) -> str:
    return "" if pod is None else str(pod.get("status", {}).get("phase", ""))


def status(pod: dict[str, Any] | None) -> str:
    """Phase, reason and message: enough to tell why a pod is where it is."""
    if pod is None:
        return "(gone)"
    st = pod.get("status", {})
    return f"{st.get('phase')} {st.get('reason', '')} {st.get('message', '')}".strip()


def unschedulable_message(pod: dict[str, Any] | None) -> str:
    for c in (pod or {}).get("status", {}).get("conditions", []):
        if c["type"] == "PodScheduled" and c["status"] == "False":
            return str(c.get("message", ""))
    return ""


@dataclass
class Pods:
    """The pods of one test; all deleted (and waited for) at its end."""

    api: Api
    names: list[str] = field(default_factory=list)

    def path(self, name: str) -> str:
        return f"{PODS}/{name}"

    def create(self, name: str, limits: dict[str, int], env: str = "FPGA_DEVICE") -> None:
        self.add(consumer(name, limits, env))

    def add(self, pod: dict[str, Any]) -> None:
        """Create a pod object (a ``consumer`` changed by the caller, e.g. with claims)."""
        self.api.create(PODS, pod)
        self.names.append(pod["metadata"]["name"])

    def get(self, name: str) -> dict[str, Any] | None:
        return self.api.get_or_none(self.path(name))

    def wait_running(self, name: str, timeout: float = 60) -> dict[str, Any]:
        def ready(pod: dict[str, Any] | None) -> bool:
            if phase(pod) in ("Failed", "Succeeded"):
                raise AssertionError(f"pod {name} ended: {pod and pod.get('status')}")
            return phase(pod) == "Running"

        pod = self.api.wait_for(self.path(name), ready, timeout, f"pod {name} Running")
        assert pod is not None
        return pod

    def wait_gone(self, name: str, timeout: float = 60) -> None:
        """Wait until the pod object is gone, deleted by someone else (an eviction)."""
        self.api.wait_for(self.path(name), lambda p: p is None, timeout, f"pod {name} gone")
        if name in self.names:
            self.names.remove(name)

    def wait_unschedulable(self, name: str, timeout: float = 30) -> str:
        pod = self.api.wait_for(
            self.path(name),
            lambda p: bool(unschedulable_message(p)),
            timeout,
            f"pod {name} unschedulable",
        )
        return unschedulable_message(pod)

    def wait_split(
        self, names: list[str], running: int, timeout: float = 60
    ) -> tuple[list[str], dict[str, str], dict[str, dict[str, Any] | None]]:
        """Wait until ``running`` of the pods ``names`` run and every other one is reported
        unschedulable; (the running, the others' unschedulable messages, every pod)."""
        deadline = time.monotonic() + timeout
        while True:
            state = {n: self.get(n) for n in names}
            up = [n for n, p in state.items() if phase(p) == "Running"]
            waiting = {n: unschedulable_message(p) for n, p in state.items() if n not in up}
            if len(up) == running and all(waiting.values()):
                return up, waiting, state
            assert time.monotonic() < deadline, (
                f"pods: {[(n, status(p)) for n, p in state.items()]}"
            )
            time.sleep(0.2)

    def seen(self, name: str, timeout: float = 30, fresh: bool = False) -> Seen:
        """What the pod's container sees: the last complete block printed. With ``fresh``, a
        block begun after this call (the second block completed from now: the first may have
        begun before), so that it shows the present rather than the past, whatever the pace of
        the printing loop."""
        base: int | None = None
        deadline = time.monotonic() + timeout
        while True:
            try:
                log = self.api.text(f"{self.path(name)}/log?container=app")
            except ApiError as exc:
                log, error = "", str(exc)
            else:
                error = ""
            result, blocks = parse(log), complete_blocks(log)
            if fresh and base is None and not error:
                base = blocks
            if base is not None and blocks < base:
                base = -1  # a new container's log: each of its blocks is fresh
            if result is not None and (not fresh or (base is not None and blocks >= base + 2)):
                return result
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"pod {name}: no {'fresh ' if fresh else ''}complete output within "
                    f"{timeout} s (blocks {blocks}, first seen {base}) {error}"
                )
            time.sleep(0.5)

    def restarts(self, name: str) -> tuple[int, str]:
        """(restart count, container ID) of the pod's container."""
        pod = self.get(name) or {}
        status = pod.get("status", {}).get("containerStatuses", [{}])[0]
        return int(status.get("restartCount", 0)), str(status.get("containerID", ""))

    def delete(self, name: str, timeout: float = 60) -> None:
        """Delete gracefully and wait until the object is gone: the kubelet has stopped the
        container and released its devices by then."""
        self.api.delete(self.path(name))
        self.api.wait_for(self.path(name), lambda p: p is None, timeout, f"pod {name} deleted")
        if name in self.names:
            self.names.remove(name)

    def delete_all(self) -> None:
        for name in self.names:
            self.api.delete(self.path(name))
        for name in list(self.names):
            self.api.wait_for(self.path(name), lambda p: p is None, 60, f"pod {name} deleted")
        self.names.clear()
