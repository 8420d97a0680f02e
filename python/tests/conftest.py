"""Fixtures: a real tesserad and 4 tessera-worker processes (TESSERA_BIN, else
build/bin), shared by the tests of a session; each test uses meshes of its own."""

import itertools
import os
import re
import socket
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import tessera  # noqa: E402
from tessera.local import LocalCluster  # noqa: E402

_names = itertools.count()


def free_port():
    """A TCP port free on 127.0.0.1 now (the trainers' own process group's)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def running_cluster(**options):
    """A LocalCluster of 4 workers with the tests' short heartbeat and lease, stopped
    after: the body of a cluster fixture (`yield from running_cluster(...)`)."""
    c = LocalCluster(**dict({"workers": 4, "heartbeat_ms": 100, "lease_ms": 1500}, **options))
    yield c
    c.stop()


@pytest.fixture(scope="session")
def cluster():
    yield from running_cluster()


@pytest.fixture(scope="session")
def client(cluster):
    return cluster.client(timeout=30)


@pytest.fixture
def mesh_name(request):
    """A mesh name no other test uses."""
    return "%s-%d" % (re.sub(r"[^A-Za-z0-9.-]", "-", request.node.name)[:60], next(_names))


def managers(cluster, mesh, n=4, **kwargs):
    return [tessera.CheckpointManager(mesh, worker=cluster.worker_urls[i], timeout=30, **kwargs)
            for i in range(n)]


@pytest.fixture
def mesh4(cluster, client, mesh_name):
    """A {data: 4} mesh over the 4 workers, and one CheckpointManager per worker."""
    client.register_mesh(mesh_name, {"data": 4}, workers=cluster.worker_ids)
    ms = managers(cluster, mesh_name)
    yield mesh_name, ms
    for m in ms:
        m.close()
