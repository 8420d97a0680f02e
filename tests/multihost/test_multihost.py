"""Tessera across hosts: tesserad on host 0, a worker on each of hosts 1-4, each
trainer inside its worker's host. Hosts are network + mount namespaces (hosts.py);
they share only the network and the checkpoint store: one directory (bind), one
exported over SSH (sshfs), or an S3 bucket on a Ceph RGW outside the hosts (s3).
Needs root."""

import contextlib
import json
import os
import re
import signal
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(__file__))
from hosts import Hosts, can_run  # noqa: E402
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "tools", "s3"))
from rgw import Rgw  # noqa: E402
import tessera  # noqa: E402  (hosts.py puts python/ on the path)
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "python", "tests"))
from eventually import eventually  # noqa: E402
from safetensors_files import read_safetensors  # noqa: E402

WHY_NOT = can_run()
pytestmark = pytest.mark.skipif(WHY_NOT is not None, reason="multi-host tests: %s" % WHY_NOT)
SHARES = ["bind", "sshfs", "s3"]  # how the hosts share the checkpoint store

HERE = os.path.dirname(os.path.abspath(__file__))
PYTHON = os.path.join(HERE, "..", "..", "python")
WORKERS = 4
HEARTBEAT_MS, LEASE_MS = 200, 2000
LOCAL = "http://127.0.0.1:7071"  # every worker's local API, on its own host


def bin_path(name):
    d = os.environ.get("TESSERA_BIN") or os.path.join(HERE, "..", "..", "build", "bin")
    return os.path.join(os.path.abspath(d), name)


class PosixStore:
    """The checkpoint root as a directory every host sees (bind or sshfs)."""

    def __init__(self, hosts):
        self.root = os.path.join(hosts.shared, "checkpoints")  # as every host sees it
        self.here = os.path.join(hosts.shared_here, "checkpoints")  # as this test sees it
        self.server_args = []

    def names(self, mesh):
        d = os.path.join(self.here, mesh)
        return sorted(os.listdir(d)) if os.path.isdir(d) else []

    def steps(self, mesh):
        return sorted(int(n[5:]) for n in self.names(mesh) if n.startswith("step-"))

    def leftovers(self, mesh):
        return [n for n in self.names(mesh) if n.startswith((".staging", ".deleting"))]

    def close(self):
        pass


class S3Store:
    """The checkpoint root in a bucket of a Ceph RGW (tools/s3/rgw.sh) listening on the
    hosts' bridge, outside every host. Only tesserad is told the endpoint; workers
    learn it from tesserad, and get credentials from their environment."""

    BUCKET = "tessera-multihost"

    def __init__(self, hosts):
        self.rgw = Rgw(self.BUCKET, addr=hosts.net + ".1")
        self.endpoint, self.s3 = self.rgw.endpoint, self.rgw.s3
        self.root = "s3://%s/ckpt" % self.BUCKET
        self.server_args = ["--s3-endpoint", self.endpoint]

    def names(self, mesh):
        prefix = "ckpt/%s/" % mesh
        names = set()
        for page in self.s3.get_paginator("list_objects_v2").paginate(
                Bucket=self.BUCKET, Prefix=prefix, Delimiter="/"):
            names.update(o["Key"][len(prefix):] for o in page.get("Contents", []))
            names.update(p["Prefix"][len(prefix):-1] for p in page.get("CommonPrefixes", []))
        uploads = self.s3.list_multipart_uploads(Bucket=self.BUCKET, Prefix=prefix)
        names.update(u["Key"][len(prefix):].split("/")[0] for u in uploads.get("Uploads", []))
        return sorted(names)

    def steps(self, mesh):
        return sorted(int(n[5:-7]) for n in self.names(mesh)
                      if n.startswith("step-") and n.endswith(".commit"))

    def leftovers(self, mesh):
        """Staging prefixes that no commit manifest names."""
        referenced = set()
        for step in self.steps(mesh):
            body = self.s3.get_object(Bucket=self.BUCKET, Key="ckpt/%s/step-%d.commit" % (mesh, step))
            referenced.add(json.loads(body["Body"].read())["dir"])
        return [n for n in self.names(mesh) if n.startswith(".staging") and n not in referenced]

    def close(self):
        self.rgw.stop()


class Cluster:
    def __init__(self, hosts, store):
        self.hosts = hosts
        self.store = store
        self.token = "multihost-%d" % os.getpid()
        self.root = store.root
        self.url = "http://%s:7070" % hosts.addr(0)
        self.server = None
        self.workers = {}
        self.ids = {}
        self.start_server()
        for i in range(1, WORKERS + 1):
            self.start_worker(i)
        self.client = tessera.Client(self.url, self.token, timeout=60)

    def start_server(self, log="tesserad.log"):
        """(Re)starts tesserad; each start logs to a new file (it is ready once that says so)."""
        self.server = self.hosts.start(0, [
            bin_path("tesserad"), "--listen", "%s:7070" % self.hosts.addr(0),
            "--data-dir", "/tmp/tesserad", "--checkpoint-root", self.root,
            "--heartbeat-ms", str(HEARTBEAT_MS), "--lease-ms", str(LEASE_MS)] +
            self.store.server_args, log, env=self.secret_env())

    def start_worker(self, i, env=None, log=None, name=None):
        """(Re)starts the worker of host i under its name h<i>, or `name` (a replacement
        under another name); tessera-worker-faults when `env` sets a TESSERA_FAULT_* hook."""
        p = self.hosts.start(i, [
            bin_path(tessera.local.program("tessera-worker", env)), "--server", self.url,
            "--name", name or "h%d" % i, "--local-listen", "127.0.0.1:7071",
            "--data-listen", "%s:7072" % self.hosts.addr(i), "--copy-threads", "1",
            "--io-threads", "1"],
            log or "worker-%d.log" % i, env=self.secret_env(env))
        self.ids[i] = p.wait_for(tessera.local._REGISTERED, 20.0)
        self.workers[i] = p
        return p

    def secret_env(self, extra=None):
        """The environment of a tesserad or worker: the token goes there, which only
        this user can read in /proc, not on the command line."""
        env = dict(extra if extra is not None else os.environ)
        env["TESSERA_TOKEN"] = self.token
        return env

    def env(self):
        env = dict(os.environ)
        env.update(PYTHONPATH=os.path.abspath(PYTHON), TESSERA_WORKER=LOCAL)
        return env

    def trainer_argv(self, mesh, i, *args):
        return [sys.executable, os.path.join(HERE, "trainer.py"), mesh, str(i - 1)] + \
            [str(a) for a in args]

    def trainers(self, mesh, *args, hosts=None):
        """The trainer of every worker host (or of `hosts`) at once; their JSON answers."""
        hosts = hosts or list(range(1, WORKERS + 1))
        procs = {i: self.hosts.popen(i, self.trainer_argv(mesh, i, *args), env=self.env())
                 for i in hosts}
        out = {}
        for i, p in procs.items():
            stdout, stderr = p.communicate(timeout=120)
            assert p.returncode == 0, "trainer on host %d: %s %s" % (i, stdout, stderr[-3000:])
            out[i] = json.loads(stdout.strip().splitlines()[-1])
        return out

    def register(self, name, axes):
        self.client.register_mesh(name, axes, workers=[self.ids[i] for i in range(1, WORKERS + 1)])

    def wait_alive(self, i, timeout=30):
        eventually(lambda: self.client.worker(self.ids[i])["state"] == "alive",
                   "worker %s did not come back alive" % self.ids[i], timeout)


@contextlib.contextmanager
def cluster_on(root):
    """A Cluster whose checkpoint root is shared by `root` (one of SHARES)."""
    why = can_run(root)
    if why:
        pytest.skip("multi-host tests with the root shared by %s: %s" % (root, why))
    share = "bind" if root == "s3" else root
    with Hosts(WORKERS + 1, share=share) as hosts:
        store = S3Store(hosts) if root == "s3" else PosixStore(hosts)
        try:
            c = Cluster(hosts, store)
            yield c
            c.client.close()
        finally:
            store.close()


@pytest.fixture(scope="module", params=SHARES)
def cluster(request):
    with cluster_on(request.param) as c:
        yield c


def test_workers_advertise_what_their_peers_can_reach(cluster):
    for i in range(1, WORKERS + 1):
        w = cluster.client.worker(cluster.ids[i])
        assert w["host"] == cluster.hosts.addr(i)
        assert w["data_port"] == 7072
        # The local API listens on the worker host's loopback, and says so.
        assert w["local_api"] == LOCAL


def test_hosts_share_nothing_but_the_network_and_the_root(cluster):
    marker = "/dev/shm/tessera-mh-marker"
    cluster.hosts.run(1, ["sh", "-c", "echo 1 > " + marker])
    assert cluster.hosts.run(1, ["cat", marker]).strip() == "1"
    assert cluster.hosts.run(2, ["sh", "-c", "test -e %s && echo yes || echo no" % marker]).strip() == "no"
    assert not os.path.exists(marker)
    # The checkpoint root: over sshfs, every worker host reaches it through the network.
    for i in range(1, WORKERS + 1):
        mounts = cluster.hosts.run(i, ["cat", "/proc/mounts"])
        kind = next((line.split()[2] for line in mounts.splitlines()
                     if line.split()[1] == cluster.hosts.shared), None)
        assert kind == ("fuse.sshfs" if cluster.hosts.share == "sshfs" else None), (i, kind)
    # A worker's local API is on its host's loopback: host 0 (tesserad's, no worker) has
    # its own loopback, where nothing answers.
    out = cluster.hosts.run(0, [sys.executable, "-c",
                                "import urllib.request as u\n"
                                "try: u.urlopen('%s/healthz', timeout=2); print('reached')\n"
                                "except Exception: print('refused')" % LOCAL])
    assert out.strip() == "refused"


def test_save_restore_verify_reshard_and_retention(cluster):
    c = cluster
    c.register("train", {"data": WORKERS})
    # Trainers save step 1 together: one job, committed.
    saved = c.trainers("train", "save", 1, "--wait")
    assert all(r.get("committed") for r in saved.values()), saved
    assert len({r["job"] for r in saved.values()}) == 1
    saved = c.trainers("train", "save", 2, "--wait")
    assert all(r.get("committed") for r in saved.values()), saved
    assert sorted(ck["step"] for ck in c.client.checkpoints("train")) == [1, 2]
    # Each trainer restores step 1 into its own tensors, on its own host.
    checked = c.trainers("train", "check", 1)
    assert all(r.get("equal") and r["restored"] == 1 for r in checked.values()), checked
    job = c.client.verify("train", 2)
    assert job.wait(60)["state"] == "succeeded"
    # Restore onto another mesh of the same hosts: {x:2, y:2}, "w" unsharded there.
    c.register("grid", {"x": 2, "y": 2})
    c.client.restore("train", 2, target_mesh="grid").wait(60)
    want = np.concatenate([np.arange(256 * 64, dtype=np.float32).reshape(256, 64) + 2 * 1000 + r * 1e6
                           for r in range(WORKERS)])
    for i in range(1, WORKERS + 1):
        out = c.hosts.run(i, [sys.executable, "-c",
                              "import tessera, numpy as np, sys\n"
                              "m = tessera.CheckpointManager('grid')\n"
                              "w = m.attach('w', (1024, 64), 'float32', None)\n"
                              "sys.stdout.write(w.tobytes().hex())\n"], env=c.env())
        got = np.frombuffer(bytes.fromhex(out.strip()), dtype=np.float32).reshape(1024, 64)
        assert np.array_equal(got, want), "host %d holds another resharded 'w'" % i
    # Retention across hosts: keep the last 2.
    c.client.set_retention("train", keep_last=2)
    saved = c.trainers("train", "save", 3, "--wait")
    assert all(r.get("committed") for r in saved.values()), saved
    # The trainers hear of the commit before its retention, which then follows.
    eventually(lambda: sorted(ck["step"] for ck in c.client.checkpoints("train")) == [2, 3],
               what="retention after step 3 keeps the last 2")
    assert c.store.steps("train") == [2, 3]
    assert c.store.leftovers("train") == []


def test_safetensors_export_and_import_across_hosts(cluster):
    """An export job's files are written by the workers on their hosts into a folder all
    hosts share; an import job of that folder makes a checkpoint of another mesh (in the
    root: the shared dir or the bucket) that the trainers restore on their hosts."""
    c = cluster
    c.register("hf", {"data": WORKERS})
    saved = c.trainers("hf", "save", 5, "--wait")
    assert all(r.get("committed") for r in saved.values()), saved
    out, here = (os.path.join(d, "hf-export") for d in (c.hosts.shared, c.hosts.shared_here))
    job = c.client.export("hf", 5, out).wait(120)
    files = sorted(job["result"]["files"])
    assert len(files) == 2, job  # "w" and "b", one file each, on two workers
    assert sorted(os.listdir(here)) == sorted(files + ["model.safetensors.index.json"])
    got = {}
    for f in files:
        got.update(read_safetensors(os.path.join(here, f))[0])
    want = np.concatenate([np.arange(256 * 64, dtype=np.float32).reshape(256, 64) + 5 * 1000 + r * 1e6
                           for r in range(WORKERS)])
    assert np.array_equal(got["w"][1], want) and (got["b"][1] == 5).all()
    c.register("hf2", {"data": WORKERS})
    assert c.client.import_safetensors("hf2", out, 5).wait(120)["state"] == "succeeded"
    assert c.store.steps("hf2") == [5]
    checked = c.trainers("hf2", "check", 5)
    assert all(r.get("equal") and r["restored"] == 5 for r in checked.values()), checked


def test_all_reduce_across_hosts(cluster):
    cluster.register("coll", {"data": WORKERS})
    out = cluster.trainers("coll", "all_reduce")
    assert [out[i]["sum"] for i in sorted(out)] == [10.0] * WORKERS, out


def test_link_down_fails_the_save_naming_the_worker_then_it_rejoins(cluster):
    c = cluster
    c.register("lnk", {"data": WORKERS})
    c.hosts.link_down(2)
    try:
        # Host 2's trainer still reaches its own worker; that worker cannot reach tesserad.
        out = c.trainers("lnk", "save", 10, "--wait", hosts=[1, 3, 4])
        errors = [r for r in out.values() if "error" in r]
        assert errors, out
        detail = json.dumps(errors)
        assert c.ids[2] in detail, detail
        # Failed by the lease ("is dead"), not by the 120 s join wait (deadline_exceeded);
        # how long that takes is bench/worker_loss.py's.
        assert all(r["error"] == "unavailable" and "is dead" in r["message"] for r in errors), errors
        assert c.client.worker(c.ids[2])["state"] in ("dead", "suspect")
    finally:
        c.hosts.link_up(2)
    c.wait_alive(2)
    out = c.trainers("lnk", "save", 11, "--wait")
    assert all(r.get("committed") for r in out.values()), out
    states = {ck["step"]: ck["state"] for ck in c.client.checkpoints("lnk")}
    assert states == {10: "failed", 11: "committed"}, states


def committed_then_slow_writer(c, mesh, host, delay_ms):
    """Registers `mesh`, commits step 1, then restarts the worker of `host` (same name)
    so that it sleeps `delay_ms` before writing a shard. Its new process."""
    c.register(mesh, {"data": WORKERS})
    out = c.trainers(mesh, "save", 1, "--wait")
    assert all(r.get("committed") for r in out.values()), out
    c.workers[host].stop()
    before = c.ids[host]
    p = c.start_worker(host, env=dict(os.environ, TESSERA_FAULT_TASK_DELAY="write:%d" % delay_ms),
                       log="worker-%d-delayed.log" % host)
    assert c.ids[host] == before
    c.wait_alive(host)
    return p


def wait_late_write(c, worker, mesh, step):
    """Waits until `worker` (a delayed writer) says its write of the save of `step` has
    run, so the checks after it see what the late write left."""
    worker.wait_for(re.compile(r"fault injection: the write task of job \S+ \(mesh %s step %d\), "
                               r"delayed \d+ ms, ended: (.*)" % (re.escape(mesh), step)), 60)


def pending_saves(c, host):
    """How many of its trainer's saves `host`'s worker has snapshotted and not yet joined
    (its /healthz)."""
    out = c.hosts.run(host, [sys.executable, "-c",
                             "import json, urllib.request\n"
                             "h = json.load(urllib.request.urlopen('%s/healthz', timeout=10))\n"
                             "print(h['pending_saves']['count'])\n" % LOCAL])
    return int(out.strip())


def holds_write(c, job, host):
    """Whether `job` is a save writing, joined by some worker but not yet by `host`'s."""
    workers = job.get("workers", [])
    return (job.get("phase") == "write" and job.get("state") == "running"
            and any(w.get("id") == c.ids[host] and w.get("state") == "waiting" for w in workers)
            and any(w.get("state") == "joined" for w in workers))


def wait_for_write_phase(c, mesh, host):
    """Waits until a save of `mesh` is writing, another worker has joined it, and `host`'s
    worker has taken its snapshot but not joined: it holds its write (the delay)."""
    eventually(lambda: any(holds_write(c, j, host) for j in c.client.jobs(mesh=mesh))
               and pending_saves(c, host) > 0,
               lambda: [(j["id"], j["state"], j.get("phase"), j.get("workers"))
                        for j in c.client.jobs(mesh=mesh)])


def test_worker_frozen_mid_write_never_reaches_a_checkpoint(cluster):
    c = cluster
    # Host 3's worker sleeps 1.5 s before writing a shard.
    p = committed_then_slow_writer(c, "frz", 3, 1500)
    savers = {i: c.hosts.popen(i, c.trainer_argv("frz", i, "save", 2, "--wait"), env=c.env())
              for i in range(1, WORKERS + 1)}
    # Freeze it while its write task sleeps: tesserad stops hearing from it.
    wait_for_write_phase(c, "frz", 3)
    os.kill(p.pid, signal.SIGSTOP)
    try:
        answers = {i: json.loads(s.communicate(timeout=60)[0].strip().splitlines()[-1])
                   for i, s in savers.items() if i != 3}
        failed = [r for r in answers.values() if "error" in r]
        assert failed and c.ids[3] in json.dumps(failed), answers
    finally:
        os.kill(p.pid, signal.SIGCONT)
    savers[3].communicate(timeout=60)
    # Its late write runs now, after the job failed: wait until it has.
    wait_late_write(c, p, "frz", 2)
    states = {ck["step"]: ck["state"] for ck in c.client.checkpoints("frz")}
    assert states == {1: "committed", 2: "failed"}, states
    c.client.collect_garbage()
    assert c.store.leftovers("frz") == []
    assert c.store.steps("frz") == [1]
    checked = c.trainers("frz", "check", 1)
    assert all(r.get("equal") for r in checked.values()), checked
    # The worker carries on: the next save commits.
    out = c.trainers("frz", "save", 3, "--wait")
    assert all(r.get("committed") for r in out.values()), out


def test_tesserad_killed_mid_save_and_restarted(cluster):
    c = cluster
    # Host 2's worker holds the save in its write phase for 3 s.
    committed_then_slow_writer(c, "rst", 2, 3000)
    savers = [c.hosts.popen(i, c.trainer_argv("rst", i, "save", 2), env=c.env())
              for i in range(1, WORKERS + 1)]
    wait_for_write_phase(c, "rst", 2)
    c.server.kill()
    # A trainer whose create-or-join was answered after the job began writing may have
    # lost that answer with tesserad: it then waits out its own 60 s for the job id.
    for s in savers:
        s.communicate(timeout=120)
    c.start_server(log="tesserad-restarted.log")
    # The interrupted save failed; nothing of it is left; the workers kept their ids.
    for i in range(1, WORKERS + 1):
        c.wait_alive(i)
    states = {ck["step"]: ck["state"] for ck in c.client.checkpoints("rst")}
    assert states.get(1) == "committed" and states.get(2) in (None, "failed"), states
    jobs = [j for j in c.client.jobs(mesh="rst") if j.get("kind") == "save"]
    assert all(j["state"] in ("succeeded", "failed") for j in jobs), jobs
    wait_late_write(c, c.workers[2], "rst", 2)  # host 2's delayed write, after the restart
    c.client.collect_garbage()
    assert c.store.leftovers("rst") == []
    assert c.store.steps("rst") == [1]
    checked = c.trainers("rst", "check", 1)
    assert all(r.get("equal") for r in checked.values()), checked
    c.workers[2].stop()
    c.start_worker(2)
    c.wait_alive(2)
    out = c.trainers("rst", "save", 3, "--wait")
    assert all(r.get("committed") for r in out.values()), out
