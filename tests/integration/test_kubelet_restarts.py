"""Kubelet restarts in a row against the device plugin, over real gRPC on real unix sockets.

Each restart is the one the kubelet's start-up makes, twice over as a crash-looping kubelet
does: the kubelet goes down and its start-up cleanup wipes every socket in the folder; ~0.2 s
later the next start wipes the folder again (a socket the plugin re-created meanwhile
included) and serves a new ``kubelet.sock``. The plugin must register with the new kubelet
every time: a missed restart leaves the node without the resource. The plugin runs with the
agent's defaults (watch interval, backoff, Register timeout). How quickly it follows is a speed
target for the benchmarks, not an assertion here: a restart counts as missed only when no
registration comes within a ceiling meant for a broken plugin.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

from fakes.kubelet import FakeKubelet

from cdi_gen.cdi.registry import SpecCache
from cdi_gen.deviceplugin.board import DeviceBoard
from cdi_gen.deviceplugin.server import DevicePlugin
from cdi_gen.model import AdvertisedDevice

RESTARTS = 50
#: From the new kubelet.sock to the plugin registered with it: a ceiling, not a target (the
#: plugin's backoff tops out at 2 s).
WITHIN = 10.0


async def _restart(kubelet: FakeKubelet, gap: float) -> None:
    await kubelet.stop()
    # A second registration with the old kubelet (both dial-backs succeeded) is harmless; the
    # old kubelet is stopped now and takes no more, so drop what it took: the next
    # registration in the queue is then the new kubelet's.
    while not kubelet.registered.empty():
        kubelet.registered.get_nowait()
    for entry in os.scandir(kubelet.plugin_dir):
        os.unlink(entry.path)
    await asyncio.sleep(gap)
    await kubelet.restart()  # wipes every socket again, then serves a new kubelet.sock


async def test_fifty_kubelet_restarts_are_each_followed(short_dir: Path) -> None:
    folder = short_dir / "dp"
    board = DeviceBoard([AdvertisedDevice("loop200")])
    kubelet = FakeKubelet(folder)
    await kubelet.start()
    plugin = DevicePlugin(
        "example.com", "loop", board, SpecCache([short_dir / "cdi"]), plugin_dir=folder
    )
    await plugin.start()
    try:
        await kubelet.next_registration(within=5)
        for i in range(RESTARTS):
            await _restart(kubelet, gap=0.2)
            try:
                again = await kubelet.next_registration(within=WITHIN)
            except TimeoutError:
                raise AssertionError(f"restart {i + 1} of {RESTARTS} never followed") from None
            assert "loop200" in await again.next_devices()
    finally:
        await plugin.stop()
        await kubelet.stop()
