"""The admission webhook as shipped: deploy/kubernetes/admission (a component over the DRA
variant) and the chart's ``admission.enabled`` render the same objects, save the certificate
(kustomize takes the user's, the chart makes its own); caBundle is the CA that signed the
serving certificate; the webhook and the server name the same driver."""

from __future__ import annotations

import base64
import os
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import yaml
from cryptography import x509
from cryptography.hazmat.primitives.serialization import (
    Encoding,
    PublicFormat,
    load_pem_private_key,
)

from cdi_gen.admission.https import PATH
from tests.cluster import test_helm_chart
from tests.cluster.test_helm_chart import (
    CHART,
    Chart,
    _helm,
    _normal,
    assert_same_objects,
    kustomize,
)
from tests.conftest import REPO
from tests.pki import Authority
from tests.unit.test_deploy_dra import _shipped_config_text

# The chart's fixtures (both Helm majors), shared with the chart's own tests.
chart = test_helm_chart.chart
helm_env = test_helm_chart.helm_env

Obj = dict[str, Any]
NAME = "cdi-gen-admission"
HOST = f"{NAME}.kube-system.svc"
SPKI = (Encoding.DER, PublicFormat.SubjectPublicKeyInfo)
KINDS = {"Secret", "Service", "Deployment", "ValidatingWebhookConfiguration"}
WEBHOOKS = {
    "resourceclaims.admission.cdi-gen.io": "object.spec",
    "resourceclaimtemplates.admission.cdi-gen.io": "object.spec.spec",
}


def write_tls(folder: Path) -> Authority:
    """A CA and a serving certificate for the webhook's Service (and 127.0.0.1) in ``folder``
    as deploy/kubernetes/admission/kustomization.yaml asks for them."""
    ca = Authority(folder / "ca")
    pair = ca.issue("tls", HOST, dns=(HOST,), ips=("127.0.0.1",), server=True)
    shutil.copy(ca.cert, folder / "ca.crt")
    shutil.copy(pair.cert, folder / "tls.crt")
    shutil.copy(pair.key, folder / "tls.key")
    return ca


def copy_deploy(dest: Path) -> Path:
    """deploy/kubernetes copied to ``dest`` with the component's tls/ filled; returns it."""
    tree = dest / "kubernetes"
    shutil.copytree(REPO / "deploy" / "kubernetes", tree)
    write_tls(tree / "admission" / "tls")
    return tree


def overlay(dest: Path, tree: Path) -> Path:
    """A user's overlay: the DRA variant with the admission component, as the component's
    kustomization.yaml tells to write it."""
    dest.mkdir(parents=True, exist_ok=True)
    (dest / "kustomization.yaml").write_text(
        yaml.safe_dump(
            {
                "apiVersion": "kustomize.config.k8s.io/v1beta1",
                "kind": "Kustomization",
                "resources": [os.path.relpath(tree / "dra", dest)],
                "components": [os.path.relpath(tree / "admission", dest)],
            }
        )
    )
    return dest


@pytest.fixture(scope="module")
def kustomized(tmp_path_factory: pytest.TempPathFactory) -> list[Obj]:
    tmp = tmp_path_factory.mktemp("admission")
    return kustomize(overlay(tmp / "overlay", copy_deploy(tmp)))


def _admission(objects: Sequence[Obj]) -> dict[str, Obj]:
    return {
        o["kind"]: o
        for o in objects
        if o["kind"] in KINDS and o["metadata"]["name"].startswith(NAME)
    }


def _without_certificate(objects: Sequence[Obj]) -> list[Obj]:
    """``objects`` without what differs by certificate: the Secret's data, caBundle, and the
    chart's roll-on-new-certificate annotation; the Deployment's selector and pod labels
    without Helm's instance label (as the DaemonSet's are compared)."""
    out = []
    for original in objects:
        obj = _normal(original)
        if obj["kind"] == "Secret" and obj["metadata"]["name"] == f"{NAME}-tls":
            obj["data"] = sorted(obj["data"])
        if obj["kind"] == "ValidatingWebhookConfiguration":
            for hook in obj["webhooks"]:
                hook["clientConfig"].pop("caBundle", None)
        if obj["kind"] in {"Deployment", "Service"} and obj["metadata"]["name"] == NAME:
            spec = obj["spec"]
            selector = spec["selector"].get("matchLabels", spec["selector"])
            selector.pop("app.kubernetes.io/instance", None)
            if obj["kind"] == "Deployment":
                meta = spec["template"]["metadata"]
                meta["labels"].pop("app.kubernetes.io/instance", None)
                meta.pop("annotations", None)
        out.append(obj)
    return out


def test_the_chart_renders_what_the_component_renders(chart: Chart, kustomized: list[Obj]) -> None:
    rendered = chart.render({"api": "dra", "admission": {"enabled": True}})
    assert KINDS == set(_admission(rendered)) == set(_admission(kustomized))
    assert_same_objects(
        _without_certificate(rendered),
        _without_certificate(kustomized),
        "deploy/kubernetes/dra+admission",
    )


def test_no_webhook_unless_asked_for_and_never_with_device_plugins(chart: Chart) -> None:
    assert not _admission(chart.render({"api": "dra"}))
    assert not _admission(chart.render({"admission": {"enabled": True}}))


def _check_pair(objects: Sequence[Obj]) -> None:
    """caBundle of every webhook is the Secret's CA, which signed the Secret's serving
    certificate for the Service's name; the key is the certificate's."""
    found = _admission(objects)
    data = found["Secret"]["data"]
    ca = x509.load_pem_x509_certificate(base64.b64decode(data["ca.crt"]))
    cert = x509.load_pem_x509_certificate(base64.b64decode(data["tls.crt"]))
    cert.verify_directly_issued_by(ca)
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert HOST in names.get_values_for_type(x509.DNSName)
    key = load_pem_private_key(base64.b64decode(data["tls.key"]), None)
    assert key.public_key().public_bytes(*SPKI) == cert.public_key().public_bytes(*SPKI)
    hooks = found["ValidatingWebhookConfiguration"]["webhooks"]
    assert [h["clientConfig"]["caBundle"] for h in hooks] == [data["ca.crt"]] * len(hooks)


def test_the_chart_makes_a_certificate_pair_the_api_server_trusts(chart: Chart) -> None:
    _check_pair(chart.render({"api": "dra", "admission": {"enabled": True}}))


def test_the_component_trusts_the_users_ca(kustomized: list[Obj]) -> None:
    _check_pair(kustomized)


@pytest.mark.parametrize("driver", ["", "dra.example.net"])
def test_the_webhook_asks_only_about_claims_of_the_servers_driver(
    chart: Chart, kustomized: list[Obj], driver: str
) -> None:
    vendor = yaml.safe_load(_shipped_config_text())["vendor"]
    rendered = chart.render(
        {"api": "dra", "admission": {"enabled": True}, "dra": {"driver": driver}}
    )
    for objects, want in [(kustomized, vendor), (rendered, driver or vendor)]:
        found = _admission(objects)
        (container,) = found["Deployment"]["spec"]["template"]["spec"]["containers"]
        assert f"--driver={want}" in container["args"]
        hooks = found["ValidatingWebhookConfiguration"]["webhooks"]
        assert {h["name"] for h in hooks} == set(WEBHOOKS)
        for hook in hooks:
            at = WEBHOOKS[hook["name"]]
            (condition,) = hook["matchConditions"]
            assert condition["expression"] == (
                f"has({at}.devices) && has({at}.devices.config) && {at}.devices.config.exists("
                f'c, has(c.opaque) && c.opaque.driver == "{want}")'
            )
            assert hook["clientConfig"]["service"] == {
                "name": NAME, "namespace": "kube-system", "path": PATH, "port": 443,
            }  # fmt: skip
            # An unreachable webhook must not stop claims: the driver checks them anyway.
            assert hook["failurePolicy"] == "Ignore"
            assert hook["rules"][0]["operations"] == ["CREATE", "UPDATE"]


def test_the_objects_carry_the_release_labels_and_the_daemonset_leaves_the_pods_alone(
    chart: Chart, kustomized: list[Obj]
) -> None:
    rendered = chart.render({"api": "dra", "admission": {"enabled": True}})
    for objects, release in [
        (rendered, {"app.kubernetes.io/instance": "cdi-gen"}),
        (kustomized, {}),
    ]:
        found = _admission(objects)
        for obj in found.values():
            labels = obj["metadata"]["labels"]
            assert labels["app.kubernetes.io/name"] == "cdi-gen", obj["metadata"]
            assert labels["app.kubernetes.io/component"] == "admission", obj["metadata"]
            assert release.items() <= labels.items(), obj["metadata"]
        (daemonset,) = [o for o in objects if o["kind"] == "DaemonSet"]
        pods = found["Deployment"]["spec"]["template"]["metadata"]["labels"]
        assert not daemonset["spec"]["selector"]["matchLabels"].items() <= pods.items()
        assert found["Service"]["spec"]["selector"].items() <= pods.items()


def test_helm_lint_strict_passes_with_the_webhook(chart: Chart) -> None:
    args = ["--set", "api=dra", "--set", "admission.enabled=true"]
    proc = _helm(chart.major, ["lint", "--strict", str(CHART), *args], chart.env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
