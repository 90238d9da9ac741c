"""A claim's own CDI spec: the class's devices with the claim's configuration applied, and
never more access than the class grants (issue 38: a claim may narrow, never widen)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cdi_gen.cdi.builder import assemble, build_entry
from cdi_gen.cdi.codec import dump_document, load_spec
from cdi_gen.cdi.validation import check_document
from cdi_gen.dra.driver.claimconfig import (
    API_VERSION,
    KIND,
    DeviceConfig,
    Layered,
    parse_device_config,
)
from cdi_gen.dra.driver.claimspec import (
    MAX_PLAIN_TAG,
    Widening,
    claim_device_name,
    claim_spec,
    claim_tag,
    configured_edits,
    widening,
)
from cdi_gen.errors import SpecError
from cdi_gen.names import validate_device_name

UID = "5d1c7c2e-9a43-4a57-8d1e-0c0a6f1f2b3c"


def config(**fields: Any) -> DeviceConfig:
    return parse_device_config({"apiVersion": API_VERSION, "kind": KIND, **fields})


def admin(**fields: Any) -> Layered:
    """A configuration of the DeviceClass (its admin may set anything)."""
    return Layered(from_class=config(**fields))


def user(**fields: Any) -> Layered:
    """A configuration of the claim itself (it may only narrow its class's)."""
    return Layered(from_claim=config(**fields))


def class_spec(**spec_level: Any) -> dict[str, Any]:
    """A class spec as the agent writes it: root-owned 0660 nodes, one env variable."""
    edits = {
        "deviceNodes": [
            {"path": "/dev/loop3", "uid": 0, "gid": 0, "fileMode": 0o660},
            {"path": "/dev/loop-control"},
        ],
        "env": ["LOOP=3", "MODE=class"],
    }
    doc = assemble(
        "example.com/loop",
        [build_entry("loop3", edits), build_entry("loop4", {"deviceNodes": [{"path": "/dev/x"}]})],
    )
    doc.update(spec_level)
    return doc


def test_every_device_node_gets_the_configured_owner_and_mode() -> None:
    spec = claim_spec(
        class_spec(),
        [
            (
                "loop3",
                claim_device_name(UID, 0),
                admin(
                    deviceNodes={"uid": 1000, "gid": 1000, "fileMode": 0o600, "permissions": "rw"},
                    env={"MODE": "claim", "EXTRA": "1"},
                ),
            )
        ],
    )
    assert spec["kind"] == "example.com/loop"
    [device] = spec["devices"]
    assert device["name"] == f"claim-{UID}-0"
    wanted = {"uid": 1000, "gid": 1000, "fileMode": 0o600, "permissions": "rw"}
    assert device["containerEdits"]["deviceNodes"] == [
        {"path": "/dev/loop3", **wanted},
        {"path": "/dev/loop-control", **wanted},
    ]
    assert device["containerEdits"]["env"] == ["LOOP=3", "MODE=claim", "EXTRA=1"]
    assert not check_document(spec)
    load_spec(dump_document(spec))  # the strict models read it back


def test_fields_the_config_leaves_out_stay_the_classs() -> None:
    edits = class_spec()["devices"][0]["containerEdits"]
    out = configured_edits(edits, admin(deviceNodes={"uid": 7}))
    assert out["deviceNodes"][0] == {"path": "/dev/loop3", "uid": 7, "gid": 0, "fileMode": 0o660}
    assert out["env"] == edits["env"]
    assert edits["deviceNodes"][0]["uid"] == 0  # the class's own edits are not changed


def test_spec_level_edits_and_version_come_from_the_class() -> None:
    base = class_spec(containerEdits={"env": ["ALL=1"]}, cdiVersion="0.5.0")
    spec = claim_spec(base, [("loop4", claim_device_name(UID, 1), user(env={"A": "b"}))])
    assert spec["containerEdits"] == {"env": ["ALL=1"]}
    assert spec["cdiVersion"] == "0.5.0"


def test_a_device_no_longer_in_the_class_spec_is_named() -> None:
    with pytest.raises(SpecError, match=r"devices\['loop9'\]: not in the class's spec"):
        claim_spec(class_spec(), [("loop9", claim_device_name(UID, 0), user())])


def test_a_name_the_class_spec_uses_is_refused() -> None:
    with pytest.raises(SpecError, match="is taken by the class's spec"):
        claim_spec(class_spec(), [("loop3", "loop4", user())])


@given(st.from_regex(r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,126}[A-Za-z0-9])?", fullmatch=True))
def test_device_names_are_cdi_names_for_any_claim_uid(uid: str) -> None:
    for index in (0, 31):
        validate_device_name(claim_device_name(uid, index))
    assert claim_tag(uid) == uid or len(uid) > MAX_PLAIN_TAG


# -- a claim never gets more than its class grants ---------------------------------------


def edits_of(node: dict[str, Any]) -> dict[str, Any]:
    return {"deviceNodes": [{"path": "/dev/zero", **node}]}


def test_the_claim_may_not_widen_the_classs_permissions_or_mode() -> None:
    """The issue's case: the admin's class says read-only 0640, the claim asks for rwm 0666."""
    edits = edits_of({"permissions": "r", "fileMode": 0o640})
    with pytest.raises(Widening, match=r"permissions 'rwm' widens the class's 'r'"):
        configured_edits(edits, user(deviceNodes={"permissions": "rwm", "fileMode": 0o666}))
    with pytest.raises(Widening, match=r"fileMode 0o666 sets bits 0o26 that the class's fileMode"):
        configured_edits(edits, user(deviceNodes={"fileMode": 0o666}))
    # The claim's permissions alone, no mode: still wider than "r".
    with pytest.raises(Widening, match="permissions 'rw'"):
        configured_edits(edits, user(deviceNodes={"permissions": "rw"}))


def test_the_claim_may_narrow_what_its_class_grants() -> None:
    edits = edits_of({"permissions": "rw", "fileMode": 0o660})
    out = configured_edits(edits, user(deviceNodes={"permissions": "r", "fileMode": 0o440}))
    assert out["deviceNodes"] == [{"path": "/dev/zero", "permissions": "r", "fileMode": 0o440}]
    # No permissions in the class: the runtime's default, rwm, which any subset narrows.
    out = configured_edits(edits_of({}), user(deviceNodes={"permissions": "m"}), lambda _: 0o666)
    assert out["deviceNodes"][0]["permissions"] == "m"


def test_the_claim_may_not_hand_a_root_only_node_to_another_user() -> None:
    root_only = edits_of({"uid": 0, "gid": 0, "fileMode": 0o660})
    with pytest.raises(Widening, match=r"would give uid 1000 rw- where the class .* gives ---"):
        configured_edits(root_only, user(deviceNodes={"uid": 1000, "gid": 1000, "fileMode": 0o600}))
    # The admin's DeviceClass may: its layer is the grant the claim's is held to.
    grant = Layered(
        from_class=config(deviceNodes={"uid": 1000, "gid": 1000}),
        from_claim=config(deviceNodes={"fileMode": 0o600}),
    )
    out = configured_edits(root_only, grant)
    assert out["deviceNodes"][0] == {
        "path": "/dev/zero",
        "uid": 1000,
        "gid": 1000,
        "fileMode": 0o600,
    }


def test_a_class_without_an_owner_lets_the_claim_give_the_node_to_its_user() -> None:
    """No uid in the spec: the runtime gives the node to the container's user, so a claim
    naming its pod's user gives nobody more than the owner bits the class already gave."""
    out = configured_edits(
        edits_of({"fileMode": 0o660}), user(deviceNodes={"uid": 1000, "fileMode": 0o600})
    )
    assert out["deviceNodes"][0] == {"path": "/dev/zero", "uid": 1000, "fileMode": 0o600}
    with pytest.raises(Widening, match="fileMode 0o606 sets bits 0o6"):
        configured_edits(edits_of({"fileMode": 0o600}), user(deviceNodes={"fileMode": 0o606}))
    # A group it names gets the group bits, which the class gave group 0 only.
    with pytest.raises(Widening, match=r"would give anyone else in gid 2000 r-- .* gives ---"):
        configured_edits(
            edits_of({"uid": 1000, "gid": 0, "fileMode": 0o640}), user(deviceNodes={"gid": 2000})
        )


def test_without_a_mode_in_the_spec_the_host_nodes_mode_is_the_grant() -> None:
    modes: list[str] = []

    def host(path: str) -> int | None:
        modes.append(path)
        return 0o660

    edits = {"deviceNodes": [{"path": "/dev/x", "hostPath": "/dev/loop7"}]}
    with pytest.raises(Widening, match=r"the class's host node's mode 0o660 does not"):
        configured_edits(edits, user(deviceNodes={"fileMode": 0o666}), host)
    assert modes == ["/dev/loop7"]  # the host's node, not the container's path
    assert configured_edits(edits, user(deviceNodes={"fileMode": 0o640}), host)
    # Unreadable (the device went): a claim setting a mode is refused, not guessed at.
    with pytest.raises(Widening, match="mode cannot be read"):
        configured_edits(edits, user(deviceNodes={"fileMode": 0o600}), lambda _: None)


def test_the_refusal_names_the_device_in_claim_spec() -> None:
    with pytest.raises(Widening, match=r"device 'loop3': device node '/dev/loop3': fileMode"):
        claim_spec(class_spec(), [("loop3", "claim-x-0", user(deviceNodes={"fileMode": 0o666}))])


_IDS = st.one_of(st.none(), st.sampled_from([0, 1000, 2000]))
_MODES = st.integers(0, 0o777)


def _concrete_access(node: dict[str, Any], mode: int, user: int, groups: frozenset[int]) -> int:
    """Access as the kernel decides it, for one concrete process (the runtime fills an unset
    owner or group with the process's own: ``user`` and its primary group, ``min(groups)``)."""
    uid = user if node.get("uid") is None else node["uid"]
    gid = min(groups) if node.get("gid") is None else node["gid"]
    if uid == user:
        return (mode >> 6) & 7
    if gid in groups:
        return (mode >> 3) & 7
    return mode & 7


@given(
    st.fixed_dictionaries({}, optional={"uid": _IDS, "gid": _IDS, "fileMode": _MODES}),
    st.fixed_dictionaries({}, optional={"uid": _IDS, "gid": _IDS, "fileMode": _MODES}),
    _MODES,
)
def test_widening_agrees_with_every_concrete_process(
    granted: dict[str, Any], claim: dict[str, Any], host: int
) -> None:
    """Refused exactly when the claim's mode sets a bit the class's does not, or some process
    (any of a few users, in any set of a few groups) would get a bit it did not have: no
    widening passes, no narrowing is refused."""
    granted = {k: v for k, v in granted.items() if v is not None}
    wanted = {**granted, **{k: v for k, v in claim.items() if v is not None}}
    m0 = granted.get("fileMode", host)
    m1 = wanted.get("fileMode", m0)
    ids = [0, 1000, 2000, 4242]  # 4242 owns nothing here
    wider = bool(m1 & ~m0) or any(
        _concrete_access(wanted, m1, u, frozenset(gs))
        & ~_concrete_access(granted, m0, u, frozenset(gs))
        for u in ids
        for gs in (
            [4242],
            [0],
            [1000],
            [2000],
            [0, 1000],
            [1000, 2000],
            [0, 2000],
            [0, 1000, 2000],
            [4242, 1000],
            [4242, 2000],
            [4242, 0],
        )
    )
    assert bool(widening(granted, wanted, lambda: host)) == wider


def test_the_host_node_is_read_only_when_the_claim_sets_owner_or_mode() -> None:
    read: list[str] = []

    def host(path: str) -> int | None:
        read.append(path)
        return 0o660

    edits = {"deviceNodes": [{"path": "/dev/loop7"}]}
    configured_edits(edits, user(deviceNodes={"permissions": "r"}), host)
    configured_edits(edits, user(env={"A": "b"}), host)
    assert read == []  # a stat per node saved on every prepare that sets neither
    configured_edits(edits, user(deviceNodes={"fileMode": 0o600}), host)
    assert read == ["/dev/loop7"]
