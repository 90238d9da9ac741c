"""The suite's rule that nothing skips silently: a skip or an xfail anywhere fails the run.

pytest prints each one with its reason (``-ra`` in the ini options); this plugin then turns a
green run with skips into a failure, because a test that cannot run here must fail and say what
is missing, never pass by not running. Loaded by ``tests/conftest.py``.
"""

from __future__ import annotations

import pytest


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is None:
        return
    skipped = [r for key in ("skipped", "xfailed") for r in reporter.stats.get(key, [])]
    if skipped and exitstatus == pytest.ExitCode.OK:
        reporter.write_line(
            f"FAILED: {len(skipped)} test(s) skipped or xfailed; this suite allows none "
            "(see the short test summary above for why)",
            red=True,
        )
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
