"""DRA driver speed: NodePrepareResources latency against the floor of the gRPC stack.

Two servers run side by side, each in its own process on a unix socket with the same thread
pool size (see ``_prepare_servers.py``):

* the floor: a bare grpcio server answering NodePrepareResources with canned response bytes;
* cdi-gen's DRA driver (``DraPlugin``) with an in-memory claim reader and its checkpoint in a
  temporary folder under /tmp.

The client (this process) sends one claim with one device per call, as serialized bytes, so
its own work is the same for both. Three calls are timed, in alternating batches so that
noise from other processes hits all alike:

* the floor;
* a claim prepared before, answered from the checkpoint (what the kubelet gets when it asks
  again, e.g. after a restart);
* a claim never seen: the claim read (in memory here; the API server's GET comes on top in
  a cluster), the checks against the pool, and its record written before the answer in the
  checkpoint, the one store (replaced atomically, not fsynced: a power loss is a reboot,
  which voids it), beside its device metadata (with device metadata for every claim, its
  metadata spec and owner record on the spec folder's tmpfs, and its metadata file). It is
  unprepared after each timed call, untimed. Its floor adds the cost of the same checkpoint
  write done bare in this process (the file as the driver wrote it, temporary file, write,
  rename, in the same folder, not fsynced);
* a new claim with configuration of the driver: its own spec (the class's edits with the
  claim's owner, mode and env, written durably) and its owner record, its device metadata
  file (atomically, not fsynced) and its record in the checkpoint. The spec folder is on a
  tmpfs, as /var/run/cdi is on a node (here /dev/shm), so the spec's fsyncs cost what they
  cost there. Same floor, as the issue's target has it. An informative row sets it against
  the floor plus every write it makes, each done bare in the same folder (the claim's spec
  and its owner record durably on the tmpfs, the metadata file and the checkpoint without
  fsync): what is left is cdi-gen's own work.

    python benchmarks/bench_prepare.py [--quick]
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import grpc
from _prepare_servers import DRIVER, POOL, PREPARE, canned_response
from _serverproc import ServerProcess
from _table import Row, percentile, print_table, timed

from cdi_gen._proto.dra.v1 import api_pb2
from cdi_gen.cdi.ownerrecords import OWNER_SUFFIX

HERE = Path(__file__).resolve().parent
UNPREPARE = "/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodeUnprepareResources"
REPEAT_TARGET = 1.25
NEW_TARGET = 1.25


def _server(mode: str, folder: Path) -> ServerProcess:
    script = HERE / "_prepare_servers.py"
    return ServerProcess(mode, script, [mode, str(folder)], folder / f"{mode}.log")


def _request(number: int, configured: bool = False) -> bytes:
    if configured:
        claim = api_pb2.Claim(namespace="default", name=f"k-{number}", uid=f"k-uid-{number}")
    else:
        claim = api_pb2.Claim(namespace="default", name=f"c-{number}", uid=f"u-{number}")
    return api_pb2.NodePrepareResourcesRequest(claims=[claim]).SerializeToString()


def _store_write(folder: Path, data: bytes) -> None:
    """The bare replacement of the checkpoint as the driver makes it (not fsynced, 0600):
    the floor of a claim's record."""
    _replace(folder, "floor.json", data, durable=False, mode=0o600)


def _replace(folder: Path, name: str, data: bytes, *, durable: bool, mode: int = 0o644) -> None:
    """A bare replacement of ``folder/name`` with ``mode``: temporary file, write, rename;
    with ``durable``, fsyncs of the file and the folder."""
    tmp = folder / f".{name}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        os.write(fd, data)
        if durable:
            os.fsync(fd)
    finally:
        os.close(fd)
    os.rename(tmp, folder / name)
    if durable:
        dir_fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)


def _configured_writes(folder: Path, specs: Path, files: dict[str, bytes]) -> None:
    """Every write a configured claim's prepare makes, bare and in its folder: the claim's
    spec and its owner record durably on the spec folder's tmpfs, the device metadata file
    and the checkpoint (not fsynced). Undone untimed, as unprepare does."""
    _replace(specs, "claim.json", files["spec"], durable=True)
    _replace(specs, f".claim.json{OWNER_SUFFIX}", files["owner"], durable=True)
    _replace(folder, "metadata.json", files["metadata"], durable=False)
    _store_write(folder / "state", files["checkpoint"])


def _latencies(folder: Path, rounds: int, per_round: int) -> dict[str, list[float]]:
    floor_channel = grpc.insecure_channel(f"unix://{folder / 'floor.sock'}")
    plugin_channel = grpc.insecure_channel(f"unix://{folder / 'plugins' / DRIVER / 'dra.sock'}")
    try:
        floor = floor_channel.unary_unary(
            PREPARE, request_serializer=None, response_deserializer=None
        )
        prepare = plugin_channel.unary_unary(
            PREPARE, request_serializer=None, response_deserializer=None
        )
        unprepare = plugin_channel.unary_unary(
            UNPREPARE, request_serializer=None, response_deserializer=None
        )
        known = _request(0)
        answer = prepare(known)
        # The floor answers exactly what the plugin answers: same bytes on the wire.
        assert answer == canned_response(), api_pb2.NodePrepareResourcesResponse.FromString(answer)
        assert floor(known) == answer
        counter = iter(range(1, 1 << 30))

        def fresh(configured: bool = False) -> None:
            number = next(counter)
            request = _request(number, configured)
            start = time.perf_counter()
            reply = api_pb2.NodePrepareResourcesResponse.FromString(prepare(request))
            samples["configured" if configured else "new"].append(time.perf_counter() - start)
            claim = reply.claims[f"k-uid-{number}" if configured else f"u-{number}"]
            assert claim.error == "" and claim.devices[0].pool_name == POOL, claim
            assert ("=claim-" in claim.devices[0].cdi_device_ids[0]) == configured, claim
            unprepare(request)

        state = folder / "state"
        state.mkdir(exist_ok=True)
        files = _written_files(folder, prepare, unprepare, next(counter), configured=True)
        # The checkpoint as a new claim's prepare writes it: the one it holds, and c-0.
        record = _written_files(folder, prepare, unprepare, next(counter))["checkpoint"]

        def bare_writes() -> None:
            start = time.perf_counter()
            _configured_writes(folder, folder / "cdi", files)
            samples["writes"].append(time.perf_counter() - start)
            # What unprepare does, untimed: the next claim's files are new ones.
            for name in ("claim.json", f".claim.json{OWNER_SUFFIX}"):
                (folder / "cdi" / name).unlink()
            (folder / "metadata.json").unlink()

        calls: dict[str, Callable[[], object]] = {
            "floor": lambda: floor(known),
            "repeat": lambda: prepare(known),
            "write": lambda: _store_write(state, record),
        }
        samples: dict[str, list[float]] = {
            "floor": [],
            "repeat": [],
            "write": [],
            "writes": [],
            "new": [],
            "configured": [],
        }
        for call in calls.values():  # warm up connections and code paths
            timed(call, 200)
        for _ in range(50):
            fresh()
            fresh(configured=True)
            bare_writes()
        for key in ("new", "configured", "writes"):
            samples[key].clear()
        for _ in range(rounds):
            for key, call in calls.items():
                samples[key] += timed(call, per_round)
            for _ in range(per_round // 4):
                fresh()
                fresh(configured=True)
                bare_writes()
        return samples
    finally:
        floor_channel.close()
        plugin_channel.close()


def _written_files(
    folder: Path,
    prepare: Callable[[bytes], bytes],
    unprepare: Callable[[bytes], bytes],
    number: int,
    configured: bool = False,
) -> dict[str, bytes]:
    """The files one new claim's prepare writes, as the plugin wrote them (a configured
    claim's spec, a plain one's metadata spec)."""
    request = _request(number, configured)
    prepare(request)
    uid = f"k-uid-{number}" if configured else f"u-{number}"
    # A transient spec's name (see writer.transient_filename).
    tag = f"@{uid}.json" if configured else f"@{uid}.metadata.json"
    specs = folder / "cdi"
    metadata = folder / "plugins" / DRIVER / "dra-device-metadata"
    found = {
        "spec": next(specs.glob(f"*{tag}")).read_bytes(),
        "owner": next(specs.glob(f".*{tag}{OWNER_SUFFIX}")).read_bytes(),
        "metadata": next(metadata.glob(f"{uid}_*.json")).read_bytes(),
        "checkpoint": (folder / "state" / f"dra-{DRIVER}.json").read_bytes(),
    }
    unprepare(request)
    return found


def _bench(quick: bool) -> list[Row]:
    rounds, per_round = (5, 100) if quick else (20, 250)
    folder = Path(tempfile.mkdtemp(dir="/tmp", prefix="cg"))
    specs = Path(tempfile.mkdtemp(dir="/dev/shm", prefix="cg"))  # /var/run/cdi's tmpfs
    (folder / "cdi").symlink_to(specs)
    servers: list[ServerProcess] = []
    try:
        servers.append(_server("floor", folder))
        servers.append(_server("plugin", folder))
        samples = _latencies(folder, rounds, per_round)
    except Exception:
        for server in servers:
            print(f"--- {server.name} stderr:\n{server.errors()}", file=sys.stderr)
        raise
    finally:
        for server in servers:
            server.stop()
        shutil.rmtree(folder, ignore_errors=True)
        shutil.rmtree(specs, ignore_errors=True)
    return _rows(samples)


def _rows(samples: dict[str, list[float]]) -> list[Row]:
    p50 = {key: percentile(values, 50) for key, values in samples.items()}

    def ms(value: float) -> str:
        return f"{value * 1e3:.3f} ms"

    def vs_floor(key: str) -> str:
        return f"{ms(p50[key])} ({p50[key] / p50['floor']:.2f}x floor)"

    durable = p50["floor"] + p50["write"]
    return [
        ("floor: bare grpcio, canned NodePrepareResources p50", ms(p50["floor"]), "-"),
        ("floor p99", ms(percentile(samples["floor"], 99)), "-"),
        ("floor: bare write of the checkpoint (not fsynced) p50", ms(p50["write"]), "-"),
        (
            "NodePrepareResources p50, 1 claim / 1 device, from the checkpoint",
            vs_floor("repeat"),
            f"<= {REPEAT_TARGET:.2f}x floor",
        ),
        ("  p99", ms(percentile(samples["repeat"], 99)), "-"),
        (
            "NodePrepareResources p50, new claim (read, check, metadata, checkpoint)",
            f"{ms(p50['new'])} ({p50['new'] / durable:.2f}x floor + write floor)",
            f"<= {NEW_TARGET:.2f}x floor + write floor",
        ),
        ("  p99", ms(percentile(samples["new"], 99)), "-"),
        (
            "NodePrepareResources p50, new claim with config (+ its spec on tmpfs, metadata)",
            f"{ms(p50['configured'])} ({p50['configured'] / durable:.2f}x floor + write floor)",
            f"<= {NEW_TARGET:.2f}x floor + write floor",
        ),
        ("  p99", ms(percentile(samples["configured"], 99)), "-"),
        (
            "  floor + every write it makes, bare (spec, owner record, metadata, checkpoint)",
            f"{ms(p50['floor'] + p50['writes'])} "
            f"({p50['configured'] / (p50['floor'] + p50['writes']):.2f}x)",
            "informative",
        ),
    ]


def run(quick: bool = False) -> list[Row]:
    """Measure; return rows of (metric, measured value, target)."""
    return _bench(quick)


if __name__ == "__main__":
    print_table("prepare", run(quick="--quick" in sys.argv[1:]))
