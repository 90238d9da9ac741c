"""ListAndWatch's device list, encoded once per board version from cached per-device pieces,
is byte for byte what protobuf encodes for the whole message, whatever the sequence of lists."""

from __future__ import annotations

from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from cdi_gen._proto.deviceplugin.v1beta1 import api_pb2
from cdi_gen.cdi.registry import SpecCache
from cdi_gen.deviceplugin.board import DeviceBoard
from cdi_gen.deviceplugin.server import DevicePlugin
from cdi_gen.model import AdvertisedDevice
from tests.conftest import examples

_DEVICE = st.builds(
    AdvertisedDevice,
    id=st.sampled_from([f"loop{n}" for n in range(12)]),
    healthy=st.booleans(),
    numa_node=st.none() | st.integers(0, 3),
    physical=st.sampled_from(["", "p0", "p1"]),
)
_LISTS = st.lists(st.lists(_DEVICE, max_size=12, unique_by=lambda d: d.id), max_size=15)


def _expected(devices: list[AdvertisedDevice]) -> bytes:
    wires = []
    for d in devices:
        wire = api_pb2.Device(ID=d.id, health="Healthy" if d.healthy else "Unhealthy")
        if d.numa_node is not None:
            wire.topology.nodes.add(ID=d.numa_node)
        wires.append(wire)
    return api_pb2.ListAndWatchResponse(devices=wires).SerializeToString()


@settings(max_examples=examples(200), deadline=None)
@given(lists=_LISTS)
def test_the_encoded_list_is_protobufs_encoding(lists: list[list[AdvertisedDevice]]) -> None:
    board = DeviceBoard()
    plugin = DevicePlugin(
        "example.com", "loop", board, SpecCache([Path("/nonexistent")]), plugin_dir=Path("/tmp")
    )
    assert plugin._service.list_bytes() == api_pb2.ListAndWatchResponse().SerializeToString()
    for devices in lists:
        board.publish(devices)
        encoded = plugin._service.list_bytes()
        assert encoded == _expected(devices)
        # Asked again without a change: the very same bytes, not a rebuild.
        assert plugin._service.list_bytes() is encoded
