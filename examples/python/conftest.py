"""Fixtures of the examples' tests: one tesserad and 4 workers for the session;
each test registers meshes of its own."""

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))

from tessera.local import LocalCluster  # noqa: E402


@pytest.fixture(scope="session")
def cluster():
    c = LocalCluster(workers=4, heartbeat_ms=100, lease_ms=1500)
    yield c
    c.stop()
