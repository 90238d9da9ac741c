"""The supervision every kubelet plugin shares, with a registration that is not the device
plugin's: two sockets served (as a DRA driver serves its registration and service sockets),
a kubelet identity read from a file, real gRPC on real unix sockets."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
import pytest

from cdi_gen.errors import RegistrationError
from cdi_gen.files import FileId, file_id
from cdi_gen.kubelet.registration import PluginWatcherRegistrar, RegistrationService
from cdi_gen.kubelet.supervisor import Supervisor
from cdi_gen.kubelet.transport import UnixServer
from tests.fakes.drakubelet import FakeDraKubelet
from tests.waiting import until

#: A look at the files once an hour: within a test, only inotify or the registrar wakes the
#: supervisor.
HOURLY = 3600.0

pytestmark = pytest.mark.timeout(60)


class MarkerRegistrar:
    """Registers by answering from a list; the kubelet's identity is a marker file's. Counts
    how often the supervisor looked for a kubelet, so a test can wait for a look that proves
    the supervisor passed a moment in question."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker
        self.answers: list[str | None] = []
        self.calls = 0
        self.looked = 0

    def kubelet_id(self) -> FileId | None:
        self.looked += 1
        return file_id(self.marker)

    def follow(self, wake: Callable[[], None]) -> tuple[Path, ...]:
        return (self.marker,)

    async def register(self) -> str | None:
        self.calls += 1
        return self.answers.pop(0) if self.answers else None


def echo_server(path: Path) -> UnixServer:
    def services() -> dict[str, dict[str, grpc.RpcMethodHandler[Any, Any]]]:
        return {"t.T": {"Echo": grpc.unary_unary_rpc_method_handler(lambda request, _: request)}}

    return UnixServer(path, services)


async def call(path: Path) -> bytes:
    async with grpc.aio.insecure_channel(f"unix://{path}") as channel:
        echo = channel.unary_unary("/t.T/Echo", request_serializer=None, response_deserializer=None)
        answer: bytes = await echo(b"ping", timeout=5)
        return answer


async def test_serves_registers_and_follows_restarts(short_dir: Path) -> None:
    marker = short_dir / "kubelet"
    registrar = MarkerRegistrar(marker)
    reg, service = short_dir / "reg.sock", short_dir / "service.sock"
    outcomes: list[tuple[bool, str]] = []
    supervisor = Supervisor(
        "driver.example.com",
        [echo_server(reg), echo_server(service)],
        registrar,
        on_register=lambda ok, error: outcomes.append((ok, error)),
        watch_interval=0.02,
    )
    await supervisor.start()
    try:
        assert await call(reg) == b"ping"
        assert await call(service) == b"ping"
        # No kubelet yet: nothing is attempted, however often the supervisor looks.
        looked = registrar.looked
        await until(lambda: registrar.looked >= looked + 3, "three looks for a kubelet")
        assert registrar.calls == 0
        marker.touch()
        await asyncio.wait_for(supervisor.wait_registered(), 5)
        assert supervisor.registrations == 1

        # A kubelet restart: a new identity. Both sockets are served anew, then registered.
        before = [file_id(reg), file_id(service)]
        marker.unlink()
        marker.touch()
        await until(
            lambda: supervisor.registrations == 2, "a registration after the kubelet restart"
        )
        assert [file_id(reg), file_id(service)] != before
        assert await call(service) == b"ping"

        # One socket wiped: served again and registered again.
        os.unlink(service)
        await until(
            lambda: supervisor.registrations == 3, "a registration after the socket was wiped"
        )
        assert await call(service) == b"ping"

        # Refusals are retried with backoff and reported.
        registrar.answers = ["refused", "refused"]
        marker.unlink()
        marker.touch()
        await until(lambda: supervisor.registrations == 4, "a registration after two refusals")
        assert outcomes[-3:] == [(False, "refused"), (False, "refused"), (True, "")]
    finally:
        await supervisor.stop()
    assert not reg.exists()
    assert not service.exists()


async def test_a_foreign_file_is_never_replaced(short_dir: Path) -> None:
    path = short_dir / "x.sock"
    path.write_text("not ours")
    supervisor = Supervisor("x", [echo_server(path)], MarkerRegistrar(short_dir / "k"))
    with pytest.raises(RegistrationError, match="is not a socket"):
        await supervisor.start()
    await supervisor.stop()
    assert path.read_text() == "not ours"


class CancelOnAnswer(MarkerRegistrar):
    """Answers at once, and has the supervisor's task cancelled just as the answer lands:
    what a SIGTERM right after a successful Register does to the agent."""

    def __init__(self, marker: Path, after: int) -> None:
        super().__init__(marker)
        self.task: asyncio.Task[Any] | None = None
        self.after = after

    async def register(self) -> str | None:
        loop = asyncio.get_running_loop()

        def cancel_later(left: int) -> None:
            assert self.task is not None
            if left:
                loop.call_soon(cancel_later, left - 1)
            else:
                self.task.cancel()

        cancel_later(self.after)
        return await super().register()


@pytest.mark.parametrize("after", range(6))
async def test_a_stop_right_after_registration_is_not_swallowed(
    short_dir: Path, after: int
) -> None:
    """The cancel lands ``after`` loop iterations after the kubelet's answer, so one of them
    falls while registration tidies up its helper tasks: it must end the task, not be taken
    for the helpers' own cancellation (the agent then ignored SIGTERM for good)."""
    marker = short_dir / "kubelet"
    marker.write_text("1")
    registrar = CancelOnAnswer(marker, after)
    supervisor = Supervisor("test", [echo_server(short_dir / "a.sock")], registrar)
    for server in supervisor.servers:
        server.start()
    try:
        registrar.task = asyncio.ensure_future(supervisor._register_once(False))
        done, _ = await asyncio.wait({registrar.task}, timeout=5)
        assert done, "the attempt did not end"
        assert registrar.task.cancelled(), f"cancel swallowed: {registrar.task.result()}"
    finally:
        await supervisor._stop_servers(0)


async def test_refusals_are_retried_no_faster_than_the_floor_and_logged_per_doubling(
    short_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A bound of 1e-9 s is raised to the floor of every backoff (it made a retry storm), a
    refusal that repeats is logged on attempts 1, 2, 4, 8, and an empty refusal still says
    what happened."""
    marker = short_dir / "kubelet"
    marker.touch()
    registrar = MarkerRegistrar(marker)
    registrar.answers = ["refused"] * 6 + ["", "refused", None]
    supervisor = Supervisor(
        "test", [echo_server(short_dir / "a.sock")], registrar, max_backoff=1e-9
    )
    await supervisor.start()
    try:
        await asyncio.wait_for(supervisor.wait_registered(), 10)
    finally:
        await supervisor.stop()
    assert registrar.calls == 9
    lines = [r.getMessage() for r in caplog.records if "with the kubelet failed" in r.getMessage()]
    assert lines == [
        "registering test with the kubelet failed (attempt 1, next in 0.1s): refused",
        "registering test with the kubelet failed (attempt 2, next in 0.1s): refused",
        "registering test with the kubelet failed (attempt 4, next in 0.1s): refused",
        "registering test with the kubelet failed (attempt 7, next in 0.1s): refused without "
        "a reason",
        "registering test with the kubelet failed (attempt 8, next in 0.1s): refused",
    ]


class NoKubelet(MarkerRegistrar):
    """No kubelet ever comes."""

    def kubelet_id(self) -> FileId | None:
        self.looked += 1
        return None


async def test_a_socket_wiped_before_any_kubelet_came_is_served_again(short_dir: Path) -> None:
    """No kubelet yet, and the plugin folder is wiped: the socket is served again (and the
    serving hook says when it could not be), not only once a kubelet shows up."""
    path = short_dir / "plugin" / "a.sock"
    path.parent.mkdir()
    changes: list[tuple[bool, str]] = []
    registrar = NoKubelet(short_dir / "none")
    supervisor = Supervisor("test", [echo_server(path)], registrar, watch_interval=0.02)
    supervisor.on_serving = lambda serving, why: changes.append((serving, why))
    await supervisor.start()
    try:
        assert changes == [(True, "")]
        await until(
            lambda: registrar.looked >= 2, "two looks for a kubelet"
        )  # waiting for a kubelet
        path.parent.rename(short_dir / "moved")
        path.parent.write_text("in the way")
        await until(lambda: len(changes) == 2, "the serving hook saying it cannot serve")
        assert changes[1][0] is False and "cannot serve on" in changes[1][1]
        path.parent.unlink()
        path.parent.mkdir()
        await until(lambda: len(changes) == 3, "the serving hook saying it serves again")
        assert changes[2] == (True, "")
        assert await call(path) == b"ping"
        assert registrar.calls == 0
    finally:
        await supervisor.stop()
    assert changes[-1] == (False, "stopped")


async def test_removals_and_restarts_are_seen_through_inotify_not_by_looking(
    short_dir: Path,
) -> None:
    """With the look at the files once an hour, our socket removed, the kubelet's file made
    anew and the folder of our socket moved away are each noticed at once: inotify woke the
    supervisor (the registrar counts its looks: no look passes without a wake)."""
    marker = short_dir / "kubelet"
    marker.touch()
    registrar = MarkerRegistrar(marker)
    path = short_dir / "plugin" / "a.sock"
    path.parent.mkdir()
    supervisor = Supervisor("test", [echo_server(path)], registrar, watch_interval=HOURLY)
    await supervisor.start()
    try:
        await asyncio.wait_for(supervisor.wait_registered(), 5)
        os.unlink(path)
        await until(lambda: supervisor.registrations == 2, "a registration after the removal")
        assert await call(path) == b"ping"

        marker.unlink()
        marker.touch()
        await until(lambda: supervisor.registrations == 3, "a registration after a restart")

        # The folder moved away and made again: its watch went with it, and is set anew.
        path.parent.rename(short_dir / "moved")
        path.parent.mkdir()
        await until(lambda: supervisor.registrations == 4, "a registration in the new folder")
        assert await call(path) == b"ping"
        os.unlink(path)
        await until(lambda: supervisor.registrations == 5, "a removal in the new folder")
    finally:
        await supervisor.stop()


async def test_a_new_getinfo_of_the_plugin_watcher_is_seen_without_looking(
    short_dir: Path,
) -> None:
    """A DRA driver has no kubelet file: the plugin watcher's GetInfo of a restarted kubelet
    wakes the supervisor, which registers again (with the look once an hour)."""
    registry = short_dir / "registry"
    registry.mkdir()
    endpoint = short_dir / "dra.sock"
    service = RegistrationService("driver.example.com", endpoint)
    supervisor = Supervisor(
        "driver.example.com",
        [echo_server(endpoint), UnixServer(registry / "driver-reg.sock", service.services)],
        PluginWatcherRegistrar(service, 5.0),
        watch_interval=HOURLY,
        serve_anew_on_restart=False,
    )
    await supervisor.start()
    try:
        async with FakeDraKubelet(registry) as kubelet:
            await asyncio.wait_for(supervisor.wait_registered(), 5)
            await kubelet.restart()
            await until(lambda: supervisor.registrations == 2, "a registration after a restart")
            assert service.info_calls == 2
    finally:
        await supervisor.stop()


async def test_a_kubelet_folder_that_cannot_be_watched_yet_is_looked_at_often(
    short_dir: Path,
) -> None:
    """The kubelet's file is in a folder that does not exist yet: inotify cannot watch it, so
    the supervisor looks several times a second (not once an hour) until it can, and
    registers once the kubelet comes; from then on inotify sees its restarts."""
    marker = short_dir / "later" / "kubelet"
    registrar = MarkerRegistrar(marker)
    supervisor = Supervisor(
        "test", [echo_server(short_dir / "a.sock")], registrar, watch_interval=HOURLY
    )
    await supervisor.start()
    try:
        looked = registrar.looked
        await until(lambda: registrar.looked >= looked + 2, "two looks without a kubelet")
        marker.parent.mkdir()
        marker.touch()
        await asyncio.wait_for(supervisor.wait_registered(), 5)
        marker.unlink()
        marker.touch()
        await until(lambda: supervisor.registrations == 2, "a registration after a restart")
    finally:
        await supervisor.stop()
