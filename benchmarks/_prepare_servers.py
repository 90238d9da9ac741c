"""The servers bench_prepare.py measures, each run in a process of its own.

    python benchmarks/_prepare_servers.py MODE FOLDER

``MODE`` is one of

* ``floor``: a bare grpcio server answering ``NodePrepareResources`` with canned response
  bytes (no protobuf, no logic), on ``FOLDER/floor.sock``: the floor of the gRPC stack;
* ``plugin``: cdi-gen's DRA driver serving ``FOLDER/plugins/<driver>/dra.sock``, with a pool
  of ``POOL_DEVICES`` devices, an in-memory claim reader (claim ``c-N`` has uid ``u-N`` and
  one device, ``fpga-0`` for ``c-0`` alone; claim ``k-N`` the same with uid ``k-uid-N`` and a
  configuration of the driver, so it gets a spec of its own) and its checkpoint in
  ``FOLDER/state``; the class's spec, and the claims' own, in ``FOLDER/cdi``, every claim's
  CDI names checked against that folder as the agent checks them (a ``SpecCache``).

Both use the same thread pool size. Each prints ``ready`` once it serves and stops on
``quit`` or at the end of its input.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import sys
from pathlib import Path

from _serverproc import commands, ready, wait_for_quit

DRIVER = "cdi-gen.example.com"
POOL = "bench-node"
POOL_DEVICES = 100
PREPARE = "/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodePrepareResources"
#: Thread pool of the floor: the same size as the plugin's own.
WORKERS = 16  # cdi_gen.kubelet.transport.WORKERS


def canned_response() -> bytes:
    """What the plugin answers for claim c-0: the floor sends these bytes as they are."""
    from cdi_gen._proto.dra.v1 import api_pb2

    response = api_pb2.NodePrepareResourcesResponse()
    response.claims["u-0"].devices.add(
        request_names=["fpga"],
        pool_name=POOL,
        device_name="fpga-0",
        # The class's device, and the one carrying the request's device metadata mount.
        cdi_device_ids=["example.com/fpga=0", "example.com/fpga=claim-u-0-0-metadata"],
    )
    return response.SerializeToString()


def _serve_floor(folder: Path) -> None:
    import grpc

    answer = canned_response()
    server = grpc.server(concurrent.futures.ThreadPoolExecutor(WORKERS))
    handler = grpc.method_handlers_generic_handler(
        "k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin",
        {"NodePrepareResources": grpc.unary_unary_rpc_method_handler(lambda r, c: answer)},
    )
    server.add_generic_rpc_handlers((handler,))
    server.add_insecure_port(f"unix://{folder / 'floor.sock'}")
    server.start()
    ready()
    wait_for_quit()
    server.stop(0)


#: The configuration of every ``k-N`` claim: the issue's non-root example.
CONFIG = {
    "apiVersion": "cdi-gen.io/v1alpha1",
    "kind": "DeviceConfig",
    "deviceNodes": {"uid": 1000, "gid": 1000, "fileMode": 0o600},
    "env": {"FPGA_USER": "1000"},
}


class _Claims:
    """Claims made up on the fly, as an API server that knows every ``c-N`` and ``k-N``
    would answer."""

    def read_claims(self, refs: list[tuple[str, str]], timeout: float) -> list[object]:
        from cdi_gen.model import AllocatedDevice, ClaimView, ConfigEntry

        claims: list[object] = []
        for namespace, name in refs:
            configured = name.startswith("k-")
            number = int(name.removeprefix("k-" if configured else "c-"))
            # fpga-0 is c-0's, the claim prepared once and asked again: the others never take
            # it (it is held exclusively while c-0 is prepared).
            device = f"fpga-{1 + (number - 1) % (POOL_DEVICES - 1) if number else 0}"
            result = AllocatedDevice("fpga", DRIVER, POOL, device)
            if configured:
                entry = ConfigEntry("FromClaim", DRIVER, (), CONFIG, 0)
                view = ClaimView(namespace, name, f"k-uid-{number}", (result,), (entry,))
            else:
                view = ClaimView(namespace, name, f"u-{number}", (result,))
            claims.append(view)
        return claims


async def _serve_plugin(folder: Path) -> None:
    from cdi_gen.cdi.builder import assemble, build_entry
    from cdi_gen.cdi.codec import dump_document
    from cdi_gen.cdi.registry import SpecCache
    from cdi_gen.cdi.store import SpecStore
    from cdi_gen.dra.driver.claimfiles import ClaimFiles
    from cdi_gen.dra.driver.preparer import PoolPreparer
    from cdi_gen.dra.plugin.pool import DevicePool
    from cdi_gen.dra.plugin.server import DraPlugin
    from cdi_gen.model import PoolDevice

    # The class's spec as the agent writes it: what a configured claim's spec starts from.
    # Mode 0660 without an owner (the container's user): the claims' uid 1000 and 0600
    # narrow it, checked without reading a host node (these nodes exist nowhere).
    entries = [
        build_entry(
            str(i),
            {"deviceNodes": [{"path": f"/dev/fpga{i}", "fileMode": 0o660}], "env": [f"FPGA={i}"]},
        )
        for i in range(POOL_DEVICES)
    ]
    spec_dir = folder / "cdi"
    resolver = SpecCache([spec_dir])  # the runtime's view, as the agent checks names
    specs = SpecStore(resolver)  # the agent's runners write through it; the view learns

    data = dump_document(assemble("example.com/fpga", entries))
    specs.sync(spec_dir, "example.com", "fpga", data, instance=None)

    pool = DevicePool()
    pool.publish(
        "fpga",
        [
            PoolDevice(f"fpga-{i}", f"example.com/fpga={i}", "fpga", f"/sys/devices/fpga{i}")
            for i in range(POOL_DEVICES)
        ],
    )
    (folder / "registry").mkdir(exist_ok=True)
    preparer = PoolPreparer(
        DRIVER,
        pool,
        pool_name=POOL,
        cdi_kinds=["example.com/fpga"],
        state_dir=folder / "state",
        resolver=resolver,
        claim_files=ClaimFiles(
            spec_dir,
            "example.com",
            store=specs,
            driver=DRIVER,
            metadata_dir=folder / "plugins" / DRIVER / "dra-device-metadata",
        ),
    )
    plugin = DraPlugin(
        DRIVER,
        pool,
        preparer,
        claims=_Claims(),  # type: ignore[arg-type]
        pool_name=POOL,
        registry_dir=folder / "registry",
        plugins_dir=folder / "plugins",
    )
    await plugin.start()
    queue = commands(asyncio.get_running_loop())
    ready()
    try:
        while await queue.get() != "quit":
            pass
    finally:
        await plugin.stop(grace=0)


def main() -> None:
    mode, folder = sys.argv[1], Path(sys.argv[2])
    if mode == "plugin":
        from cdi_gen.kubelet import apply_grpc_experiments

        apply_grpc_experiments()  # as `cdi-gen run` does, before grpc loads
        asyncio.run(_serve_plugin(folder))
    elif mode == "floor":
        _serve_floor(folder)
    else:
        sys.exit(f"unknown mode {mode!r}: floor or plugin")


if __name__ == "__main__":
    main()
