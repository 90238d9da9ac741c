"""The agent of a rolling update shares the host's network with the one it replaces: its
metrics address is free only once that one has gone. With a pod UID it waits for it; without,
a taken address is the operator's mistake (exit 2, tests/unit/test_bad_input.py)."""

from __future__ import annotations

import asyncio
import http.client
import socket
from pathlib import Path

from cdi_gen.agent.agent import Agent
from cdi_gen.config.loader import parse_config
from cdi_gen.config.settings import Settings
from tests.fakes.source import PipeSource
from tests.waiting import until

CONFIG = {
    "vendor": "example.com",
    "classes": [{"name": "loop", "match": {"subsystem": "block", "kernel": "loop[0-9]"}}],
}


def _status(port: int, path: str) -> int:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
    try:
        connection.request("GET", path)
        return connection.getresponse().status
    finally:
        connection.close()


async def test_the_metrics_address_of_the_replaced_agent_is_served_once_free(
    tmp_path: Path,
) -> None:
    taken = socket.socket()
    taken.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    port = taken.getsockname()[1]
    settings = Settings(
        spec_dir=tmp_path / "cdi",
        no_kubelet=True,
        metrics_address=f"127.0.0.1:{port}",
        pod_uid="uid-new",
    )
    source = PipeSource.from_data("export-db-vm.txt", only={"loop0"})
    agent = Agent(parse_config(CONFIG, "test.yaml"), settings, source=source)
    task = asyncio.create_task(agent.run())
    try:
        await asyncio.wait_for(agent.started.wait(), 5)
        assert not task.done()  # started, not refused
        taken.close()  # the replaced agent exits
        await until(lambda: agent._http is not None, "the metrics address served by the new agent")
        assert await asyncio.to_thread(_status, port, "/healthz") == 200
    finally:
        taken.close()
        agent.stop()
        await asyncio.wait_for(task, 5)
        source.release()
