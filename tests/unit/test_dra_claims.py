"""What NodePrepareResources answers for one claim: every rule, each naming the claim, and
the kubelet's claim references checked as Kubernetes names before anything is read."""

from __future__ import annotations

import pytest

from cdi_gen.apiserver.resourceclaim import POD_CLAIM_NAME, claim_view
from cdi_gen.dra.driver.claimcheck import MAX_ALLOCATION_RESULTS, prepare_claim
from cdi_gen.dra.driver.poolentries import shared_once
from cdi_gen.dra.driver.refusal import DriverRefusal
from cdi_gen.dra.plugin.claims import (
    ClaimRef,
    ClaimRefused,
    PreparedDevice,
    Refusal,
    check_read,
    check_reference,
    claim_label,
)
from cdi_gen.errors import ClaimError
from cdi_gen.model import AllocatedDevice, ClaimView, PoolDevice

DRIVER, POOL = "cdi-gen.example.com", "node-a"
#: Share IDs as the API server gives them: UIDs.
S1, S2 = "7f3b0a1e-0000-4000-8000-000000000001", "7f3b0a1e-0000-4000-8000-000000000002"
DEVICES = {
    d.name: d
    for d in (
        PoolDevice("fpga-0", "example.com/fpga=0", "fpga", "/p0"),
        PoolDevice("fpga-1", "example.com/fpga=1", "fpga", "/p1", healthy=False),
        PoolDevice("fpga-2", "example.com/fpga=2", "fpga", "/p2", gone=True),
        PoolDevice("fpga-3", "example.com/fpga=3", "fpga", "/p3"),
        PoolDevice("kvm", "example.com/kvm=kvm-0", "kvm", "/k", shares=4),
    )
}


def claim(*results: AllocatedDevice, uid: str = "u1", allocated: bool = True) -> ClaimView:
    return ClaimView("ns", "c", uid, tuple(results) if allocated else None)


def prepare(view: ClaimView, uid: str = "u1") -> list[PreparedDevice]:
    """What the real path does with a claim read for ``ns/c``: the generic part checks it is
    the claim named, then the driver part decides."""
    ref = ClaimRef("ns", "c", uid)
    check_read(ref, view)
    label = claim_label(ref.namespace, ref.name, ref.uid)
    return prepare_claim(label, view, driver=DRIVER, pool_name=POOL, devices=DEVICES)


def test_our_results_become_devices_in_order_and_others_are_ignored() -> None:
    view = claim(
        AllocatedDevice("b", DRIVER, POOL, "fpga-3"),
        AllocatedDevice("gpu", "gpu.example.com", "elsewhere", "gpu-0"),
        AllocatedDevice("a", DRIVER, POOL, "kvm", share_id=S1),
    )
    assert prepare(view) == [
        PreparedDevice(("b",), POOL, "fpga-3", ("example.com/fpga=3",)),
        PreparedDevice(("a",), POOL, "kvm", ("example.com/kvm=kvm-0",), S1),
    ]


def test_two_shares_of_one_device_are_two_devices_with_one_cdi_name() -> None:
    view = claim(
        AllocatedDevice("a", DRIVER, POOL, "kvm", share_id=S1),
        AllocatedDevice("b", DRIVER, POOL, "kvm", share_id=S2),
    )
    got = prepare(view)
    assert [(d.request_names, d.device, d.share_id) for d in got] == [
        (("a",), "kvm", S1),
        (("b",), "kvm", S2),
    ]
    assert {d.cdi_device_ids for d in got} == {("example.com/kvm=kvm-0",)}


@pytest.mark.parametrize(
    ("view", "uid", "reason", "parts"),
    [
        (claim(uid="u2"), "u1", Refusal.UID_MISMATCH, ["'u1'", "'u2'"]),
        (claim(allocated=False), "u1", DriverRefusal.NOT_ALLOCATED, ["not allocated"]),
        (
            claim(AllocatedDevice("r", "other.example.com", POOL, "fpga-0")),
            "u1",
            DriverRefusal.NO_DEVICES,
            [f"no device of driver '{DRIVER}'"],
        ),
        (claim(), "u1", DriverRefusal.NO_DEVICES, ["no device of driver"]),
        (
            claim(AllocatedDevice("r", DRIVER, "node-b", "fpga-0")),
            "u1",
            DriverRefusal.OTHER_POOL,
            ["'fpga-0'", "'node-b'", f"'{POOL}'"],
        ),
        (
            claim(AllocatedDevice("r", DRIVER, POOL, "fpga-9")),
            "u1",
            DriverRefusal.UNKNOWN_DEVICE,
            ["'fpga-9'", "request 'r'"],
        ),
        (
            claim(AllocatedDevice("r", DRIVER, POOL, "fpga-1")),
            "u1",
            DriverRefusal.UNHEALTHY,
            ["'fpga-1'", "unhealthy"],
        ),
        (
            claim(AllocatedDevice("r", DRIVER, POOL, "fpga-2")),
            "u1",
            DriverRefusal.GONE,
            ["'fpga-2'", "gone"],
        ),
        (
            # One bad device refuses the whole claim: the pod needs all of them.
            claim(
                AllocatedDevice("ok", DRIVER, POOL, "fpga-0"),
                AllocatedDevice("bad", DRIVER, POOL, "fpga-1"),
            ),
            "u1",
            DriverRefusal.UNHEALTHY,
            ["request 'bad'"],
        ),
        (
            # A share holds nothing in the checkpoint: it must not get round an exclusive device.
            claim(AllocatedDevice("r", DRIVER, POOL, "fpga-0", share_id=S1)),
            "u1",
            DriverRefusal.INVALID_SHARE,
            ["'fpga-0'", f"shareID '{S1}'", "unshared"],
        ),
        (
            claim(AllocatedDevice("r", DRIVER, POOL, "kvm")),
            "u1",
            DriverRefusal.INVALID_SHARE,
            ["'kvm'", "no shareID"],
        ),
        (
            claim(
                AllocatedDevice("r", DRIVER, POOL, "kvm", share_id=S1),
                AllocatedDevice("q", DRIVER, POOL, "kvm", share_id=S1),
            ),
            "u1",
            DriverRefusal.INVALID_SHARE,
            ["request 'q'", f"shareID '{S1}' is given twice"],
        ),
    ],
)
def test_refusals_name_the_claim_the_device_and_why(
    view: ClaimView, uid: str, reason: Refusal, parts: list[str]
) -> None:
    with pytest.raises(ClaimRefused) as refused:
        prepare(view, uid)
    assert refused.value.reason is reason
    message = str(refused.value)
    assert message.startswith(f"claim ns/c (uid {uid!r})"), message
    for part in parts:
        assert part in message, message
    assert "\n" not in message


#: Share IDs the API would never store, by what is wrong with them.
BAD_SHARES = {
    "empty": "",
    "long": "x" * 5000,
    "newline": f"{S1}\nforged log line",
    "newline-end": S1[:-1] + "\n",
    "upper": S1.upper(),
    "no-dashes": S1.replace("-", ""),
    "braces": "{" + S1 + "}",
    "short": S1[:-1],
    "long-by-one": S1 + "0",
    "underscores": S1.replace("-", "_"),
    "word": "s",
}


@pytest.mark.parametrize("share", list(BAD_SHARES.values()), ids=list(BAD_SHARES))
@pytest.mark.parametrize("device", ["kvm", "fpga-0", "fpga-9"])
def test_a_share_id_that_is_not_a_uid_is_refused_quoting_it_and_the_rule(
    share: str, device: str
) -> None:
    """The API stores only a UID as a result's shareID; anything else, on a shared device,
    an unshared one or one the node lacks, is refused before it is prepared (and so before
    the status, the checkpoint or a spec could take it), never read as no share."""
    with pytest.raises(ClaimRefused) as refused:
        prepare(claim(AllocatedDevice("r", DRIVER, POOL, device, share_id=share)))
    assert refused.value.reason is DriverRefusal.INVALID_SHARE
    message = str(refused.value)
    assert message.startswith(
        f"claim ns/c (uid 'u1'): device {device!r} of request 'r': shareID "
    ), message
    assert "a lowercase UUID in 8-4-4-4-12 form" in message
    assert repr(share[:20])[:-1] in message, message
    assert "\n" not in message
    assert len(message) < 400


def test_a_share_id_the_api_stores_is_prepared_whatever_its_uuid_version() -> None:
    """The API's rule is the form alone (lowercase hex, 8-4-4-4-12), not a UUID version."""
    for share in ("00000000-0000-0000-0000-000000000000", "ffffffff-ffff-ffff-ffff-ffffffffffff"):
        [device] = prepare(claim(AllocatedDevice("r", DRIVER, POOL, "kvm", share_id=share)))
        assert device.share_id == share


def _refused(view: ClaimView, devices: dict[str, PoolDevice]) -> str:
    with pytest.raises(ClaimRefused) as refused:
        label = claim_label("ns", "c", "u1")
        prepare_claim(label, view, driver=DRIVER, pool_name=POOL, devices=devices)
    assert refused.value.reason is DriverRefusal.UNKNOWN_DEVICE
    return str(refused.value)


def test_a_claim_allocated_before_its_device_changed_form_is_told_so() -> None:
    """An agent that starts against an API server that took up (or dropped) consumable
    capacity publishes a shared device in the other form; a claim allocated to the old
    form, not yet prepared, is refused naming why and what to do."""
    slots = [
        PoolDevice(f"kvm-kvm-{i}", f"example.com/kvm=kvm-{i}", "kvm", "/k", slots=2)
        for i in range(2)
    ]
    once = {d.name: d for d in shared_once(slots, classes=["kvm"])}
    assert [(d.name, d.shares) for d in once.values()] == [("kvm-kvm", 2)]
    where = "claim ns/c (uid 'u1'): device 'kvm-kvm-1' (pool 'node-a') of request 'r'"
    again = "the claim was allocated before; re-create it (or its pod) to have it allocated again"
    assert _refused(claim(AllocatedDevice("r", DRIVER, POOL, "kvm-kvm-1")), once) == (
        f"{where} is not in this node's pool: it is a slot of device 'kvm-kvm', which this "
        f"node publishes by consumable capacity since its agent started; {again}"
    )
    share = claim(AllocatedDevice("r", DRIVER, POOL, "kvm-kvm", share_id=S1))
    assert _refused(share, {d.name: d for d in slots}) == (
        "claim ns/c (uid 'u1'): device 'kvm-kvm' (pool 'node-a') of request 'r' is not in "
        "this node's pool: this node publishes it as 2 slots ('kvm-kvm-0' ...) since its "
        f"agent started, where the API server drops consumable capacity; {again}"
    )
    # Only where the form changed: a device unknown in both forms is just unknown.
    assert _refused(claim(AllocatedDevice("r", DRIVER, POOL, "kvm-kvm-9-1")), once).endswith(
        "is not in this node's pool"
    )
    unshared = {"fpga-0": DEVICES["fpga-0"]}
    assert _refused(claim(AllocatedDevice("r", DRIVER, POOL, "fpga-0-1")), unshared).endswith(
        "is not in this node's pool"
    )


def test_a_hostile_value_is_quoted_and_cut() -> None:
    view = claim(AllocatedDevice("r", DRIVER, POOL, "x" * 5000))
    with pytest.raises(ClaimRefused) as refused:
        prepare(view)
    assert len(str(refused.value)) < 400


@pytest.mark.parametrize("count", [MAX_ALLOCATION_RESULTS + 1, 10_000])
def test_a_claim_over_the_apis_results_limit_is_refused(count: int) -> None:
    view = claim(*[AllocatedDevice(f"r{i}", DRIVER, POOL, "fpga-0") for i in range(count)])
    with pytest.raises(ClaimRefused) as refused:
        prepare(view)
    assert refused.value.reason is DriverRefusal.TOO_MANY_RESULTS
    message = str(refused.value)
    assert message.startswith("claim ns/c (uid 'u1')"), message
    assert f"{count} results; the API allows at most {MAX_ALLOCATION_RESULTS}" in message


def test_a_claim_at_the_apis_results_limit_is_prepared() -> None:
    results = [AllocatedDevice(f"r{i}", DRIVER, POOL, "fpga-0") for i in range(32)]
    assert len(prepare(claim(*results))) == MAX_ALLOCATION_RESULTS


@pytest.mark.parametrize(
    ("namespace", "name", "uid", "reason", "parts"),
    [
        (
            "../../../../../api/v1/nodes",
            "..",
            "u1",
            Refusal.INVALID_NAME,
            ["namespace '../../../../../api/v1/nodes'", "DNS label"],
        ),
        ("*", "c", "u1", Refusal.INVALID_NAME, ["namespace '*'", "DNS label"]),
        ("", "c", "u1", Refusal.INVALID_NAME, ["namespace ''"]),
        ("Default", "c", "u1", Refusal.INVALID_NAME, ["namespace 'Default'"]),
        ("a" * 64, "c", "u1", Refusal.INVALID_NAME, ["namespace 'aaaa", "1-63"]),
        ("ns", "..", "u1", Refusal.INVALID_NAME, ["name '..'", "DNS subdomain"]),
        ("ns", "a/b", "u1", Refusal.INVALID_NAME, ["name 'a/b'"]),
        ("ns", "", "u1", Refusal.INVALID_NAME, ["name ''"]),
        ("ns", "c\n2026 forged", "u1", Refusal.INVALID_NAME, ["name 'c\\n2026 forged'"]),
        ("ns", "c\x00", "u1", Refusal.INVALID_NAME, ["name 'c\\x00'"]),
        ("ns", "x" * 254, "u1", Refusal.INVALID_NAME, ["(254 long)", "1-253"]),
        ("ns", "c", "", Refusal.NO_UID, ["no claim UID"]),
        ("ns", "c", "u\n1", Refusal.INVALID_UID, ["uid 'u\\n1'", "1-128"]),
        ("ns", "c", "u" * 129, Refusal.INVALID_UID, ["(129 long)"]),
        ("ns", "c", "../u", Refusal.INVALID_UID, ["uid '../u'"]),
    ],
)
def test_a_reference_that_is_not_a_kubernetes_one_is_refused(
    namespace: str, name: str, uid: str, reason: Refusal, parts: list[str]
) -> None:
    with pytest.raises(ClaimRefused) as refused:
        check_reference(namespace, name, uid)
    assert refused.value.reason is reason
    message = str(refused.value)
    assert message.startswith("claim "), message
    for part in parts:
        assert part in message, message
    assert message.isprintable(), message
    assert len(message) < 500, message


@pytest.mark.parametrize(
    ("namespace", "name", "uid"),
    [
        ("default", "c", "5c8a1e2b-0d2f-4c35-9a51-2d2b9e2f6f1a"),
        ("a" * 63, ".".join(["b" * 63] * 4)[:253].rstrip("."), "u"),
        ("kube-system", "gpu-claim.v2", "U_1.x"),
    ],
)
def test_kubernetes_references_pass(namespace: str, name: str, uid: str) -> None:
    check_reference(namespace, name, uid)


@pytest.mark.parametrize(
    ("namespace", "name"), [("other", "c"), ("ns", "other"), ("ns", "../../etc"), ("/abs", "c")]
)
def test_the_claim_answered_must_be_the_claim_asked_for(namespace: str, name: str) -> None:
    """Issue 38: file names are built from the claim: the API server's answer must carry the
    kubelet's namespace and name, not another claim's (or a path)."""
    view = ClaimView(namespace, name, "u1", (AllocatedDevice("r", DRIVER, POOL, "fpga-0"),))
    with pytest.raises(ClaimRefused) as refused:
        prepare(view)
    assert refused.value.reason == Refusal.NAME_MISMATCH
    assert "claim ns/c (uid 'u1'): the API server answered claim" in str(refused.value)
    assert "\n" not in str(refused.value)


@pytest.mark.parametrize(
    "request_name",
    ["r\x00x", "r\n<forged>", "..", "", "r/../..", "r" * 300, "R", "a/b/c", "/", "r/"],
)
def test_a_request_name_that_is_no_request_is_refused(request_name: str) -> None:
    view = claim(AllocatedDevice(request_name, DRIVER, POOL, "fpga-0"))
    with pytest.raises(ClaimRefused) as refused:
        prepare(view)
    assert refused.value.reason == DriverRefusal.INVALID_REQUEST
    message = str(refused.value)
    assert message.isprintable() and len(message) < 400, message
    assert "want a DNS label" in message


def test_a_subrequest_result_is_a_request_name() -> None:
    view = claim(AllocatedDevice("main/sub-1", DRIVER, POOL, "fpga-0"))
    assert [d.request_names for d in prepare(view)] == [("main/sub-1",)]


@pytest.mark.parametrize("pod_claim", ["../..", "a/b", "x\ny", "UPPER", ""])
def test_a_pod_claim_name_that_is_no_label_is_refused(pod_claim: str) -> None:
    """Checked once, where the API server's answer is decoded: such a claim never reaches
    the driver part (its prepare answers the claim's read error)."""
    obj = {
        "metadata": {
            "namespace": "ns",
            "name": "c",
            "uid": "u1",
            "annotations": {POD_CLAIM_NAME: pod_claim},
        },
        "status": {
            "allocation": {
                "devices": {
                    "results": [
                        {"request": "r", "driver": DRIVER, "pool": POOL, "device": "fpga-0"}
                    ]
                }
            }
        },
    }
    with pytest.raises(ClaimError, match="pod-claim-name") as refused:
        claim_view(obj)
    assert "is not a pod's claim name: want a DNS label" in str(refused.value)
    assert "\n" not in str(refused.value)
