"""Fixtures for the cluster tests: the agent image built from deploy/Containerfile.

Nothing here skips: a missing tool or a failed build fails the test and says which.
"""

from __future__ import annotations

import pytest
from image import AgentImage, ImageError, ensure_agent_image


@pytest.fixture(scope="session")
def agent_image() -> AgentImage:
    """The image of this checkout (cached under /var/cache/cdi-gen-test/image; a cold build
    takes about two minutes, which is why the tests using it have a long timeout)."""
    try:
        return ensure_agent_image()
    except ImageError as exc:
        pytest.fail(f"agent image: {exc}", False)
