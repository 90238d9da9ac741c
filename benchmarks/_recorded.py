"""The real agent on recorded devices: 5 classes of 200 misc devices, udev replaced by the
records and everything downstream real (specs written, device plugins or the DRA driver
serving). For the figures of bench_footprint and bench_dra.

Run as a script it is the agent process bench_dra measures from outside (its VmRSS and
VmHWM read from /proc while the devices are published), serving until SIGTERM:

    python benchmarks/_recorded.py SETTINGS_JSON [API [CLASSES PER_CLASS]]

``SETTINGS_JSON`` holds :class:`~cdi_gen.config.settings.Settings` fields; ``API`` is
``devicePlugin`` (default) or ``dra``, set on every class; ``CLASSES`` classes of
``PER_CLASS`` devices (default 5 of 200). bench_footprint runs it the same way.
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import AsyncIterator
from typing import Any

from cdi_gen.model import DeviceRecord
from cdi_gen.sources import RecordBatch

CLASSES, PER_CLASS = 5, 200


def records(classes: int = CLASSES, per_class: int = PER_CLASS) -> list[DeviceRecord]:
    return [
        DeviceRecord(
            sys_path=f"/sys/devices/virtual/misc/dev{c}x{i}",
            subsystem="misc",
            sys_name=f"dev{c}x{i}",
            devnode=f"/dev/dev{c}x{i}",
            major=10,
            minor=i,
        )
        for c in range(classes)
        for i in range(per_class)
    ]


def config_data(api: str = "devicePlugin", classes: int = CLASSES) -> dict[str, Any]:
    """The class config of the records (as a config file spells it)."""
    return {
        "vendor": "example.com",
        "classes": [
            {
                "name": f"class{c}",
                "match": {"subsystem": "misc", "kernel": f"dev{c}x*"},
                "containerEdits": {"env": ["DEVICE={name}"]},
                "api": api,
            }
            for c in range(classes)
        ],
    }


class RecordedSource:
    """The agent's record source, fed recorded devices once; no events after."""

    source = "recorded"

    def __init__(self, items: list[DeviceRecord]) -> None:
        self._items = items

    def start(self) -> list[DeviceRecord]:
        return list(self._items)

    async def batches(self) -> AsyncIterator[RecordBatch]:
        await asyncio.Event().wait()
        return
        yield

    def request_resync(self) -> None:
        pass

    def close(self) -> None:
        pass


def main(argv: list[str]) -> None:
    from cdi_gen.agent.agent import Agent
    from cdi_gen.config.loader import parse_config
    from cdi_gen.config.settings import Settings

    settings = Settings(**json.loads(argv[0]))
    api = argv[1] if len(argv) > 1 else "devicePlugin"
    classes, per_class = (int(argv[2]), int(argv[3])) if len(argv) > 3 else (CLASSES, PER_CLASS)
    config = parse_config(config_data(api, classes), "bench")
    agent = Agent(config, settings, source=RecordedSource(records(classes, per_class)))
    # Until SIGTERM, which the agent handles as it does in a pod.
    asyncio.run(agent.run())


if __name__ == "__main__":
    main(sys.argv[1:])
