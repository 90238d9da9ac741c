"""A node reboot voids what the DRA driver prepared before it (issue 54, item 6).

Each run of the driver is a process of its own in a private mount namespace, where a file
bound over ``/proc/sys/kernel/random/boot_id`` gives it the boot ID the test chooses: the
DRA driver (the agent's ``PoolPreparer`` and ``ClaimFiles``) serves a kubelet stand-in over
real gRPC on unix sockets. The first run, in boot A, prepares three claims (a plain one, a
configured one with a spec of its own, and one whose pod the reboot ends). The node
reboots: the second run is in boot B, with the state folder kept and the spec folder
emptied (a tmpfs mounted in the first run's namespace, gone with it), or kept (a spec
folder on disk). There, the third claim's unprepare succeeds and leaves nothing of it; the
kubelet prepares the other two again, and each is read from the API server anew (no record
of boot A is answered) and gets CDI devices whose specs exist, its own written after the
boot; the checkpoint of boot A (every prepared claim's record) is kept aside; then both
unprepare cleanly. Three setups: the agent's (device metadata: every claim has a spec of its
own), without metadata (plain claims keep their class's spec), and the agent's with a spec
folder on disk (the specs of boot A are still there, and go as no prepared claim's).
"""

from __future__ import annotations

import asyncio
import json
import logging
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import REPO
from tests.mountns import reported, run_private

pytestmark = pytest.mark.timeout(120)

DRIVER, POOL = "cdi-gen.example.com", "node-a"
BOOT_A = "0a0a0a0a-1111-4222-8333-444444444444"
BOOT_B = "0b0b0b0b-5555-4666-8777-888888888888"
#: Claim name -> (UID, device, configured).
CLAIMS = {
    "plain": ("11111111-aaaa-4aaa-8aaa-111111111111", "fpga-0", False),
    "configured": ("22222222-bbbb-4bbb-8bbb-222222222222", "fpga-1", True),
    "ended": ("33333333-cccc-4ccc-8ccc-333333333333", "fpga-2", False),
}
MODES = ("metadata-tmpfs", "plain-tmpfs", "metadata-disk")


# -- one run of the driver, in its own mount namespace (python -m tests.integration...) -----


async def _serve(root: Path, mode: str, steps: Sequence[tuple[str, list[str]]]) -> dict[str, Any]:
    from cdi_gen.cdi.builder import assemble, build_entry
    from cdi_gen.cdi.codec import dump_document
    from cdi_gen.cdi.store import SpecStore
    from cdi_gen.dra.driver.claimfiles import ClaimFiles
    from cdi_gen.dra.driver.preparer import PoolPreparer
    from cdi_gen.dra.plugin.pool import DevicePool
    from cdi_gen.dra.plugin.server import DraPlugin
    from cdi_gen.model import AllocatedDevice, ClaimView, ConfigEntry, PoolDevice
    from tests.fakes.drakubelet import FakeDraKubelet

    spec_dir = root / "cdi"
    store = SpecStore()
    entries = [build_entry(str(i), {"deviceNodes": [{"path": "/dev/null"}]}) for i in range(3)]
    # What the agent does at every start: the class's spec written from what it finds.
    data = dump_document(assemble("example.com/fpga", entries))
    store.sync(spec_dir, "example.com", "fpga", data, instance=None)
    pool = DevicePool()
    pool.publish(
        "fpga",
        [
            PoolDevice(f"fpga-{i}", f"example.com/fpga={i}", "fpga", f"/sys/f{i}", attributes={})
            for i in range(3)
        ],
    )
    params = {"apiVersion": "cdi-gen.io/v1alpha1", "kind": "DeviceConfig", "env": {"M": "c"}}
    views = {
        name: ClaimView(
            "default",
            name,
            uid,
            (AllocatedDevice("fpga", DRIVER, POOL, device),),
            (ConfigEntry("FromClaim", DRIVER, (), params, 0),) if configured else (),
        )
        for name, (uid, device, configured) in CLAIMS.items()
    }
    reads: list[str] = []

    class Claims:
        def read_claims(self, refs: Sequence[tuple[str, str]], timeout: float) -> list[ClaimView]:
            reads.extend(name for _, name in refs)
            return [views[name] for _, name in refs]

    metadata = root / "plugins" / DRIVER / "dra-device-metadata"
    preparer = PoolPreparer(
        DRIVER,
        pool,
        pool_name=POOL,
        cdi_kinds=["example.com/fpga"],
        state_dir=root / "state",
        claim_files=ClaimFiles(
            spec_dir,
            "example.com",
            store=store,
            driver=DRIVER,
            metadata_dir=None if mode.startswith("plain") else metadata,
        ),
    )
    plugin = DraPlugin(
        DRIVER,
        pool,
        preparer,
        claims=Claims(),
        pool_name=POOL,
        registry_dir=root / "registry",
        plugins_dir=root / "plugins",
        watch_interval=0.02,
        max_backoff=0.2,
        register_timeout=2.0,
    )
    done: list[dict[str, Any]] = []
    async with FakeDraKubelet(root / "registry") as kubelet, plugin:
        connection = await kubelet.next_registration()
        for call, names in steps:
            refs = [("default", name, CLAIMS[name][0]) for name in names]
            if call == "prepare":
                response = await connection.prepare(refs)
                answers = {
                    uid: {"error": a.error, "cdi": [i for d in a.devices for i in d.cdi_device_ids]}
                    for uid, a in response.claims.items()
                }
            else:
                response = await connection.unprepare(refs)
                answers = {uid: {"error": a.error} for uid, a in response.claims.items()}
            done.append({"answers": answers, "reads": list(reads), **_listing(root)})
    return done


def _files(folder: Path) -> dict[str, int]:
    return {p.name: p.stat().st_mtime_ns for p in folder.iterdir()} if folder.exists() else {}


def _listing(root: Path) -> dict[str, Any]:
    """The spec folder's files (name: mtime), the devices of its specs, the metadata files
    and the state folder's files."""
    files = _files(root / "cdi")
    specs = {n: json.loads((root / "cdi" / n).read_text()) for n in files if n.endswith(".json")}
    return {
        "files": files,
        "devices": {name: [d["name"] for d in doc["devices"]] for name, doc in specs.items()},
        "metadata": sorted(_files(root / "plugins" / DRIVER / "dra-device-metadata")),
        "state": sorted(_files(root / "state")),
    }


def _run(root: Path, boot_id: str, mode: str, steps: list[tuple[str, list[str]]]) -> None:
    """One run: the boot ID bound over the kernel's, the spec folder a tmpfs of this
    namespace (or the test's disk), the driver served; what it saw printed as JSON."""
    boot_file = root / f"boot-{boot_id}"
    boot_file.write_text(boot_id + "\n")
    subprocess.run(
        ["mount", "--bind", str(boot_file), "/proc/sys/kernel/random/boot_id"], check=True
    )
    (root / "cdi").mkdir(exist_ok=True)
    if mode.endswith("tmpfs"):
        subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(root / "cdi")], check=True
        )
    lines: list[str] = []

    class Lines(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            lines.append(record.getMessage())

    logging.getLogger("cdi_gen").addHandler(Lines(logging.WARNING))
    # The file's mtime, of the kernel's coarse clock as every file's: when the run started.
    started = boot_file.stat().st_mtime_ns
    seen = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    steps_done = asyncio.run(_serve(root, mode, steps))
    out = {"boot": seen, "started": started, "steps": steps_done, "warnings": lines}
    print("RUN " + json.dumps(out))


# -- the test ----------------------------------------------------------------------------


def _boot(root: Path, boot_id: str, mode: str, steps: list[tuple[str, list[str]]]) -> Any:
    """Run the driver once in a private mount namespace, as in boot ``boot_id``."""
    args = ["-m", "tests.integration.test_dra_reboot", str(root), boot_id, mode, json.dumps(steps)]
    run = reported(run_private(args, cwd=REPO), "RUN ")
    assert run["boot"] == boot_id
    return run


def _spec_of(step: Any, cdi_name: str) -> str:
    """The spec file in the spec folder after ``step`` that defines ``cdi_name``."""
    kind, _, device = cdi_name.partition("=")
    vendor, _, cls = kind.partition("/")
    found = [
        name
        for name, devices in step["devices"].items()
        if name.startswith(f"{vendor}-{cls}") and device in devices
    ]
    assert len(found) == 1, (cdi_name, step["devices"])
    return found[0]


@pytest.mark.parametrize("mode", MODES)
def test_a_reboot_voids_what_was_prepared_before_it(short_dir: Path, mode: str) -> None:
    (short_dir / "registry").mkdir()
    first = _boot(short_dir, BOOT_A, mode, [("prepare", list(CLAIMS))])
    [step] = first["steps"]
    assert all(a["error"] == "" for a in step["answers"].values()), step
    assert sorted(step["reads"]) == sorted(CLAIMS)
    state = short_dir / "state" / f"dra-{DRIVER}.json"
    before = state.read_bytes()  # every claim's record, in every setup
    assert sorted(json.loads(before)["claims"]) == sorted(uid for uid, _, _ in CLAIMS.values())

    # The reboot: another boot ID; the tmpfs spec folder went with the first namespace.
    plain, configured, ended = (CLAIMS[n][0] for n in ("plain", "configured", "ended"))
    second = _boot(
        short_dir,
        BOOT_B,
        mode,
        [
            ("unprepare", ["ended"]),
            ("prepare", ["plain", "configured"]),
            ("unprepare", ["plain", "configured"]),
        ],
    )
    unprepared, prepared, done = second["steps"]
    # The claim whose pod the reboot ended: unprepared, nothing of it left.
    assert unprepared["answers"] == {ended: {"error": ""}}
    for step in (unprepared, prepared, done):
        assert not [n for n in step["files"] if ended in n], step["files"]
        assert not [n for n in step["metadata"] if ended in n], step["metadata"]
    # Each claim read anew (no record of boot A answered), its devices in specs that exist,
    # its own written after the boot.
    assert all(a["error"] == "" for a in prepared["answers"].values()), prepared
    assert sorted(prepared["reads"]) == ["configured", "plain"], prepared
    for uid in (plain, configured):
        for cdi_name in prepared["answers"][uid]["cdi"]:
            spec = _spec_of(prepared, cdi_name)
            if "@" in spec:  # a spec of the claim's own
                assert prepared["files"][spec] >= second["started"], (spec, prepared)
    assert any("@" in _spec_of(prepared, n) for n in prepared["answers"][configured]["cdi"])
    assert done["answers"] == {plain: {"error": ""}, configured: {"error": ""}}
    assert not [n for n in done["files"] if "@" in n], done["files"]  # the class's spec only
    assert done["metadata"] == []
    # The checkpoint of boot A kept aside as it was, with one line; the file now of boot B.
    void = [w for w in second["warnings"] if "void" in w]
    assert json.loads(before)["bootId"] == BOOT_A
    assert (state.parent / f"{state.name}.void-{BOOT_A}").read_bytes() == before
    assert json.loads(state.read_bytes())["bootId"] == BOOT_B
    assert len(void) == 1 and BOOT_A in void[0], void


if __name__ == "__main__":
    _run(Path(sys.argv[1]), sys.argv[2], sys.argv[3], json.loads(sys.argv[4]))
