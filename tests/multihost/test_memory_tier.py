"""The memory tier across hosts (docs/memory-tier.md): tesserad on host 0, a worker on
each of hosts 1-4, each trainer on its worker's host. The workers are on four hosts,
so no save here is forced: copies and parity really go to other hosts. A lost host is
a killed worker (its /dev/shm is its host's own); its replacement starts on the same
host. The checkpoint root is one directory (bind) or an S3 bucket (s3). Needs root."""

import json
import os
import signal
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))
from hosts import can_run  # noqa: E402
from test_multihost import WORKERS, cluster_on  # noqa: E402
from eventually import eventually  # noqa: E402  (test_multihost puts python/tests on the path)

WHY_NOT = can_run()
pytestmark = pytest.mark.skipif(WHY_NOT is not None, reason="multi-host tests: %s" % WHY_NOT)
ALL = list(range(1, WORKERS + 1))


@pytest.fixture(scope="module", params=["bind", "s3"])
def cluster(request):
    with cluster_on(request.param) as c:
        yield c


def msave(c, mesh, step, hosts=None, **options):
    out = c.trainers(mesh, "msave", step, json.dumps(options), hosts=hosts)
    assert all(r.get("committed") for r in out.values()), out
    return out


def lose(c, i, env=None):
    """Host i's worker is killed (its shared memory with it) and a replacement starts
    there under the same name."""
    c.workers[i].kill(signal.SIGKILL)
    c.start_worker(i, env=env, log="worker-%d-again-%s.log" % (i, os.urandom(3).hex()))
    c.wait_alive(i)


def restore_all(c, mesh):
    out = c.trainers(mesh, "mrestore")
    assert all(r.get("equal") for r in out.values()), out
    return out


@pytest.mark.parametrize("redundancy", ["replica", "parity"])
def test_a_lost_host_is_rebuilt_from_its_peers_memory(cluster, redundancy):
    c = cluster
    mesh = "mem-" + redundancy
    c.register(mesh, {"data": WORKERS})
    for step in (1, 2):
        msave(c, mesh, step, redundancy=redundancy)
    # A trainer's restart on a live host: from its own worker's RAM.
    out = restore_all(c, mesh)
    assert {(r["restored"], r["tier"], r["source"]) for r in out.values()} == {(2, "memory", "local")}
    lose(c, 3)
    out = restore_all(c, mesh)
    assert {r["restored"] for r in out.values()} == {2}, out
    assert out[3]["source"] == redundancy, out
    assert all(out[i]["source"] == "local" for i in (1, 2, 4)), out
    # Nothing was read from the root: no memory checkpoint was persisted.
    assert c.store.steps(mesh) == []


def test_a_host_lost_during_replication_never_commits_that_checkpoint(cluster):
    c = cluster
    mesh = "mem-lost"
    c.register(mesh, {"data": WORKERS})
    msave(c, mesh, 5)
    # Step 6: hosts 1-3 save; host 4 is lost before its trainer does.
    procs = {i: c.hosts.popen(i, c.trainer_argv(mesh, i, "msave", 6, json.dumps({"deadline_ms": 5000})),
                              env=c.env()) for i in (1, 2, 3)}
    lose(c, 4)
    for i, p in procs.items():
        stdout, stderr = p.communicate(timeout=120)
        r = json.loads(stdout.strip().splitlines()[-1])
        assert not r.get("committed") and "w-h4" in r.get("message", ""), (i, r, stderr[-2000:])
    out = restore_all(c, mesh)
    assert {r["restored"] for r in out.values()} == {5}, out
    assert out[4]["source"] == "replica"


def test_two_hosts_lost_in_a_parity_group_fall_back_to_the_persisted_checkpoint(cluster):
    c = cluster
    mesh = "mem-fallback"
    c.register(mesh, {"data": WORKERS})
    saved = c.trainers(mesh, "save", 10, "--wait")  # on disk
    assert all(r.get("committed") for r in saved.values()), saved
    msave(c, mesh, 11, redundancy="parity")
    lose(c, 2)
    lose(c, 3)
    out = restore_all(c, mesh)
    for r in out.values():
        assert (r["restored"], r["tier"], r["source"]) == (10, "persisted", "root"), out
        assert "step 11 cannot be rebuilt" in r["fallback"], r
        assert "w-h2" in r["fallback"] or "w-h3" in r["fallback"], r


def test_reed_solomon_parity_rebuilds_two_lost_hosts_of_a_group(cluster):
    c = cluster
    mesh = "mem-rs"
    c.register(mesh, {"data": WORKERS})
    msave(c, mesh, 12, redundancy="parity", parity=2)
    lose(c, 1)
    lose(c, 4)
    out = restore_all(c, mesh)
    assert {(r["restored"], r["tier"]) for r in out.values()} == {(12, "memory")}, out
    assert [out[i]["source"] for i in ALL] == ["parity", "local", "local", "parity"], out
    assert c.store.steps(mesh) == []


def test_a_damaged_copy_is_named_and_the_other_copy_is_used(cluster):
    c = cluster
    mesh = "mem-flip"
    # Host 2's worker damages the first copy it keeps of step 21.
    lose(c, 2, env=dict(os.environ, TESSERA_FAULT_FLIP_MEMORY_COPY="21"))
    c.register(mesh, {"data": WORKERS})
    msave(c, mesh, 21, replicas=2)
    eventually(lambda: "fault injection: flipped a bit in the copy of rank" in c.workers[2].text(),
               "host 2 damaged a copy")
    damaged = int(c.workers[2].text().split("flipped a bit in the copy of rank ")[1].split("'")[0])
    lose(c, damaged + 1)
    out = restore_all(c, mesh)
    assert {r["restored"] for r in out.values()} == {21}, out
    assert out[damaged + 1]["source"] == "replica"
    assert "does not match" in c.workers[2].text()
    lose(c, 2)  # without the fault, for the tests after this one


def test_a_mesh_registered_again_never_restores_the_old_ram(cluster):
    c = cluster
    mesh = "mem-spare"
    c.register(mesh, {"data": WORKERS})
    msave(c, mesh, 40, redundancy="parity")
    # Host 3's worker is gone; "spare" starts there and takes its rank in a mesh
    # registered again: another mesh to the memory tier, whose RAM step 40 is not.
    c.workers[3].kill(signal.SIGKILL)
    c.start_worker(3, name="spare", log="worker-3-spare.log")
    assert c.ids[3] == "w-spare"
    c.client.delete_mesh(mesh)
    c.register(mesh, {"data": WORKERS})
    out = restore_all(c, mesh)
    assert {r["restored"] for r in out.values()} == {None}, out
    # Back under its own name, for the tests after this one.
    c.workers[3].kill(signal.SIGKILL)
    c.start_worker(3)
    c.wait_alive(3)


def test_memory_checkpoints_commit_while_tesserad_is_away_and_it_learns_them_back(cluster):
    c = cluster
    mesh = "mem-away"
    c.register(mesh, {"data": WORKERS})
    msave(c, mesh, 30)
    eventually(lambda: [ck["step"] for ck in c.client.checkpoints(mesh)] == [30],
               "tesserad lists memory checkpoint 30")
    c.server.kill()
    # The workers agree among themselves: no request to tesserad is needed.
    msave(c, mesh, 31)
    msave(c, mesh, 32)
    c.start_server(log="tesserad-back-%s.log" % os.urandom(3).hex())
    for i in ALL:
        c.wait_alive(i)

    def listed():
        return {ck["step"]: ck.get("tiers") for ck in c.client.checkpoints(mesh)}
    eventually(lambda: listed() == {31: ["memory"], 32: ["memory"]},
               lambda: "tesserad lists %s" % listed())
    workers = {w["id"]: w.get("memory_bytes", 0) for w in c.client.workers()}
    assert all(workers[c.ids[i]] > 0 for i in ALL), workers
    out = restore_all(c, mesh)
    assert {(r["restored"], r["tier"]) for r in out.values()} == {(32, "memory")}, out
