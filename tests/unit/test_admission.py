"""The claims' admission check: AdmissionReview v1 in and out, the driver's own message, and
the HTTPS server answering a real TLS client."""

from __future__ import annotations

import asyncio
import http.client
import json
import re
import signal
import ssl
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from cdi_gen.admission.certificate import tls_context
from cdi_gen.admission.https import PATH, AdmissionLimits, serve_admission
from cdi_gen.admission.review import ReviewError, config_problem, review
from cdi_gen.dra.driver.claimfiles import device_configs
from cdi_gen.dra.plugin.claims import ClaimRefused
from cdi_gen.errors import quote
from cdi_gen.model import AllocatedDevice, ClaimView, ConfigEntry
from tests.pki import Authority
from tests.ports import free_port
from tests.waiting import until_sync

DRIVER = "example.com"
OTHER = "gpu.other.example"
GOOD = {"apiVersion": "cdi-gen.io/v1alpha1", "kind": "DeviceConfig", "env": {"A": "1"}}
#: The typo the issue names: a field the model does not have.
TYPO = {
    "apiVersion": "cdi-gen.io/v1alpha1",
    "kind": "DeviceConfig",
    "deviceNodes": {"fileMod": 384},
}


def _entry(parameters: object, driver: str = DRIVER) -> dict[str, Any]:
    return {"requests": ["fpga"], "opaque": {"driver": driver, "parameters": parameters}}


def _claim(*config: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": "c", "namespace": "ns"},
        "spec": {
            "devices": {
                "requests": [{"name": "fpga", "exactly": {"deviceClassName": "fpga.example.com"}}],
                "config": list(config),
            }
        },
    }


def _template(*config: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": "t", "namespace": "ns"},
        "spec": {"spec": _claim(*config)["spec"]},
    }


def _review(obj: dict[str, Any], uid: str = "u-1") -> dict[str, Any]:
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": uid,
            "kind": {"group": "resource.k8s.io", "version": "v1", "kind": obj["kind"]},
            "resource": {"group": "resource.k8s.io", "version": "v1", "resource": "resourceclaims"},
            "operation": "CREATE",
            "object": obj,
        },
    }


def _driver_message(parameters: object) -> str:
    """What the driver says at NodePrepareResources of a claim allocated with ``parameters``."""
    view = ClaimView(
        "ns",
        "c",
        "uid",
        (AllocatedDevice("fpga", DRIVER, "node", "fpga-0"),),
        (ConfigEntry("FromClaim", DRIVER, ("fpga",), parameters, 0),),
    )
    with pytest.raises(ClaimRefused) as caught:
        device_configs("claim ns/c", view, DRIVER, ["fpga"])
    return str(caught.value)


def test_a_typo_is_denied_with_the_drivers_own_message() -> None:
    answer = review(_review(_claim(_entry(GOOD), _entry(TYPO))), DRIVER)
    assert answer["apiVersion"] == "admission.k8s.io/v1"
    assert answer["kind"] == "AdmissionReview"
    response = answer["response"]
    assert (response["uid"], response["allowed"]) == ("u-1", False)
    assert (response["status"]["code"], response["status"]["reason"]) == (422, "Invalid")
    message = response["status"]["message"]
    assert message == (
        f"spec.devices.config[1].opaque of driver {DRIVER}: "
        "parameters.deviceNodes.fileMod: unknown field"
    )
    # The part after the entry's place is the driver's own line, word for word.
    drivers = _driver_message(TYPO)
    tail = "parameters.deviceNodes.fileMod: unknown field"
    assert drivers.endswith(f"of driver {DRIVER}: {tail}"), drivers
    assert message.endswith(f"of driver {DRIVER}: {tail}")


@pytest.mark.parametrize(
    "parameters",
    [
        {"apiVersion": "cdi-gen.io/v1alpha2", "kind": "DeviceConfig"},
        {**GOOD, "env": {"1BAD": "x"}},
        {**GOOD, "deviceNodes": {"fileMode": 600}},
        {**GOOD, "deviceNodes": {"uid": "1000"}},
        "not an object",
        None,
    ],
)
def test_every_refusal_is_the_drivers_line(parameters: object) -> None:
    message = config_problem(_claim(_entry(parameters)), "ResourceClaim", DRIVER)
    assert message is not None
    drivers = _driver_message(parameters)
    problem = message.partition(f"of driver {DRIVER}: ")[2]
    assert problem and drivers.endswith(f"of driver {DRIVER}: {problem}"), (message, drivers)


def test_a_template_is_checked_at_its_claim_spec() -> None:
    answer = review(_review(_template(_entry(TYPO))), DRIVER)["response"]
    assert answer["allowed"] is False
    assert answer["status"]["message"].startswith(
        f"spec.spec.devices.config[0].opaque of driver {DRIVER}: parameters.deviceNodes.fileMod"
    )


@pytest.mark.parametrize(
    "obj",
    [
        _claim(_entry(GOOD)),
        _claim(),
        _claim(_entry(TYPO, driver=OTHER)),  # another driver's parameters are its own
        _claim({"requests": ["fpga"]}),  # not opaque
        _template(_entry(GOOD)),
        {"kind": "ResourceClaim", "spec": {}},  # the API server's validation answers for it
    ],
)
def test_what_is_allowed(obj: dict[str, Any]) -> None:
    answer = review(_review(obj, uid="u-2"), DRIVER)
    assert answer["response"] == {"uid": "u-2", "allowed": True}


def test_a_delete_has_no_object_and_is_allowed() -> None:
    body = _review(_claim(_entry(TYPO)))
    body["request"]["operation"], body["request"]["object"] = "DELETE", None
    assert review(body, DRIVER)["response"]["allowed"] is True


@pytest.mark.parametrize(
    ("body", "why"),
    [
        ([], "want an AdmissionReview object, not []"),
        ({"kind": "Pod"}, "want kind AdmissionReview, not 'Pod'"),
        ({**_review(_claim()), "kind": "ConversionReview"}, "not 'ConversionReview'"),
        ({"kind": "AdmissionReview"}, "AdmissionReview apiVersion None is not one of"),
        ({**_review(_claim()), "request": {}}, "the AdmissionReview has no request with a uid"),
    ],
)
def test_what_is_no_review(body: object, why: str) -> None:
    with pytest.raises(ReviewError, match=re.escape(why)):
        review(body, DRIVER)


@pytest.mark.parametrize(
    "version",
    ["admission.k8s.io/v2", "admission.k8s.io/v1alpha1", "v1", "", 1, "x" * 500],
)
def test_a_review_of_a_version_we_do_not_speak_is_refused(version: object) -> None:
    """Not echoed and allowed: an answer in an unknown version is not one the caller reads."""
    with pytest.raises(ReviewError) as caught:
        review({**_review(_claim(_entry(TYPO))), "apiVersion": version}, DRIVER)
    message = str(caught.value)
    assert message.startswith(f"AdmissionReview apiVersion {quote(version)} is not one of ")
    assert message.endswith("admission.k8s.io/v1, admission.k8s.io/v1beta1")
    assert len(message) < 200


def test_a_v1beta1_review_is_answered_in_v1beta1() -> None:
    body = {**_review(_claim(_entry(TYPO))), "apiVersion": "admission.k8s.io/v1beta1"}
    answer = review(body, DRIVER)
    assert answer["apiVersion"] == "admission.k8s.io/v1beta1"
    assert answer["response"]["allowed"] is False


# The server, over real TLS on a real socket.


@pytest.fixture(scope="module")
def tls(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    ca = Authority(tmp_path_factory.mktemp("pki"))
    pair = ca.issue(
        "webhook", "cdi-gen-admission", dns=("localhost",), ips=("127.0.0.1",), server=True
    )
    return ca.cert, pair.cert, pair.key


def _post(port: int, ca: Path, path: str, body: bytes, method: str = "POST") -> tuple[int, bytes]:
    context = ssl.create_default_context(cafile=str(ca))
    conn = http.client.HTTPSConnection("127.0.0.1", port, context=context, timeout=10)
    try:
        conn.request(method, path, body=body, headers={"Content-Type": "application/json"})
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


async def test_the_server_answers_reviews_over_tls(tls: tuple[Path, Path, Path]) -> None:
    ca, cert, key = tls
    server = await serve_admission("127.0.0.1", 0, tls_context(cert, key), DRIVER)
    port = server.sockets[0].getsockname()[1]
    async with server:

        def calls() -> list[tuple[int, bytes]]:
            review_body = json.dumps(_review(_claim(_entry(TYPO)))).encode()
            return [
                _post(port, ca, PATH, review_body),
                _post(port, ca, PATH, b"{not json"),
                _post(port, ca, PATH, b"", method="GET"),
                _post(port, ca, "/healthz", b"", method="GET"),
                _post(port, ca, "/other", b"", method="GET"),
                _post(
                    port, ca, PATH, json.dumps({**_review(_claim()), "apiVersion": "v9"}).encode()
                ),
            ]

        (denied, bad, get, health, other, version) = await asyncio.to_thread(calls)
    assert denied[0] == 200
    answer = json.loads(denied[1])["response"]
    assert answer["allowed"] is False
    assert answer["status"]["message"].endswith("parameters.deviceNodes.fileMod: unknown field")
    assert bad == (400, b"body is not JSON\n")
    assert get[0] == 405
    assert health == (200, b"ok\n")
    assert other[0] == 404
    assert version == (
        400, b"AdmissionReview apiVersion 'v9' is not one of admission.k8s.io/v1, "
        b"admission.k8s.io/v1beta1\n",
    )  # fmt: skip


async def test_the_server_refuses_an_oversize_body_unread(tls: tuple[Path, Path, Path]) -> None:
    ca, cert, key = tls
    server = await serve_admission("127.0.0.1", 0, tls_context(cert, key), DRIVER)
    port = server.sockets[0].getsockname()[1]

    def call() -> tuple[int, bytes]:
        context = ssl.create_default_context(cafile=str(ca))
        conn = http.client.HTTPSConnection("127.0.0.1", port, context=context, timeout=10)
        try:
            conn.putrequest("POST", PATH)
            conn.putheader("Content-Length", str(AdmissionLimits().max_body + 1))
            conn.endheaders()
            response = conn.getresponse()
            return response.status, response.read()
        finally:
            conn.close()

    async with server:
        status, _ = await asyncio.to_thread(call)
    assert status == 413


def test_the_command_refuses_unusable_certificate_files(tmp_path: Path) -> None:
    missing = tmp_path / "none.crt"
    proc = subprocess.run(
        [sys.executable, "-m", "cdi_gen", "admission", "--driver", DRIVER,
         "--tls-cert-file", str(missing), "--tls-key-file", str(missing)],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.startswith(f"error: --tls-cert-file {missing}, --tls-key-file {missing}: ")
    assert len(proc.stderr.splitlines()) == 1, proc.stderr


def test_the_command_serves_reviews_until_sigterm(tls: tuple[Path, Path, Path]) -> None:
    """``cdi-gen admission`` as the Deployment runs it: a real process, its start line, a
    refusal over TLS, exit 0 on SIGTERM."""
    ca, cert, key = tls
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "cdi_gen", "admission", "--driver", DRIVER,
         "--address", f"127.0.0.1:{port}", "--tls-cert-file", str(cert),
         "--tls-key-file", str(key)],
        stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:

        def health() -> tuple[int, bytes] | None:
            assert proc.poll() is None, "cdi-gen admission exited"
            try:
                return _post(port, ca, "/healthz", b"", method="GET")
            except OSError:
                return None

        assert until_sync(health, "cdi-gen admission answering /healthz", 30) == (200, b"ok\n")
        status, body = _post(port, ca, PATH, json.dumps(_review(_claim(_entry(TYPO)))).encode())
        assert status == 200
        assert json.loads(body)["response"]["allowed"] is False
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    assert (
        f"admission: checking {DRIVER}'s claim configuration at https://127.0.0.1:{port}{PATH}"
        in err
    ), err
