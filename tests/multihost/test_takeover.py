"""A standby tesserad across hosts (docs/ha.md): tesserads on hosts 0 and 5 share the
checkpoint root (a directory, or an S3 bucket on a Ceph RGW) and lead through an etcd
on the hosts' bridge; workers on hosts 1-4 and every client know both. The leader is
killed, paused or cut off in the middle of a save. In each case: every checkpoint
committed before is listed and restores bit for bit, none is listed that was not
committed, nothing of the interrupted save is left after GC, and the next save
commits. Each takeover is also a rebuild from the root: the standby's catalog is
empty. Needs root."""

import os
import re
import signal
import subprocess
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))
from hosts import Hosts, can_run  # noqa: E402
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "python", "tests"))
from eventually import eventually  # noqa: E402
from test_multihost import (HEARTBEAT_MS, LEASE_MS, WORKERS, PosixStore, S3Store,  # noqa: E402
                            Cluster, bin_path, holds_write, pending_saves)
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "tools", "etcd"))
from etcd import Etcd  # noqa: E402
import tessera  # noqa: E402

WHY_NOT = can_run()
pytestmark = pytest.mark.skipif(WHY_NOT is not None, reason="multi-host tests: %s" % WHY_NOT)
HA_LEASE_S = 2
SERVER_HOSTS = (0, WORKERS + 1)  # the tesserads' hosts


class HaCluster(Cluster):
    """Cluster with a tesserad on each of SERVER_HOSTS, over one etcd."""

    def __init__(self, hosts, store, etcd):
        self.etcd = etcd
        self.procs = {}
        self.urls = {h: "http://%s:7070" % hosts.addr(h) for h in SERVER_HOSTS}
        super().__init__(hosts, store)
        self.client.close()
        self.client = tessera.Client(",".join(self.urls.values()), self.token, timeout=60,
                                     failover_timeout=60)

    def start_server(self, log="tesserad.log"):
        # The first host leads: the other one starts once it does.
        self.server = self.start_tesserad(SERVER_HOSTS[0])
        self.wait_leader(exclude=None)
        self.start_tesserad(SERVER_HOSTS[1])

    def start_tesserad(self, h, log=None):
        self.procs[h] = self.hosts.start(h, [
            bin_path("tesserad"), "--listen", "%s:7070" % self.hosts.addr(h),
            "--data-dir", "/tmp/tesserad", "--checkpoint-root", self.root,
            "--heartbeat-ms", str(HEARTBEAT_MS), "--lease-ms", str(LEASE_MS),
            "--ha", self.etcd.url, "--ha-lease-s", str(HA_LEASE_S)] + self.store.server_args,
            log or "tesserad-%d.log" % h, env=self.secret_env())
        return self.procs[h]

    def start_worker(self, i, env=None, log=None):
        url, self.url = self.url, ",".join(self.urls.values())  # every worker knows both
        try:
            return super().start_worker(i, env, log)
        finally:
            self.url = url

    def role(self, h):
        try:
            with tessera.Client(self.urls[h], self.token, timeout=2) as c:
                return c.health().get("role")
        except tessera.TesseraError:
            return None

    def wait_leader(self, exclude):
        """The host whose tesserad leads, once one other than `exclude` does."""
        return eventually(lambda: [h for h in SERVER_HOSTS
                                   if h != exclude and self.role(h) == "leader"],
                          "no tesserad other than host %s leads" % exclude)[0]

    def leader(self):
        return self.wait_leader(exclude=None)


@pytest.fixture(scope="module", params=["bind", "s3"])
def ha(request):
    why = can_run(request.param)
    if why:
        pytest.skip("multi-host takeover tests with the root shared by %s: %s" % (request.param, why))
    with Hosts(WORKERS + 2, share="bind") as hosts:
        store = S3Store(hosts) if request.param == "s3" else PosixStore(hosts)
        etcd = Etcd(addr=hosts.net + ".1")
        try:
            c = HaCluster(hosts, store, etcd)
            yield c
            c.client.close()
        finally:
            etcd.stop()
            store.close()


def slow_writer(c, mesh, host, delay_ms):
    """Registers `mesh`, commits step 1, and restarts the worker of `host` so that it
    sleeps `delay_ms` before writing a shard."""
    c.register(mesh, {"data": WORKERS})
    out = c.trainers(mesh, "save", 1, "--wait")
    assert all(r.get("committed") for r in out.values()), out
    c.workers[host].stop()
    c.start_worker(host, env=dict(os.environ, TESSERA_FAULT_TASK_DELAY="write:%d" % delay_ms),
                   log="worker-%d-%s.log" % (host, mesh))
    c.wait_alive(host)


def wait_writing(c, mesh, host):
    """Until a save of `mesh` is writing, and `host`'s worker holds its write (it has not
    joined) while another one has joined."""
    eventually(lambda: any(holds_write(c, j, host) for j in c.client.jobs(mesh=mesh))
               and pending_saves(c, host) > 0,
               lambda: c.client.jobs(mesh=mesh))


# How long a deposed or cut-off leader may take to stop: its store requests in flight
# give up within their retry budget (30 s each), two of them one after the other at most.
STOP_S = 120


def mid_save(c, mesh, host):
    """Step 1 of `mesh` committed, then every trainer's save of step 2 started, with
    `host`'s worker holding its write for 3 s: (the leader's host, the trainers), once
    the save is writing."""
    slow_writer(c, mesh, host, 3000)
    savers = [c.hosts.popen(i, c.trainer_argv(mesh, i, "save", 2, "--wait"), env=c.env())
              for i in range(1, WORKERS + 1)]
    wait_writing(c, mesh, host)
    return c.leader(), savers


def expect_taken_over(c, mesh, savers, new_leader):
    # The trainers' save of step 2 ended, never half-committed: the workers had written
    # their shards at their snapshots, so those whose job was lost with the old leader
    # join again, and the save commits under the new leader; or it failed for every
    # trainer (retryable).
    outs = []
    for s in savers:
        out, err = s.communicate(timeout=180)
        outs.append(out)
    assert c.leader() == new_leader
    committed = ['"committed": true' in out for out in outs]
    states = {ck["step"]: ck["state"] for ck in c.client.checkpoints(mesh)}
    want = [1, 2] if all(committed) else [1]
    assert all(committed) or not any(committed), outs
    assert sorted(st for st, state in states.items() if state == "committed") == want, states
    for i in range(1, WORKERS + 1):
        c.wait_alive(i, timeout=60)
    # A save of step 2 the new leader may still wait on (some trainers gave up before
    # their workers joined it again) is cancelled; then nothing of it may stay.
    for j in c.client.jobs(mesh=mesh, kind="save"):
        if j.get("step") == 2 and j.get("state") in ("queued", "running"):
            try:
                c.client.cancel_job(j["id"])
            except tessera.TesseraError:
                pass  # it ended meanwhile
            ended = c.client.job(j["id"], wait_ms=60000)
            assert ended["state"] in ("cancelled", "failed", "succeeded"), ended
    c.client.collect_garbage()
    assert c.store.steps(mesh) == want
    assert c.store.leftovers(mesh) == []
    checked = c.trainers(mesh, "check", 1)
    assert all(r.get("equal") for r in checked.values()), checked
    out = c.trainers(mesh, "save", 3, "--wait")
    assert all(r.get("committed") for r in out.values()), out
    assert c.store.steps(mesh) == want + [3]


def restart_as_standby(c, h):
    c.start_tesserad(h, log="tesserad-%d-again.log" % h)
    eventually(lambda: c.role(h) == "standby", lambda: c.procs[h].text()[-2000:])


def test_a_standby_names_the_leader_and_refuses_writes(ha):
    c = ha
    leader = c.leader()
    standby = [h for h in SERVER_HOSTS if h != leader][0]
    with tessera.Client(c.urls[standby], c.token, timeout=5, failover_timeout=0.5) as direct:
        health = direct.health()
        assert health["role"] == "standby" and health["leader"] == c.urls[leader], health
    # A client that knows only the standby is sent to the leader.
    with tessera.Client(c.urls[standby], c.token, timeout=10) as follows:
        follows.meshes()
        assert follows.server == c.urls[leader]


def test_a_second_tesserad_without_ha_is_refused_naming_the_holder(ha):
    c = ha
    leader = c.leader()
    standby = [h for h in SERVER_HOSTS if h != leader][0]
    r = subprocess.run(c.hosts.command(standby, [
        bin_path("tesserad"), "--listen", "%s:7075" % c.hosts.addr(standby),
        "--data-dir", "/tmp/intruder", "--checkpoint-root", c.root] + c.store.server_args),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=60,
        env=c.secret_env())
    assert r.returncode == 1, r.stderr
    assert "is held by the tesserad at %s" % c.urls[leader] in r.stderr, r.stderr


def test_a_standby_that_takes_over_learns_the_memory_checkpoints(ha):
    # Memory checkpoints live in the workers' RAM, and the leader knows them only from
    # rank 0's reports: the new leader's catalog is empty, so rank 0 reports again.
    c = ha
    mesh = "hm"
    c.register(mesh, {"data": WORKERS})

    def msave(step):
        out = c.trainers(mesh, "msave", step, "{}")
        assert all(r.get("committed") for r in out.values()), out

    def listed():
        return {ck["step"]: ck.get("tiers") for ck in c.client.checkpoints(mesh)}
    msave(1)
    eventually(lambda: listed() == {1: ["memory"]}, lambda: "the leader lists %s" % listed())
    old = c.leader()
    c.procs[old].kill()
    c.wait_leader(exclude=old)
    eventually(lambda: listed() == {1: ["memory"]}, lambda: "the new leader lists %s" % listed())
    msave(2)
    eventually(lambda: listed() == {1: ["memory"], 2: ["memory"]},
               lambda: "the new leader lists %s" % listed())
    restart_as_standby(c, old)


def test_leader_killed_mid_save(ha):
    c = ha
    old, savers = mid_save(c, "hk", 2)
    c.procs[old].kill()
    new = c.wait_leader(exclude=old)
    expect_taken_over(c, "hk", savers, new)
    restart_as_standby(c, old)


def test_leader_paused_mid_save_then_resumed(ha):
    c = ha
    old, savers = mid_save(c, "hp", 3)
    c.procs[old].kill(signal.SIGSTOP)
    new = c.wait_leader(exclude=old)
    # Resumed after the takeover, it commits, deletes and collects nothing: it stops.
    before = len(c.procs[old].text())
    c.procs[old].kill(signal.SIGCONT)
    assert c.procs[old].popen.wait(STOP_S) == 3, c.procs[old].text()[-3000:]
    resumed = c.procs[old].text()[before:]
    assert "garbage collected" not in resumed, resumed
    expect_taken_over(c, "hp", savers, new)
    restart_as_standby(c, old)


def test_leader_cut_off_mid_save(ha):
    c = ha
    old, savers = mid_save(c, "hc", 4)
    c.hosts.link_down(old)
    try:
        new = c.wait_leader(exclude=old)
        # Cut off from etcd for a whole lease, it stops on its own, once the requests to its
        # store that it has in flight (the failed save's cleanup, a fence check) have given
        # up: each within the S3 client's 30 s budget (TESSERA_S3_RETRY_MS).
        assert c.procs[old].popen.wait(STOP_S) == 3, c.procs[old].text()[-3000:]
    finally:
        c.hosts.link_up(old)
    assert re.search(r"etcd|deposed", c.procs[old].text()), c.procs[old].text()[-2000:]
    expect_taken_over(c, "hc", savers, new)
    restart_as_standby(c, old)
