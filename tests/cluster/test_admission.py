"""The claims' admission webhook as shipped (deploy/kubernetes/admission over the DRA variant):
``kubectl apply`` of a claim whose opaque DeviceConfig has a typo is refused with the driver's
own message; a good one, and another driver's, are accepted.

The component's objects are applied as kustomize renders them, with the serving certificate
made for the test (tests/cluster/pki.py), and changed only where the test cluster differs from
a real one: it has no service proxy, so the webhook's pod uses the host's network on a free port
and the webhook configuration names that address (``url``) instead of the Service. The API
server's own metrics show that each accepted claim was in fact judged by the webhook, or left
out by its matchConditions, so that an acceptance cannot come from a webhook that was never
reached (failurePolicy Ignore would let it through).
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from ports import free_port

from cdi_gen.admission.https import PATH
from cdi_gen.admission.review import config_problem

from .agent import DRIVER
from .cluster import Cluster
from .image import AgentImage
from .test_admission_deploy import NAME, copy_deploy, overlay
from .test_helm_chart import kustomize

#: resource.k8s.io/v1 claims and matchConditions are served by every lane's release (v1 since
#: 1.34, matchConditions GA in 1.30): the oldest must refuse as the current one does.
pytestmark = [pytest.mark.timeout(900), pytest.mark.lanes("current", "oldest")]

Obj = dict[str, Any]
NAMESPACE = "default"
CLAIM_HOOK = "resourceclaims.admission.cdi-gen.io"
TEMPLATE_HOOK = "resourceclaimtemplates.admission.cdi-gen.io"
GOOD = {"apiVersion": "cdi-gen.io/v1alpha1", "kind": "DeviceConfig", "env": {"A": "1"}}
TYPO = {
    "apiVersion": "cdi-gen.io/v1alpha1",
    "kind": "DeviceConfig",
    "deviceNodes": {"fileMod": 384},
}


def _claim(name: str, parameters: Obj, driver: str = DRIVER) -> Obj:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {
            "devices": {
                "requests": [{"name": "fpga", "exactly": {"deviceClassName": f"fpga.{DRIVER}"}}],
                "config": [{"opaque": {"driver": driver, "parameters": parameters}}],
            }
        },
    }


def _template(name: str, parameters: Obj) -> Obj:
    claim = _claim(name, parameters)
    return {**claim, "kind": "ResourceClaimTemplate", "spec": {"spec": claim["spec"]}}


def _shipped(tmp: Path, image: str, port: int) -> list[Obj]:
    """The component's objects, with the changes this cluster needs (the module says why)."""
    objects = [
        o
        for o in kustomize(overlay(tmp / "overlay", copy_deploy(tmp)))
        if o["metadata"]["name"].startswith(NAME)
        and o["kind"] in {"Secret", "Service", "Deployment", "ValidatingWebhookConfiguration"}
    ]
    for obj in objects:
        if obj["kind"] == "Deployment":
            pod = obj["spec"]["template"]["spec"]
            pod["hostNetwork"] = True
            (container,) = pod["containers"]
            container["image"], container["imagePullPolicy"] = image, "Never"
            container["args"] = [
                f"--address=0.0.0.0:{port}" if a.startswith("--address=") else a
                for a in container["args"]
            ]
            container["ports"][0]["containerPort"] = port
        if obj["kind"] == "ValidatingWebhookConfiguration":
            for hook in obj["webhooks"]:
                config = hook["clientConfig"]
                del config["service"]
                config["url"] = f"https://127.0.0.1:{port}{PATH}"
    return objects


@pytest.fixture
def webhook(cluster: Cluster, agent_image: AgentImage, tmp_path: Path) -> Iterator[Path]:
    """The webhook running and ready; yields the folder of the objects made; everything is
    deleted at the end."""
    cluster.import_image(agent_image.archive)
    objects = tmp_path / "admission.yaml"
    objects.write_text(yaml.safe_dump_all(_shipped(tmp_path, agent_image.name, free_port())))
    made = tmp_path / "made"
    made.mkdir()
    try:
        cluster.kubectl("apply", "-f", str(objects))
        cluster.kubectl(
            "rollout", "status", "-n", "kube-system", f"deployment/{NAME}", "--timeout=180s",
            timeout=200,
        )  # fmt: skip
        yield made
    finally:
        if any(made.iterdir()):
            cluster.kubectl("delete", "--ignore-not-found", "--wait", "-f", str(made))
        cluster.kubectl("delete", "--ignore-not-found", "--wait", "-f", str(objects))


def _count(cluster: Cluster, metric: str, **labels: str) -> float:
    """The API server's counter ``metric`` summed over the series carrying ``labels``."""
    total = 0.0
    for line in cluster.metrics("kube-apiserver").splitlines():
        if not line.startswith(metric + "{"):
            continue
        series = dict(re.findall(r'(\w+)="([^"]*)"', line.partition("}")[0]))
        if labels.items() <= series.items():
            total += float(line.rsplit(" ", 1)[1])
    return total


def _judged(cluster: Cluster, hook: str, rejected: str) -> float:
    return _count(
        cluster,
        "apiserver_admission_webhook_admission_duration_seconds_count",
        name=hook,
        rejected=rejected,
    )


def _apply(cluster: Cluster, folder: Path, obj: Obj) -> tuple[bool, str]:
    """``kubectl apply`` of ``obj`` as the admin: whether it was created, and what kubectl
    printed (a refusal goes to stderr, which ``Cluster.kubectl`` does not return)."""
    path = folder / f"{obj['kind']}-{obj['metadata']['name']}.yaml"
    path.write_text(yaml.safe_dump(obj))
    proc = subprocess.run(
        [str(cluster.binaries.path("kubectl")), "--kubeconfig", str(cluster.admin_kubeconfig),
         "--cache-dir", str(cluster.work / "kubectl-cache"), "apply", "-f", str(path)],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    out = proc.stdout + proc.stderr
    created = f"{obj['kind'].lower()}.resource.k8s.io/{obj['metadata']['name']} created"
    if proc.returncode == 0 and created in out:
        return True, out
    path.unlink()
    return False, out


def test_a_typo_is_refused_at_apply_with_the_drivers_message(
    cluster: Cluster, webhook: Path
) -> None:
    for obj, hook in [
        (_claim("typo", TYPO), CLAIM_HOOK),
        (_template("typo", TYPO), TEMPLATE_HOOK),
    ]:
        before = _judged(cluster, hook, "true")
        created, out = _apply(cluster, webhook, obj)
        assert not created, out
        message = config_problem(obj, obj["kind"], DRIVER)
        assert message is not None
        assert message.endswith("parameters.deviceNodes.fileMod: unknown field")
        assert f'admission webhook "{hook}" denied the request: {message}' in out, out
        assert _judged(cluster, hook, "true") == before + 1


def test_a_good_claim_and_another_drivers_are_accepted(cluster: Cluster, webhook: Path) -> None:
    judged = _judged(cluster, CLAIM_HOOK, "false")
    created, out = _apply(cluster, webhook, _claim("good", GOOD))
    assert created, out
    assert _judged(cluster, CLAIM_HOOK, "false") == judged + 1  # the webhook said yes
    created, out = _apply(cluster, webhook, _template("good", GOOD))
    assert created, out
    # Another driver's parameters are its own: the matchConditions keep them from the webhook.
    exclusions = "apiserver_admission_match_condition_exclusions_total"
    left_out = _count(cluster, exclusions, name=CLAIM_HOOK)
    created, out = _apply(cluster, webhook, _claim("other", TYPO, driver="gpu.other.example"))
    assert created, out
    assert _count(cluster, exclusions, name=CLAIM_HOOK) == left_out + 1
