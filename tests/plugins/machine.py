"""The suite's rule for running beside itself: under pytest-xdist with ``--dist loadscope``
(``make test``), every test that uses the machine itself runs on one worker, one after another
in collection order, while the other workers take the remaining test files, each file whole.

The machine's own tests are those of tests/cluster (real clusters on fixed ports and host
paths; each lane's cluster starts once), of tests/e2e (the host's container runtimes) and of
every file with a test marked ``kernel`` (real loop devices and uevents, a udevd started and
stopped). Two of them side by side would see each other's pods, sockets and uevents; the unit
and other integration tests use only folders, sockets and ports of their own.

pytest-xdist schedules by test id alone, so a file's ``kernel`` marks are looked for in its
text. Loaded by ``tests/conftest.py``.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import pytest

TESTS = Path(__file__).resolve().parent.parent
REPO = TESTS.parent
MACHINE_FOLDERS = (TESTS / "cluster", TESTS / "e2e")
#: How a test file marks a test (or all of them) ``kernel``.
KERNEL_MARK = "pytest.mark.kernel"
#: The scope of every test that uses the machine.
MACHINE = "machine"


@functools.cache
def scope_of_file(path: str) -> str:
    """The scheduling scope of the test file ``path`` (relative to the repository):
    :data:`MACHINE`, or the path itself."""
    file = (REPO / path).resolve()
    if any(folder in file.parents for folder in MACHINE_FOLDERS):
        return MACHINE
    try:
        marked = KERNEL_MARK in file.read_text()
    except OSError:
        marked = False
    return MACHINE if marked else path


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    if config.getoption("dist") != "loadscope":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class MachineScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return scope_of_file(nodeid.partition("::")[0])

    return MachineScheduling(config, log)
