"""Unit tests never read this machine's udev database or sysfs through pyudev.

They run on recorded data (``tests/data/udev``, ``tests/fakes/source.py``), so their results
do not depend on the machine. A pyudev context made by accident fails the test, naming the
way out; the tests that mean to read the real thing live in ``tests/integration``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
import pyudev

from cdi_gen.apiserver.client import ApiClient
from tests.fakes.apiserver import FakeApiServer


class _NoHostUdev:
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        raise AssertionError(
            "a unit test opened this machine's udev database (pyudev.Context); feed recorded "
            "records instead (tests/data/udev, tests/fakes/source.py) or move the test to "
            "tests/integration"
        )


@pytest.fixture(autouse=True)
def _no_host_udev(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setattr(pyudev, "Context", _NoHostUdev)
    yield


#: The Node the stand-in API server knows (the API client and publisher tests' node).
API_NODE = "n1"


@pytest.fixture
async def api() -> AsyncIterator[FakeApiServer]:
    """The stand-in API server, knowing :data:`API_NODE`."""
    async with FakeApiServer() as server:
        server.nodes[API_NODE] = "node-uid"
        yield server


@pytest.fixture
async def client(api: FakeApiServer, tmp_path: Path) -> AsyncIterator[ApiClient]:
    """The agent's API client, configured for ``api``."""
    client = await ApiClient.open(api.kubeconfig(tmp_path))
    try:
        yield client
    finally:
        await client.close()
