"""Per-claim configuration through the DRA driver's kubelet side, against the kubelet stand-in
over real gRPC: a configured claim gets a spec of its own (the class's edits with its owner,
mode and env) that resolves as the runtime resolves it, removed at unprepare; a bad config is
that claim's error naming the entry and the field, with nothing written; devices are held
exclusively unless given with admin access; and the claims' specs follow the checkpoint, the
one store of prepared claims, across restarts (orphans removed, a claim whose spec vanished
prepared anew), also when an older cdi-gen recorded them in their specs' owner records."""

from __future__ import annotations

import logging
import shutil
import threading
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import orjson
import pytest

from cdi_gen.cdi.builder import assemble, build_entry
from cdi_gen.cdi.codec import dump_document
from cdi_gen.cdi.ownerrecords import OWNER_SUFFIX
from cdi_gen.cdi.registry import SpecCache
from cdi_gen.cdi.specnames import transient_filename
from cdi_gen.cdi.store import SpecStore
from cdi_gen.cdi.writer import write_bytes
from cdi_gen.dra.driver.checkpoint import checkpoint_path
from cdi_gen.dra.driver.claimfiles import ClaimFiles
from cdi_gen.dra.driver.devicemetadata import metadata_stream
from cdi_gen.dra.driver.preparer import PoolPreparer
from cdi_gen.dra.plugin.pool import DevicePool
from cdi_gen.dra.plugin.server import DraPlugin
from cdi_gen.errors import ClaimError
from cdi_gen.model import AllocatedDevice, ClaimView, ConfigEntry, PoolDevice
from tests.fakes.drakubelet import FakeDraKubelet

pytestmark = pytest.mark.timeout(60)

DRIVER = "cdi-gen.example.com"
POOL = "node-a"
UID = "5d1c7c2e-9a43-4a57-8d1e-0c0a6f1f2b3c"
CLAIM_SPEC = f"example.com-fpga@{UID}.json"
#: The class's nodes: no owner (the container's user, as the runtime fills it in), 0660.
CLASS_NODE = {"fileMode": 0o660}
NON_ROOT = {"uid": 1000, "gid": 1000, "fileMode": 0o600}


def params(**fields: Any) -> dict[str, Any]:
    return {"apiVersion": "cdi-gen.io/v1alpha1", "kind": "DeviceConfig", **fields}


def entry(
    index: int, parameters: object, *, source: str = "FromClaim", requests: Sequence[str] = ()
) -> ConfigEntry:
    return ConfigEntry(source, DRIVER, tuple(requests), parameters, index)


def result(dev: str, request: str = "fpga", *, admin: bool = False) -> AllocatedDevice:
    return AllocatedDevice(request, DRIVER, POOL, dev, admin_access=admin)


class Claims:
    """An in-memory ClaimReader (server threads call it)."""

    def __init__(self) -> None:
        self.claims: dict[str, ClaimView] = {}
        self._lock = threading.Lock()

    def add(
        self,
        name: str,
        uid: str,
        *results: AllocatedDevice,
        config: Sequence[ConfigEntry] = (),
        pod_claim_name: str | None = None,
    ) -> tuple[str, str, str]:
        with self._lock:
            self.claims[name] = ClaimView(
                "default", name, uid, results, tuple(config), pod_claim_name
            )
        return ("default", name, uid)

    def read_claims(
        self, refs: Sequence[tuple[str, str]], timeout: float
    ) -> list[ClaimView | ClaimError]:
        with self._lock:
            return [
                self.claims.get(name) or ClaimError(f"claim {ns}/{name}: not found")
                for ns, name in refs
            ]


class Node:
    """The class spec on disk (root-owned 0660 nodes, as the issue's class), the pool, the
    claims, and a driver whose claims' specs go beside the class's."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.spec_dir = root / "cdi"
        self.resolver = SpecCache([self.spec_dir])
        # The agent's: what its runners wrote; the resolver learns each write, as the agent's.
        self.specs = SpecStore(self.resolver)
        self.write_class_spec()
        self.pool = DevicePool()
        self.pool.publish(
            "fpga",
            [
                PoolDevice(
                    f"fpga-{n}",
                    f"example.com/fpga={n}",
                    "fpga",
                    f"/sys/devices/{n}",
                    attributes={"class": "fpga", "numaNode": 0, "shared": False},
                )
                for n in ("0", "1")
            ],
        )
        self.claims = Claims()
        self.metadata_dir = root / "plugins" / DRIVER / "dra-device-metadata"

    def spec_bytes(self) -> bytes:
        edits = {"deviceNodes": [{"path": "/dev/null", **CLASS_NODE}], "env": ["MODE=class"]}
        doc = assemble("example.com/fpga", [build_entry("0", edits), build_entry("1", edits)])
        return dump_document(doc)

    def write_class_spec(self) -> None:
        self.specs.sync(self.spec_dir, "example.com", "fpga", self.spec_bytes(), instance=None)

    def plugin(self, *, metadata: bool = True) -> DraPlugin:
        """The plugin; without ``metadata``, a plain claim keeps its class's spec alone."""
        preparer = PoolPreparer(
            DRIVER,
            self.pool,
            pool_name=POOL,
            cdi_kinds=["example.com/fpga"],
            state_dir=self.root / "state",
            resolver=self.resolver,
            claim_files=ClaimFiles(
                self.spec_dir,
                "example.com",
                store=self.specs,
                driver=DRIVER,
                metadata_dir=self.metadata_dir if metadata else None,
            ),
        )
        return DraPlugin(
            DRIVER,
            self.pool,
            preparer,
            claims=self.claims,
            pool_name=POOL,
            registry_dir=self.root / "registry",
            plugins_dir=self.root / "plugins",
            watch_interval=0.02,
            max_backoff=0.2,
            register_timeout=2.0,
        )

    def spec_files(self) -> list[str]:
        return sorted(p.name for p in self.spec_dir.iterdir() if not p.name.startswith("."))

    def claim_spec(self) -> dict[str, Any]:
        doc: dict[str, Any] = orjson.loads((self.spec_dir / CLAIM_SPEC).read_bytes())
        return doc


@pytest.fixture
async def node(short_dir: Path) -> AsyncIterator[Node]:
    (short_dir / "registry").mkdir()
    node = Node(short_dir)
    try:
        yield node
    finally:
        node.resolver.close()


async def test_a_prepare_checks_the_names_of_its_own_spec_without_a_scan(node: Node) -> None:
    """Each prepare writes the claim's own specs, then checks their names as the runtime
    resolves them: from what the agent wrote, with no scan of the folder (no hop to the
    scan worker); a spec someone else drops in the folder is still scanned and seen."""
    config = [entry(0, params(deviceNodes=NON_ROOT))]
    async with FakeDraKubelet(node.root / "registry") as kubelet, node.plugin():
        connection = await kubelet.next_registration()
        first = node.claims.add("c0", "uid-0", result("fpga-1"), config=config)
        assert (await connection.prepare([first])).claims["uid-0"].error == ""
        scans = node.resolver.scans
        for n in range(1, 6):
            claim = node.claims.add(f"c{n}", f"uid-{n}", result("fpga-0"), config=config)
            answer = (await connection.prepare([claim])).claims[f"uid-{n}"]
            assert answer.error == ""
            assert (await connection.unprepare([claim])).claims[f"uid-{n}"].error == ""
        assert node.resolver.scans == scans
        # A foreign spec defining a claim's device: the runtime would not resolve it.
        (node.spec_dir / "other.json").write_bytes(
            orjson.dumps(
                {
                    "cdiVersion": "0.3.0",
                    "kind": "example.com/fpga",
                    "devices": [{"name": "claim-uid-9-0", "containerEdits": {"env": ["A=1"]}}],
                }
            )
        )
        claim = node.claims.add("c9", "uid-9", result("fpga-0"), config=config)
        answer = (await connection.prepare([claim])).claims["uid-9"]
        assert "is defined in more than one spec file" in answer.error
        assert node.resolver.scans > scans


async def test_a_configured_claim_gets_its_own_spec_until_unprepared(node: Node) -> None:
    claim = node.claims.add(
        "c1",
        UID,
        result("fpga-0"),
        config=[
            entry(0, params(env={"FROM": "class", "MODE": "class-config"}), source="FromClass"),
            entry(1, params(deviceNodes=NON_ROOT, env={"MODE": "claim"}), requests=["fpga"]),
        ],
    )
    async with FakeDraKubelet(node.root / "registry") as kubelet, node.plugin():
        connection = await kubelet.next_registration()
        answer = (await connection.prepare([claim])).claims[UID]
        assert answer.error == ""
        [dev] = answer.devices
        assert list(dev.cdi_device_ids) == [f"example.com/fpga=claim-{UID}-0"]
        assert (dev.pool_name, dev.device_name) == (POOL, "fpga-0")
        spec = node.claim_spec()
        [device] = spec["devices"]
        assert device["name"] == f"claim-{UID}-0"
        edits = {k: v for k, v in device["containerEdits"].items() if k != "mounts"}
        assert edits == {  # mounts: the device metadata, see the KEP-5304 test
            "deviceNodes": [{"path": "/dev/null", **NON_ROOT}],
            "env": ["FROM=class", "MODE=claim"],
        }
        # As the runtime resolves it, and the class's own device is as it was.
        assert node.resolver.unresolved([f"example.com/fpga=claim-{UID}-0"]) == []
        assert node.spec_files() == ["example.com-fpga.json", CLAIM_SPEC]
        # The kubelet asks again: the same answer, nothing written anew.
        again = (await connection.prepare([claim])).claims[UID]
        assert list(again.devices[0].cdi_device_ids) == [f"example.com/fpga=claim-{UID}-0"]
        assert (await connection.unprepare([claim])).claims[UID].error == ""
        assert node.spec_files() == ["example.com-fpga.json"]


async def test_a_claim_without_config_keeps_the_class_spec(node: Node) -> None:
    other = ConfigEntry("FromClaim", "gpu.other.com", (), {"anything": "goes"}, 0)
    claim = node.claims.add("c1", UID, result("fpga-0"), config=[other])
    async with FakeDraKubelet(node.root / "registry") as kubelet, node.plugin(metadata=False):
        connection = await kubelet.next_registration()
        answer = (await connection.prepare([claim])).claims[UID]
        assert answer.error == ""
        assert list(answer.devices[0].cdi_device_ids) == ["example.com/fpga=0"]
        assert node.spec_files() == ["example.com-fpga.json"]


async def test_config_limited_to_one_request_configures_only_its_device(node: Node) -> None:
    claim = node.claims.add(
        "c1",
        UID,
        result("fpga-0", "plain"),
        result("fpga-1", "owned"),
        config=[entry(0, params(deviceNodes={"uid": 7}), requests=["owned"])],
    )
    async with FakeDraKubelet(node.root / "registry") as kubelet, node.plugin(metadata=False):
        connection = await kubelet.next_registration()
        answer = (await connection.prepare([claim])).claims[UID]
        assert answer.error == ""
        ids = [list(d.cdi_device_ids) for d in answer.devices]
        assert ids == [["example.com/fpga=0"], [f"example.com/fpga=claim-{UID}-1"]]
        [device] = node.claim_spec()["devices"]
        assert device["containerEdits"]["deviceNodes"][0]["uid"] == 7


@pytest.mark.parametrize(
    ("parameters", "field"),
    [
        (params(deviceNodes={"fileMod": 384}), "parameters.deviceNodes.fileMod: unknown field"),
        (params(deviceNodes={"fileMode": 4095}), "parameters.deviceNodes.fileMode: 4095 is 0o7777"),
        ({"apiVersion": "cdi-gen.io/v1alpha1", "kind": "GpuConfig"}, "parameters.kind: "),
    ],
)
async def test_a_bad_config_is_that_claims_error_and_writes_nothing(
    node: Node, parameters: dict[str, Any], field: str
) -> None:
    bad = node.claims.add("bad", UID, result("fpga-0"), config=[entry(3, parameters)])
    good = node.claims.add("good", "uid-2", result("fpga-1"))
    async with FakeDraKubelet(node.root / "registry") as kubelet, node.plugin(metadata=False):
        connection = await kubelet.next_registration()
        answers = (await connection.prepare([bad, good])).claims
        error = answers[UID].error
        assert error.startswith(f"claim default/bad (uid '{UID}'): config entry ")
        assert "status.allocation.devices.config[3] (FromClaim, all requests)" in error
        assert f"of driver {DRIVER}: {field}" in error
        assert answers["uid-2"].error == ""
        assert node.spec_files() == ["example.com-fpga.json"]
        state = orjson.loads(checkpoint_path(node.root / "state", DRIVER).read_bytes())
        assert list(state["claims"]) == ["uid-2"]


async def test_a_device_held_by_another_claim_is_refused_unless_admin_access(
    node: Node,
) -> None:
    worker = node.claims.add("worker", "uid-w", result("fpga-0"))
    second = node.claims.add("second", "uid-2", result("fpga-0"))
    monitor = node.claims.add("monitor", "uid-m", result("fpga-0", admin=True))
    async with FakeDraKubelet(node.root / "registry") as kubelet, node.plugin(metadata=False):
        connection = await kubelet.next_registration()
        assert (await connection.prepare([worker])).claims["uid-w"].error == ""
        refused = (await connection.prepare([second])).claims["uid-2"].error
        assert refused == (
            "claim default/second (uid 'uid-2'): device fpga-0 (pool node-a) of request fpga "
            "is in use by claim default/worker (uid 'uid-w'), prepared on this node"
        )
        admitted = (await connection.prepare([monitor])).claims["uid-m"]
        assert admitted.error == ""
        assert list(admitted.devices[0].cdi_device_ids) == ["example.com/fpga=0"]
        # Once the worker is unprepared, the device is free again.
        assert (await connection.unprepare([worker])).claims["uid-w"].error == ""
        assert (await connection.prepare([second])).claims["uid-2"].error == ""


def checkpoint_claims(node: Node) -> list[str]:
    """The UIDs in the checkpoint file (none yet: no file)."""
    path = checkpoint_path(node.root / "state", DRIVER)
    return list(orjson.loads(path.read_bytes())["claims"]) if path.exists() else []


async def test_a_configured_claim_is_recorded_with_its_spec_across_restarts(node: Node) -> None:
    claim = node.claims.add("c1", UID, result("fpga-0"), config=[entry(0, params(env={"A": "1"}))])
    async with FakeDraKubelet(node.root / "registry") as kubelet, node.plugin():
        connection = await kubelet.next_registration()
        first = (await connection.prepare([claim])).claims[UID]
        assert first.error == ""
    # Recorded in the checkpoint with the spec written for it; its spec's owner record says
    # whose the spec is, and carries no claim record (the checkpoint is the one store).
    assert checkpoint_claims(node) == [UID]
    state = orjson.loads(checkpoint_path(node.root / "state", DRIVER).read_bytes())
    assert state["version"] == 5
    assert state["claims"][UID]["specs"] == [{"kind": "example.com/fpga", "transient": UID}]
    record = orjson.loads((node.spec_dir / f".{CLAIM_SPEC}{OWNER_SUFFIX}").read_bytes())
    assert (record["instance"], record["transient"]) == ("example.com", UID)
    assert "payload" not in record
    # A spec of ours no prepared claim names (an agent killed between the spec and its
    # record): removed.
    write_bytes(node.spec_dir, "example.com", "fpga", node.spec_bytes(), transient="uid-orphan")
    # Its metadata (this driver's format, under the name it gives) goes with it; a file the
    # driver did not write stays, whatever its name.
    orphan = metadata_stream(
        driver=DRIVER,
        namespace="default",
        claim="x",
        uid="uid-orphan",
        pod_claim_name=None,
        request="fpga",
        devices=[],
    )
    (node.metadata_dir / "uid-orphan_fpga.json").write_bytes(orphan)
    (node.metadata_dir / "default_x_fpga.json").write_bytes(b"{}\n")
    # An agent killed between a claim's record and its spec: the record alone.
    write_bytes(node.spec_dir, "example.com", "fpga", node.spec_bytes(), transient="uid-lone")
    (node.spec_dir / "example.com-fpga@uid-lone.json").unlink()
    del node.claims.claims["c1"]  # gone from the API server: answered from the checkpoint
    async with FakeDraKubelet(node.root / "registry") as kubelet, node.plugin():
        connection = await kubelet.next_registration()
        assert node.spec_files() == ["example.com-fpga.json", CLAIM_SPEC]
        assert [p.name for p in node.spec_dir.iterdir() if "uid-" in p.name] == []
        assert sorted(p.name for p in node.metadata_dir.iterdir()) == [
            f"{UID}_fpga.json",
            "default_x_fpga.json",
        ]
        assert (await connection.prepare([claim])).claims[UID] == first
        assert (await connection.unprepare([claim])).claims[UID].error == ""
        assert node.spec_files() == ["example.com-fpga.json"]
    # The claim's spec and owner record gone (/var/run/cdi emptied): forgotten, prepared anew.
    node.claims.add("c1", UID, result("fpga-0"), config=[entry(0, params(env={"A": "1"}))])
    async with FakeDraKubelet(node.root / "registry") as kubelet, node.plugin():
        connection = await kubelet.next_registration()
        assert (await connection.prepare([claim])).claims[UID].error == ""
    for name in (CLAIM_SPEC, f".{CLAIM_SPEC}{OWNER_SUFFIX}"):
        (node.spec_dir / name).unlink()
    async with FakeDraKubelet(node.root / "registry") as kubelet, node.plugin():
        connection = await kubelet.next_registration()
        # No prepared claim names the claim's file; the foreign one stays.
        assert [p.name for p in node.metadata_dir.iterdir()] == ["default_x_fpga.json"]
        assert (await connection.prepare([claim])).claims[UID].error == ""
        assert node.spec_files() == ["example.com-fpga.json", CLAIM_SPEC]


async def test_a_claim_specs_owner_record_carries_no_claim_record(node: Node) -> None:
    # Every prepared claim is in the checkpoint: the owner records of its specs (a configured
    # claim's spec, a plain claim's metadata spec) say whose the spec is, and nothing more.
    configured = node.claims.add("c1", UID, result("fpga-0"), config=[entry(0, params())])
    plain = node.claims.add("c2", "uid-2", result("fpga-1"))
    async with FakeDraKubelet(node.root / "registry") as kubelet, node.plugin():
        connection = await kubelet.next_registration()
        answers = (await connection.prepare([configured, plain])).claims
        assert [answers[u].error for u in (UID, "uid-2")] == ["", ""]
        owners = sorted(node.spec_dir.glob(f".*@*{OWNER_SUFFIX}"))
        assert [o.name for o in owners] == [
            f".{CLAIM_SPEC}{OWNER_SUFFIX}",
            f".example.com-fpga@uid-2.metadata.json{OWNER_SUFFIX}",
        ]
        for owner in owners:
            assert "payload" not in orjson.loads(owner.read_bytes()), owner.name
        assert sorted(checkpoint_claims(node)) == sorted([UID, "uid-2"])


def as_before_format_5(node: Node, boot: str | None = None) -> None:
    """Turn the driver's state into what a cdi-gen before checkpoint format 5 left, in this
    boot (or ``boot``): each claim with specs of its own recorded in their owner records (its
    entry with ``uid`` and ``bootId``, written by the one writer as that cdi-gen did), the
    others in a format-4 checkpoint, and no checkpoint when there are none."""
    path = checkpoint_path(node.root / "state", DRIVER)
    doc = orjson.loads(path.read_bytes())
    doc["bootId"] = boot or doc["bootId"]
    plain = {}
    for uid, claim in doc["claims"].items():
        if "specs" not in claim:
            plain[uid] = claim
        for spec in claim.get("specs", ()):
            vendor, _, cls = spec["kind"].partition("/")
            data = (node.spec_dir / transient_filename(vendor, cls, spec["transient"])).read_bytes()
            record = {"uid": uid, **claim, "bootId": doc["bootId"]}
            kw = {"instance": "example.com", "transient": spec["transient"], "payload": record}
            assert write_bytes(node.spec_dir, vendor, cls, data, **kw)
    if plain:
        path.write_bytes(orjson.dumps({**doc, "version": 4, "claims": plain}))
    else:
        path.unlink()


@pytest.mark.parametrize("metadata", [True, False])
async def test_an_upgraded_agent_adopts_the_claims_an_older_one_recorded(
    node: Node, metadata: bool
) -> None:
    """An agent before checkpoint format 5 recorded a claim with specs of its own in their
    owner records and the others in a format-4 checkpoint (with device metadata every claim
    has a spec, so there was no checkpoint). The upgraded agent answers every claim from
    them, writes the checkpoint in format 5 with all of them at start, and then needs the
    owner records' claim records no more."""
    configured = node.claims.add("c1", UID, result("fpga-0"), config=[entry(0, params())])
    plain = node.claims.add("c2", "uid-2", result("fpga-1"))
    async with FakeDraKubelet(node.root / "registry") as kubelet, node.plugin(metadata=metadata):
        connection = await kubelet.next_registration()
        first = dict((await connection.prepare([configured, plain])).claims)
        assert [first[u].error for u in (UID, "uid-2")] == ["", ""]
    as_before_format_5(node)
    path = checkpoint_path(node.root / "state", DRIVER)
    assert path.exists() is not metadata
    node.claims.claims.clear()  # gone from the API server: answered from the records alone
    async with FakeDraKubelet(node.root / "registry") as kubelet, node.plugin(metadata=metadata):
        connection = await kubelet.next_registration()
        state = orjson.loads(path.read_bytes())  # written at start
        assert (state["version"], sorted(state["claims"])) == (5, sorted([UID, "uid-2"]))
        assert dict((await connection.prepare([configured, plain])).claims) == first
    # The claim records in the owner records are needed no more: without them, the same.
    for owner in node.spec_dir.glob(f".*{OWNER_SUFFIX}"):
        record = orjson.loads(owner.read_bytes())
        record.pop("payload", None)
        owner.write_bytes(orjson.dumps(record))
    async with FakeDraKubelet(node.root / "registry") as kubelet, node.plugin(metadata=metadata):
        connection = await kubelet.next_registration()
        assert dict((await connection.prepare([configured, plain])).claims) == first
        unprepared = (await connection.unprepare([configured, plain])).claims
        assert [unprepared[u].error for u in (UID, "uid-2")] == ["", ""]
        assert node.spec_files() == ["example.com-fpga.json"]
        assert checkpoint_claims(node) == []


async def test_an_older_agents_claim_records_of_another_boot_are_void(
    node: Node, caplog: pytest.LogCaptureFixture
) -> None:
    # A spec folder that outlived a reboot, with an older cdi-gen's claim records in it.
    claim = node.claims.add("c1", UID, result("fpga-0"), config=[entry(0, params())])
    async with FakeDraKubelet(node.root / "registry") as kubelet, node.plugin():
        connection = await kubelet.next_registration()
        first = (await connection.prepare([claim])).claims[UID]
        assert first.error == ""
    other = "0b0b0b0b-5555-4666-8777-888888888888"
    as_before_format_5(node, boot=other)
    with caplog.at_level(logging.WARNING, "cdi_gen.dra.driver.claimfiles"):
        async with FakeDraKubelet(node.root / "registry") as kubelet, node.plugin():
            connection = await kubelet.next_registration()
            assert node.spec_files() == ["example.com-fpga.json"]  # no prepared claim's
            assert checkpoint_claims(node) == []
            assert (await connection.prepare([claim])).claims[UID] == first  # read anew
    [line] = [r.getMessage() for r in caplog.records if "void" in r.getMessage()]
    assert f"1 claims recorded with their specs in boot {other}, not this boot" in line
    assert f"claim default/c1 (uid '{UID}')" in line


async def test_a_configured_claim_mounts_the_device_metadata_of_kep_5304(node: Node) -> None:
    claim = node.claims.add(
        "c1",
        UID,
        result("fpga-0", "fpga/small"),
        config=[entry(0, params())],
        pod_claim_name="accel",
    )
    async with FakeDraKubelet(node.root / "registry") as kubelet, node.plugin():
        connection = await kubelet.next_registration()
        assert (await connection.prepare([claim])).claims[UID].error == ""
        host = node.metadata_dir / f"{UID}_fpga.json"
        [device] = node.claim_spec()["devices"]
        assert device["containerEdits"]["mounts"] == [
            {
                "hostPath": str(host),
                "containerPath": "/var/run/kubernetes.io/dra-device-attributes/"
                f"resourceclaimtemplates/accel/fpga/{DRIVER}-metadata.json",
                "options": ["ro", "bind"],
            }
        ]
        beta, alpha = (orjson.loads(line) for line in host.read_bytes().splitlines())
        assert beta == {
            "kind": "DeviceMetadata",
            "apiVersion": "metadata.resource.k8s.io/v1beta1",
            "metadata": {"name": "c1", "namespace": "default", "uid": UID, "generation": 1},
            "podClaimName": "accel",
            "requests": [
                {
                    "name": "fpga/small",
                    "devices": [
                        {
                            "driver": DRIVER,
                            "pool": POOL,
                            "name": "fpga-0",
                            "attributes": {
                                "class": {"string": "fpga"},
                                "numaNode": {"int": 0},
                                "shared": {"bool": False},
                            },
                        }
                    ],
                }
            ],
        }
        assert alpha == {**beta, "apiVersion": "metadata.resource.k8s.io/v1alpha1"}
        assert (await connection.unprepare([claim])).claims[UID].error == ""
        assert list(node.metadata_dir.iterdir()) == []


async def test_a_plain_claim_gets_its_metadata_through_a_metadata_spec(node: Node) -> None:
    claim = node.claims.add("c1", UID, result("fpga-0", "a"), result("fpga-1", "a"))
    meta_spec = f"example.com-fpga@{UID}.metadata.json"
    async with FakeDraKubelet(node.root / "registry") as kubelet, node.plugin():
        connection = await kubelet.next_registration()
        answer = (await connection.prepare([claim])).claims[UID]
        assert answer.error == ""
        # The class's names stay; the request's first device carries the metadata mount.
        ids = [list(d.cdi_device_ids) for d in answer.devices]
        carrier = f"claim-{UID}-0-metadata"
        assert ids == [
            ["example.com/fpga=0", f"example.com/fpga={carrier}"],
            ["example.com/fpga=1"],
        ]
        assert node.spec_files() == ["example.com-fpga.json", meta_spec]
        spec = orjson.loads((node.spec_dir / meta_spec).read_bytes())
        host = node.metadata_dir / f"{UID}_a.json"
        assert spec["devices"] == [
            {
                "name": carrier,
                "containerEdits": {
                    "mounts": [
                        {
                            "hostPath": str(host),
                            "containerPath": "/var/run/kubernetes.io/dra-device-attributes/"
                            f"resourceclaims/c1/a/{DRIVER}-metadata.json",
                            "options": ["ro", "bind"],
                        }
                    ]
                },
            }
        ]
        assert "containerEdits" not in spec
        beta, _ = (orjson.loads(line) for line in host.read_bytes().splitlines())
        assert [d["name"] for d in beta["requests"][0]["devices"]] == ["fpga-0", "fpga-1"]
    # Read back at start from the checkpoint, answered without the API server.
    del node.claims.claims["c1"]
    async with FakeDraKubelet(node.root / "registry") as kubelet, node.plugin():
        connection = await kubelet.next_registration()
        again = (await connection.prepare([claim])).claims[UID]
        assert [list(d.cdi_device_ids) for d in again.devices] == ids
        assert (await connection.unprepare([claim])).claims[UID].error == ""
        assert node.spec_files() == ["example.com-fpga.json"]
        assert list(node.metadata_dir.iterdir()) == []


async def test_an_emptied_metadata_file_makes_the_claim_prepared_anew(node: Node) -> None:
    # Written without fsync: a power loss on a node whose /var/run is on disk may empty it.
    claim = node.claims.add("c1", UID, result("fpga-0"), config=[entry(0, params())])
    async with FakeDraKubelet(node.root / "registry") as kubelet, node.plugin():
        connection = await kubelet.next_registration()
        assert (await connection.prepare([claim])).claims[UID].error == ""
    metadata = node.metadata_dir / f"{UID}_fpga.json"
    metadata.write_bytes(b"")
    async with FakeDraKubelet(node.root / "registry") as kubelet, node.plugin():
        connection = await kubelet.next_registration()
        assert node.spec_files() == ["example.com-fpga.json"]  # forgotten, its spec removed
        assert (await connection.prepare([claim])).claims[UID].error == ""
        assert orjson.loads(metadata.read_bytes().splitlines()[0])["kind"] == "DeviceMetadata"


async def test_a_changed_class_spec_is_what_the_next_claim_starts_from(node: Node) -> None:
    first = node.claims.add("c1", UID, result("fpga-0"), config=[entry(0, params())])
    second = node.claims.add("c2", "uid-2", result("fpga-1"), config=[entry(0, params())])
    async with FakeDraKubelet(node.root / "registry") as kubelet, node.plugin():
        connection = await kubelet.next_registration()
        assert (await connection.prepare([first])).claims[UID].error == ""
        # The agent rewrites the class's spec (a udev change, a new config).
        edits = {"deviceNodes": [{"path": "/dev/zero"}], "env": ["MODE=changed"]}
        doc = assemble("example.com/fpga", [build_entry("0", edits), build_entry("1", edits)])
        node.specs.sync(node.spec_dir, "example.com", "fpga", dump_document(doc), instance=None)
        assert (await connection.prepare([second])).claims["uid-2"].error == ""
        spec = orjson.loads((node.spec_dir / "example.com-fpga@uid-2.json").read_bytes())
        [device] = spec["devices"]
        assert device["containerEdits"]["env"] == ["MODE=changed"]
        assert device["containerEdits"]["deviceNodes"] == [{"path": "/dev/zero"}]


async def test_a_claim_the_checkpoint_cannot_record_leaves_no_spec_behind(node: Node) -> None:
    # Every claim, with specs of its own or not, is recorded in the checkpoint: when it
    # cannot be written, each is refused naming it, and the configured one's spec goes.
    configured = node.claims.add("c1", UID, result("fpga-0"), config=[entry(0, params())])
    plain = node.claims.add("c2", "uid-2", result("fpga-1"))
    async with FakeDraKubelet(node.root / "registry") as kubelet, node.plugin(metadata=False):
        connection = await kubelet.next_registration()
        # The checkpoint cannot be written: a file where its folder should be.
        state = node.root / "state"
        if state.exists():
            shutil.rmtree(state)  # holds the state lock's file too, open already
        state.write_bytes(b"")
        answers = (await connection.prepare([configured, plain])).claims
        for uid in (UID, "uid-2"):
            assert "cannot write the DRA checkpoint" in answers[uid].error, answers[uid]
        assert node.spec_files() == ["example.com-fpga.json"]


async def test_a_claim_whose_spec_fails_leaves_no_record_behind(node: Node) -> None:
    claim = node.claims.add("c1", UID, result("fpga-0"), config=[entry(0, params())])
    async with FakeDraKubelet(node.root / "registry") as kubelet, node.plugin():
        connection = await kubelet.next_registration()
        (node.spec_dir / "example.com-fpga.json").unlink()  # what the claim's spec starts from
        answer = (await connection.prepare([claim])).claims[UID]
        assert "its own CDI spec cannot be written" in answer.error
        assert "the class's spec is missing" in answer.error
        path = checkpoint_path(node.root / "state", DRIVER)
        assert not path.exists() or orjson.loads(path.read_bytes())["claims"] == {}
        assert list(node.metadata_dir.iterdir()) == []
        # Nothing of it is left to get in the way: once the class's spec is back, it prepares.
        node.write_class_spec()
        assert (await connection.prepare([claim])).claims[UID].error == ""


async def test_a_class_spec_someone_else_replaced_is_never_built_on(node: Node) -> None:
    # The claim's spec is built from what the agent wrote, in memory; the file at the
    # class's name must still be that write's, or the claim is refused.
    claim = node.claims.add("c1", UID, result("fpga-0"), config=[entry(0, params())])
    async with FakeDraKubelet(node.root / "registry") as kubelet, node.plugin():
        connection = await kubelet.next_registration()
        foreign = {"deviceNodes": [{"path": "/dev/mem"}], "env": ["MODE=foreign"]}
        doc = assemble("example.com/fpga", [build_entry("0", foreign), build_entry("1", foreign)])
        planted = node.spec_dir / ".planted"
        planted.write_bytes(dump_document(doc))
        planted.rename(node.spec_dir / "example.com-fpga.json")
        answer = (await connection.prepare([claim])).claims[UID]
        assert "its own CDI spec cannot be written" in answer.error
        assert "is not the file this agent wrote" in answer.error
        assert node.spec_files() == ["example.com-fpga.json"]
        # Once the foreign file is gone and the agent writes its spec again, the claim
        # starts from that.
        (node.spec_dir / "example.com-fpga.json").unlink()
        node.write_class_spec()
        assert (await connection.prepare([claim])).claims[UID].error == ""
        env = node.claim_spec()["devices"][0]["containerEdits"]["env"]
        assert "MODE=class" in env and "MODE=foreign" not in env
