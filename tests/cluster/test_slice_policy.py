"""The slice policy as shipped (deploy/kubernetes/dra/slice-policy.yaml): the DRA DaemonSet's
ServiceAccount may write only the ResourceSlices of the node its token is bound to.

RBAC lets the agent write every slice, so the policy is the only thing between a stolen agent
token and every node's pool. The scenario applies ``deploy/kubernetes/dra`` (through the
overlay of ``daemonset.py``), lets the agent publish its node's slices, then acts as a thief
holding the agent's credentials: a token of the agent's ServiceAccount bound to the agent's
Pod (what a compromised agent has) writing another node's slices, and a token of the same
account bound to no pod. Each refusal must be the policy's (HTTP 422 with its message), not
RBAC's (403), and the same token must still be able to write its own node's slices, so that the
refusals are about the node and nothing else.
"""

from __future__ import annotations

import http.client
import json
import ssl
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from loopdev import LoopDevices

from tests.unit.test_deploy_dra import NODE_NAME_KEY, NOT_BOUND
from tests.waiting import until_sync

from .agent import DRIVER
from .api import Api
from .claims import SLICES, Claims, device_attribute
from .cluster import NODE_NAME, Cluster
from .daemonset import NAME, NAMESPACE, loop_fpga_config, write_dra_overlay
from .image import AgentImage
from .test_daemonset import agent_pods, shipped_run, wait_agent_ready

# A cold agent image build takes minutes (image.py); the scenario itself well under one.
#: VAP v1 is GA since 1.30 and pod-bound tokens carry their node since 1.30 (beta, GA 1.32):
#: the oldest lane (1.35) must enforce the policy as the current one does.
pytestmark = [pytest.mark.timeout(900), pytest.mark.lanes("current", "oldest")]

Obj = dict[str, Any]

POLICY = "cdi-gen-slices"
DENIED = f"ValidatingAdmissionPolicy '{POLICY}' with binding '{POLICY}' denied request: "
#: A node the agent does not run on; a slice may name a node that does not exist.
OTHER_NODE = "other-node"
#: The driver of the slices this test writes: not the agent's, whose publisher would delete
#: a slice of its driver on its node that it did not publish.
TEST_DRIVER = "policy-test.example.com"
JSON = "application/json"


def other_node_refusal(node: str) -> str:
    """What the policy answers when a token bound to a pod on ``node`` writes OTHER_NODE's."""
    return (
        f"{DENIED}cdi-gen on node '{node}' may write only that node's ResourceSlices, not one "
        f"with spec.nodeName '{OTHER_NODE}'"
    )


class TokenApi:
    """Requests to the API server with a bearer token, as the agent (or a thief) makes them."""

    def __init__(self, cluster: Cluster, token: str) -> None:
        assert cluster.api is not None
        self.host, self.port = cluster.api.host, cluster.api.port
        self._ssl = ssl.create_default_context(cafile=str(cluster.ca.cert))
        self._token = token

    def call(
        self, method: str, path: str, body: Obj | None = None, content_type: str = JSON
    ) -> tuple[int, Obj]:
        conn = http.client.HTTPSConnection(self.host, self.port, context=self._ssl, timeout=30)
        try:
            headers = {"Accept": "application/json", "Authorization": f"Bearer {self._token}"}
            data = None
            if body is not None:
                data = json.dumps(body).encode()
                headers["Content-Type"] = content_type
            conn.request(method, path, body=data, headers=headers)
            response = conn.getresponse()
            raw = response.read()
        finally:
            conn.close()
        answer: Obj = json.loads(raw) if raw else {}
        return response.status, answer

    def user(self) -> Obj:
        """Who the API server takes the token for (a SelfSubjectReview)."""
        status, answer = self.call(
            "POST",
            "/apis/authentication.k8s.io/v1/selfsubjectreviews",
            {"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"},
        )
        assert status == 201, answer
        user: Obj = answer["status"]["userInfo"]
        return user


def _slice(name: str, node: str) -> Obj:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": name},
        "spec": {
            "driver": TEST_DRIVER,
            "nodeName": node,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
            "devices": [],
        },
    }


def _refused(answer: tuple[int, Obj], message: str) -> None:
    """The answer is the policy's refusal with ``message`` (a 403 would be RBAC's)."""
    status, body = answer
    assert (status, body.get("reason")) == (422, "Invalid"), answer
    assert body.get("message", "").endswith(message), answer


def _slice_uids(claims: Claims) -> set[str]:
    return {s["metadata"]["uid"] for s in claims.slices(DRIVER)}


@pytest.fixture
def made_slices(cluster: Cluster) -> Iterator[list[str]]:
    """Names of the slices the test may have made (as the admin or as the agent), deleted at
    its end by the admin, whom the policy does not judge."""
    names: list[str] = []
    try:
        yield names
    finally:
        assert cluster.api is not None
        for name in names:
            cluster.api.delete(f"{SLICES}/{name}")


@dataclass(frozen=True)
class Deployed:
    """The DRA DaemonSet as shipped, running: its one pod and the CDI name of the device it
    publishes."""

    pod: Obj
    cdi: str

    def published(self, found: dict[str, Obj]) -> bool:
        return any(device_attribute(d, DRIVER, "cdiName") == self.cdi for d in found.values())


@pytest.fixture
def deployed(
    cluster: Cluster, agent_image: AgentImage, claims: Claims, loops: LoopDevices, tmp_path: Path
) -> Iterator[Deployed]:
    """``kubectl apply -k`` of the DRA variant as shipped (``shipped_run``), once its pod
    published its node's slice with one loop device and the API server has checked the
    policy; everything is deleted at the end, its slices too."""
    assert cluster.api is not None
    admin = cluster.api
    try:
        with shipped_run(cluster, agent_image, tmp_path, "DRA DaemonSet") as (overlay, port):
            device = loops.add()
            config = loop_fpga_config([device.name])
            write_dra_overlay(overlay, agent_image.name, config, port, admin.port)
            out = cluster.kubectl("apply", "-k", str(overlay))
            for created in (
                f"validatingadmissionpolicy.admissionregistration.k8s.io/{POLICY} created",
                f"validatingadmissionpolicybinding.admissionregistration.k8s.io/{POLICY} created",
            ):
                assert created in out, out
            _wait_type_checked(admin)
            pod = wait_agent_ready(cluster)
            assert pod["spec"]["nodeName"] == NODE_NAME
            agent = Deployed(pod, f"example.com/fpga=fpga-{device.number}")
            claims.wait_devices(DRIVER, agent.published, f"{agent.cdi} published", timeout=60)
            yield agent
    finally:
        # Even after a failure: a later test must not find this agent's slices.
        claims.delete_slices(DRIVER)
    assert not agent_pods(cluster), "the DaemonSet's pod outlived its deletion"


def _wait_type_checked(admin: Api) -> None:
    """The API server type-checks the policy against the served ResourceSlice schema: a
    misspelt field or variable is a warning in its status (and an error at admission)."""
    path = f"/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicies/{POLICY}"

    def checked() -> Obj | None:
        policy = admin.get(path)
        seen = policy.get("status", {}).get("observedGeneration")
        return policy if seen == policy["metadata"]["generation"] else None

    policy = until_sync(
        checked,
        f"ValidatingAdmissionPolicy {POLICY} checked by the API server",
        30,
        every=0.2,
        observe=lambda: admin.get(path).get("status"),
    )
    assert not policy["status"].get("typeChecking", {}).get("expressionWarnings"), policy


def _bound_token(cluster: Cluster, pod: Obj) -> TokenApi:
    """What a compromised agent holds: a token of its ServiceAccount bound to its Pod."""
    meta = pod["metadata"]
    token = cluster.kubectl(
        "create", "token", NAME, "-n", NAMESPACE, "--bound-object-kind", "Pod",
        "--bound-object-name", meta["name"], "--bound-object-uid", meta["uid"],
    )  # fmt: skip
    bound = TokenApi(cluster, token.strip())
    user = bound.user()
    assert user["username"] == f"system:serviceaccount:{NAMESPACE}:{NAME}", user
    assert user.get("extra", {}).get(NODE_NAME_KEY) == [NODE_NAME], user
    return bound


def _refuses_other_nodes(admin: Api, bound: TokenApi, made_slices: list[str]) -> None:
    """Every write of another node's slice with the pod-bound token is the policy's refusal;
    the admin, whom it does not judge, writes the same slices."""
    refusal = other_node_refusal(NODE_NAME)
    # The policy takes effect once the API server's informers have it: ask with a dry run
    # (admission runs, nothing is stored) until it refuses.
    stray = _slice("policy-test-stray", OTHER_NODE)
    until_sync(
        lambda: bound.call("POST", f"{SLICES}?dryRun=All", stray)[0] == 422,
        f"ValidatingAdmissionPolicy {POLICY} refusing a slice of {OTHER_NODE}",
        30,
        every=0.2,
        observe=lambda: bound.call("POST", f"{SLICES}?dryRun=All", stray),
    )
    # CREATE: refused, and nothing stored.
    made_slices.append("policy-test-stray")
    _refused(bound.call("POST", SLICES, stray), refusal)
    assert admin.get_or_none(f"{SLICES}/policy-test-stray") is None

    # UPDATE (a replace, and a patch, which admission sees as UPDATE) and DELETE of a slice
    # that someone else published for the other node.
    foreign = admin.create(SLICES, _slice("policy-test-foreign", OTHER_NODE))
    made_slices.append("policy-test-foreign")
    path = f"{SLICES}/policy-test-foreign"
    changed = {**foreign, "metadata": {**foreign["metadata"], "labels": {"taken": "yes"}}}
    _refused(bound.call("PUT", path, changed), refusal)
    patch = {"metadata": {"labels": {"taken": "yes"}}}
    _refused(bound.call("PATCH", path, patch, "application/merge-patch+json"), refusal)
    # A DELETE has no object: the policy reads the node from the slice being deleted.
    _refused(bound.call("DELETE", path), refusal)
    kept = admin.get(path)
    assert kept["metadata"]["uid"] == foreign["metadata"]["uid"]
    assert "labels" not in kept["metadata"], kept["metadata"]


def _writes_its_own_nodes(admin: Api, bound: TokenApi, made_slices: list[str]) -> None:
    """The same token creates, replaces and deletes its own node's slice: the refusals were
    about the node, not the token or RBAC."""
    path = f"{SLICES}/policy-test-own"
    made_slices.append("policy-test-own")
    status, created = bound.call("POST", SLICES, _slice("policy-test-own", NODE_NAME))
    assert status == 201, created
    created["metadata"]["labels"] = {"checked": "yes"}
    status, replaced = bound.call("PUT", path, created)
    assert status == 200, replaced
    status, deleted = bound.call("DELETE", path)
    assert status == 200, deleted
    assert admin.get_or_none(path) is None


def _refuses_unbound(cluster: Cluster, admin: Api, made_slices: list[str]) -> None:
    """A token of the same account bound to no pod names no node: refused whatever it
    writes, its own node's slices too."""
    unbound = TokenApi(cluster, cluster.kubectl("create", "token", NAME, "-n", NAMESPACE).strip())
    user = unbound.user()
    assert user["username"] == f"system:serviceaccount:{NAMESPACE}:{NAME}", user
    assert NODE_NAME_KEY not in user.get("extra", {}), user
    path = f"{SLICES}/policy-test-own"
    made_slices.append("policy-test-own")
    own = _slice("policy-test-own", NODE_NAME)
    _refused(unbound.call("POST", SLICES, own), DENIED + NOT_BOUND)
    admin.create(SLICES, own)
    _refused(unbound.call("DELETE", path), DENIED + NOT_BOUND)
    assert admin.get_or_none(path) is not None


def test_the_agent_may_write_only_its_own_nodes_slices(
    cluster: Cluster, claims: Claims, deployed: Deployed, made_slices: list[str]
) -> None:
    assert cluster.api is not None
    admin = cluster.api
    bound = _bound_token(cluster, deployed.pod)
    _refuses_other_nodes(admin, bound, made_slices)
    _writes_its_own_nodes(admin, bound, made_slices)
    _refuses_unbound(cluster, admin, made_slices)

    # The agent itself, with the pod's projected token, writes under the policy now in force
    # (the slices it published at start may have been written before the API server had
    # it): its slices deleted behind its back, it publishes them again and is let through.
    before = _slice_uids(claims)
    assert before
    claims.delete_slices(DRIVER)
    claims.wait_devices(
        DRIVER,
        lambda found: deployed.published(found) and not before & _slice_uids(claims),
        f"{deployed.cdi} published again by the agent under the policy",
        timeout=60,
    )
    name = deployed.pod["metadata"]["name"]
    log = admin.text(f"/api/v1/namespaces/{NAMESPACE}/pods/{name}/log")
    assert "denied request" not in log, log
