"""Fixtures of the cluster tests: one real single-node cluster per lane (``lane.py``) at a time,
and per test the ``cdi-gen run`` agents, loop devices and pods it needs, all removed at the
test's end. ``fleet`` is a three-node cluster of the current lane for the module that uses it
(test_nodes.py, test_uninstall.py), stopped at that module's end.

Every test here is marked ``cluster``. A test runs in the current lane; one marked
``@pytest.mark.lanes("current", "oldest")`` runs in each lane named (its id says which), and
pytest orders the tests so that each lane's cluster starts once. Nothing skips: a lane whose
component cannot be built, fetched or started fails its tests, naming the lane and the
component and quoting its log. A failing
test gets the end of every component's log (and the agents') in its report.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Generator, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from loopdev import LoopDevices

from .agent import DRIVER, VENDOR, NodeAgent, dra_args
from .claims import Claims
from .cluster import Cluster
from .dist import FetchError, fetch_etcd
from .image import AgentImage, ImageError, ensure_agent_image
from .lane import CURRENT, LANES, Lane, LaneError
from .pods import Pods
from .process import ComponentError

HERE = Path(__file__).resolve().parent
#: Loop numbers of the cluster tests; other suites use 200-299 and 300-399.
LOOP_LOW, LOOP_HIGH = 400, 499

#: Extra logs (name, reader) of the running test, added to its report if it fails.
_TEST_LOGS: list[tuple[str, Callable[[], str]]] = []
_CLUSTER: list[Cluster] = []


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Every test that needs a cluster gets a ``lane`` parameter: the current lane, or the
    lanes its ``lanes`` marker names."""
    if "lane" not in metafunc.fixturenames:
        return
    marker = metafunc.definition.get_closest_marker("lanes")
    names = marker.args if marker is not None else (CURRENT.name,)
    unknown = [n for n in names if n not in LANES]
    if unknown:
        raise pytest.UsageError(f"{metafunc.definition.nodeid}: unknown lanes {unknown}")
    metafunc.parametrize(
        "lane", [LANES[n] for n in names], ids=list(names), indirect=True, scope="session"
    )


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if HERE in Path(str(item.fspath)).resolve().parents:
            item.add_marker(pytest.mark.cluster)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, Any, None]:
    outcome = yield
    report: pytest.TestReport = outcome.get_result()
    if not report.failed or HERE not in Path(str(item.fspath)).resolve().parents:
        return
    for name, read in _TEST_LOGS:
        report.sections.append((f"log: {name}", read()))
    for cluster in _CLUSTER:
        report.sections.append((f"cluster component logs ({len(cluster.nodes)} node(s))",
                                cluster.log_report()))  # fmt: skip


@pytest.fixture(scope="session")
def lane(request: pytest.FixtureRequest) -> Lane:
    """The lane of the test's cluster (a parameter from ``pytest_generate_tests``)."""
    lane: Lane = getattr(request, "param", CURRENT)
    return lane


@pytest.fixture(scope="session")
def cluster(lane: Lane) -> Iterator[Cluster]:
    """A running cluster of ``lane`` whose Node is Ready (built by tests/cluster/setup.py)."""
    yield from _running(lane, 1)


@pytest.fixture(scope="module")
def fleet() -> Iterator[Cluster]:
    """A running cluster of the current lane with three Ready nodes, for the module that asks
    for it (single-node scenarios keep their own, lighter ``cluster``)."""
    yield from _running(CURRENT, FLEET_NODES)


#: The nodes of ``fleet``: enough for spreading (two devices each, seven pods) to show.
FLEET_NODES = 3


def _running(lane: Lane, nodes: int) -> Iterator[Cluster]:
    if os.geteuid() != 0:
        pytest.fail("cluster: needs root (mount namespace, cgroups, containerd, loop devices)")
    try:
        etcd = fetch_etcd()
        runtime = lane.runtime_root(allow_build=False)
        binaries = lane.binaries(allow_build=False)
        lane.runc(allow_build=False)  # the node's runtime runs it (cluster.py)
    except FetchError as exc:
        pytest.fail(f"lane {lane.name}: cannot get etcd: {exc}", False)
    except LaneError as exc:
        pytest.fail(f"cannot get the components: {exc}", False)
    cluster = Cluster(binaries, etcd, runtime, lane, node_count=nodes)
    _CLUSTER.append(cluster)
    try:
        try:
            cluster.start()
        except (ComponentError, OSError) as exc:
            pytest.fail(
                f"lane {lane.name}: cluster of {nodes} node(s) did not start: {exc}\n\n"
                f"{cluster.log_report()}",
                False,
            )
        yield cluster
    finally:
        problems = cluster.stop()
        cluster.remove()
        _CLUSTER.remove(cluster)
        if problems:
            pytest.fail("cluster teardown left something behind: " + "; ".join(problems))


@pytest.fixture(scope="session")
def agent_image() -> AgentImage:
    """The agent image of this checkout from deploy/Containerfile (image.py; cached under
    /var/cache/cdi-gen-test/image, built here if the setup did not: a cold build takes one to
    two minutes, which is why the tests using it have a long timeout)."""
    try:
        return ensure_agent_image()
    except ImageError as exc:
        pytest.fail(f"agent image: {exc}", False)


@pytest.fixture
def loops() -> Iterator[LoopDevices]:
    devices = LoopDevices(LOOP_LOW, LOOP_HIGH)
    try:
        yield devices
    finally:
        devices.cleanup()


@pytest.fixture
def pods(cluster: Cluster) -> Iterator[Pods]:
    assert cluster.api is not None
    p = Pods(cluster.api)
    try:
        yield p
    finally:
        p.delete_all()


#: ``(config text, more cdi-gen run flags)`` → the registered agent.
AgentFactory = Callable[..., NodeAgent]


@pytest.fixture
def node_agent(cluster: Cluster, tmp_path: Path) -> Iterator[AgentFactory]:
    """Start ``cdi-gen run`` on the node with a config text (and more flags, e.g.
    ``--runtime``); stopped (SIGTERM) at the end, and the specs it left for running pods
    removed once the pods are gone."""
    started: list[NodeAgent] = []

    def factory(config: str, args: Sequence[str] = ()) -> NodeAgent:
        n = len(started)
        path = tmp_path / f"agent{n}.yaml"
        path.write_text(config)
        agent = NodeAgent(cluster, path, tmp_path / f"agent{n}.log", tuple(args))
        agent.start()
        started.append(agent)
        _TEST_LOGS.append((f"cdi-gen run #{n}", agent.log))
        # Registered, not only started: until then the Node may still show an earlier
        # agent's devices, and a pod admitted meanwhile would be refused.
        before = sum(a.log().count(REGISTERED) for a in started[:-1])
        deadline = time.monotonic() + 20
        while sum(a.log().count(REGISTERED) for a in started) <= before:
            if not agent.running() or time.monotonic() > deadline:
                pytest.fail(f"cdi-gen run #{n} did not register with the kubelet:\n{agent.log()}")
            time.sleep(0.05)
        return agent

    try:
        yield factory
    finally:
        _TEST_LOGS.clear()
        for agent in started:
            agent.stop()
        for spec in cluster.cdi_run.glob("*"):
            spec.unlink()
        if started:
            _wait_nothing_allocatable(cluster)


REGISTERED = "with the kubelet"


@pytest.fixture
def claims(cluster: Cluster, pods: Pods) -> Iterator[Claims]:
    """The test's DRA objects (claims, templates, DeviceClasses), deleted at its end after
    its pods (the ``pods`` fixture is torn down later, so delete them here first)."""
    assert cluster.api is not None
    c = Claims(cluster.api, pods)
    try:
        yield c
    finally:
        pods.delete_all()
        c.delete_all()


DraAgentFactory = Callable[..., NodeAgent]


def _kubelet_log_size(cluster: Cluster) -> int:
    try:
        return cluster.components["kubelet"].log_path.stat().st_size
    except OSError:
        return 0


def _kubelet_connected(cluster: Cluster, driver: str, since: int) -> bool:
    """Whether the kubelet logged, after byte ``since`` of its log, a connection to
    ``driver``'s DRA socket (at -v=2 it logs every gRPC connection change of a registered
    DRA plugin: dra_plugin_manager.go, "Connection changed")."""
    with open(cluster.components["kubelet"].log_path, "rb") as f:
        f.seek(since)
        text = f.read().decode(errors="replace")
    return any(
        '"Connection changed"' in line
        and f'driverName="{driver}"' in line
        and "connected=true" in line
        for line in text.splitlines()
    )


@pytest.fixture
def dra_agent(cluster: Cluster, claims: Claims, tmp_path: Path) -> Iterator[DraAgentFactory]:
    """Start ``cdi-gen run --api dra`` on the node with a config text and return once the
    kubelet has connected to its DRA socket (registration done). ``state_dir`` (default: one
    per test) is where prepared claims are kept: pass the same one to a restarted agent;
    ``args`` are more ``cdi-gen run`` flags.

    At the end the pods are deleted (their claims unprepared), the agents stopped (SIGTERM),
    the specs they left removed, and whatever ResourceSlices of the driver remain deleted, so
    the next test starts from none."""
    started: list[NodeAgent] = []

    def factory(
        config: str,
        state_dir: Path | None = None,
        driver: str = DRIVER,
        wait: bool = True,
        args: Sequence[str] = (),
    ) -> NodeAgent:
        n = len(started)
        path = tmp_path / f"dra-agent{n}.yaml"
        path.write_text(config)
        state = state_dir or tmp_path / "state"
        since = _kubelet_log_size(cluster)
        agent = NodeAgent(
            cluster,
            path,
            tmp_path / f"dra-agent{n}.log",
            (*dra_args(cluster, state, driver), *args),
        )
        agent.start()
        started.append(agent)
        _TEST_LOGS.append((f"cdi-gen run --api dra #{n}", agent.log))
        deadline = time.monotonic() + 30
        while wait and not _kubelet_connected(cluster, driver, since):
            if not agent.running() or time.monotonic() > deadline:
                pytest.fail(
                    f"cdi-gen run --api dra #{n} (exit {agent.process and agent.process.poll()}) "
                    f"was not connected by the kubelet as DRA driver {driver}:\n{agent.log()}"
                )
            time.sleep(0.1)
        return agent

    try:
        yield factory
    finally:
        _TEST_LOGS.clear()
        # Pods first, while the driver runs: the kubelet removes a pod from the API only
        # after NodeUnprepareResources for its claims succeeded.
        claims.pods.delete_all()
        for agent in started:
            agent.stop()
        for spec in cluster.cdi_run.glob("*"):
            spec.unlink()
        drivers = {a.extra_args[a.extra_args.index("--dra-driver") + 1] for a in started}
        for driver in drivers:
            claims.delete_slices(driver)


def _wait_nothing_allocatable(cluster: Cluster, timeout: float = 30) -> None:
    """The next test starts from a Node where no example.com device is allocatable, so that a
    stale status never passes for its own agent's."""
    deadline = time.monotonic() + timeout
    while True:
        node = cluster.node() or {}
        left = {k: v for k, v in node.get("status", {}).get("allocatable", {}).items()
                if k.startswith(f"{VENDOR}/") and v != "0"}  # fmt: skip
        if not left:
            return
        if time.monotonic() > deadline:
            pytest.fail(f"stopped agents' devices still allocatable after {timeout} s: {left}")
        time.sleep(0.1)


def wait_capacity(cluster: Cluster, resource: str, count: int, timeout: float = 30) -> float:
    """Wait until the Node's capacity and allocatable of ``resource`` are both ``count``;
    the seconds it took."""
    start = time.monotonic()
    deadline = start + timeout
    while True:
        seen = cluster.allocatable(resource)
        if seen == (count, count):
            return time.monotonic() - start
        if time.monotonic() > deadline:
            raise TimeoutError(
                f"Node {resource}: (capacity, allocatable) = {seen}, wanted {count} "
                f"within {timeout} s"
            )
        time.sleep(0.05)
