"""Unit tests never read this machine's udev database or sysfs through pyudev.

They run on recorded data (``tests/data/udev``, ``tests/fakes/source.py``), so their results
do not depend on the machine. A pyudev context made by accident fails the test, naming the
way out; the tests that mean to read the real thing live in ``tests/integration``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import pyudev


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
